// cpu_flash internals shared by the backend glue (flash.cpp), the SIMD code
// (flash_hwy.cpp, one copy per Highway target) and the tests/benchmarks.
//
// Everything here exists only when the build found Google Highway
// (FLASHTILE_WITH_HWY=1); without it cpu_flash is registered but unavailable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "api/params.hpp"

namespace flashtile::detail::cpu_flash {

// Head dims the backend serves: any up to 256 (the register tiles walk the head dim in
// whole vectors over zero-padded scratch, and the output's tail channels are scalar).
inline constexpr int64_t kMaxHeadDim = 256;

// Block sizes and scratch of the SIMD target this CPU runs (see Tiles in flash_kernels-inl.hpp).
struct Geometry {
  int64_t block_m;         // query rows per task
  int64_t block_n;         // keys per step of the online softmax
  int64_t lanes;           // floats per vector
  int64_t scratch_floats;  // per-thread scratch for this head dim, in floats
  const char* target;      // Highway's name for the target, e.g. "AVX3", "AVX2", "NEON"
};
Geometry geometry(int64_t head_dim);

// One task: query block `qb` of head `h` of sequence (batch entry) `b`, written to out
// (and lse). `scratch` holds geometry(head_dim).scratch_floats floats, 64-byte aligned.
using QueryBlockFn = void (*)(const AttentionParams& p, int64_t b, int64_t h, int64_t qb,
                              float* scratch);
QueryBlockFn query_block_kernel();

// ---- hooks for tests and micro-benchmarks ---------------------------------------------
// Highway targets compiled into this build that this CPU supports, best first.
std::vector<std::string> available_targets();
// Makes every later call use target `name` (one of available_targets()); "" restores the
// best one. Returns false (and changes nothing) for an unknown name. Not thread-safe.
bool force_target(const std::string& name);
// y[i] = the kernels' vectorised exp(x[i]).
void vector_exp(const float* x, float* y, size_t n);
// y[i] = the kernels' vectorised tanh(x[i]) (the softcap's).
void vector_tanh(const float* x, float* y, size_t n);
// The kernels' lane-wise online-softmax step over a block of scores laid out as
// scores[j * rows + r] (key j, query row r; rows a multiple of `lanes`):
// rescales m[r], l[r] (returning alpha[r]) and turns scores into probabilities in place.
void online_softmax_lanes(float* scores, int64_t keys, int64_t rows, float* m, float* l,
                          float* alpha);

}  // namespace flashtile::detail::cpu_flash
