// The three subcommands of the flashtile CLI; main.cpp wires their flags with CLI11.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "workload.hpp"

namespace flashtile::cli {

struct BenchOptions {
  testing::Shape shape;  // the single case (default: the write-up's), variant included
  VariantValues values;  // standard ALiBi slopes, a fixed sink logit
  std::vector<std::string> backends;  // empty: every available backend but the oracle
  int warmup = 3;
  int repeats = 20;
  int threads = 0;  // CPU threads (OpenMP); 0 = all
  bool json = false;
  std::string output;  // also write results here (.json or .csv)
  bool no_flush = false;
  bool isolated = false;  // --isolated: each timed call starts on an idle GPU
  // --sweep: the field's grid (16k tokens, hidden 2048) instead of the single case.
  bool sweep = false;
  std::vector<int64_t> sweep_seqlens = {512, 1024, 2048, 4096, 8192, 16384};
  std::vector<int64_t> sweep_head_dims = {64, 128, 256};
  std::vector<int> sweep_causal = {0, 1};
  Pass pass = Pass::fwd;  // --pass fwd|bwd|fwdbwd
};
int run_bench(const BenchOptions& options);

struct CheckOptions {
  int shapes = 200;
  uint32_t seed = 2024;
  int64_t max_seqlen = 300;
  std::vector<std::string> backends;  // empty: every available backend
  int threads = 0;
  Pass pass = Pass::fwd;  // --pass fwd or bwd: the forward's outputs or the gradients
};
int run_check(const CheckOptions& options);

struct RunOptions {
  std::string q, k, v, out, lse;
  bool causal = false;
  Window window;
  float softcap = 0.0f;
  std::string alibi, sinks;  // .npy files, float32 (heads) or (batch, heads) / (heads)
  // A packed varlen batch: int32 .npy files; q, k, v are then (total_tokens, heads, head_dim).
  std::string cu_seqlens_q, cu_seqlens_k, seqused_k;
  double scale = 0;  // 0: default 1/sqrt(head_dim)
  bool has_scale = false;
  std::string backend = "auto";
  std::string device = "auto";  // auto | cpu | cuda
};
int run_run(const RunOptions& options);

// `flashtile info`: version, build configuration, backends, SIMD target, devices.
int run_info();

// Parses backend names (comma lists already split); throws flashtile::Error on unknown ones.
std::vector<Backend> parse_backend_list(const std::vector<std::string>& names);

}  // namespace flashtile::cli
