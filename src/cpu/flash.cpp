// cpu_flash: tiled online-softmax attention on the CPU, the default backend wherever no
// CUDA device is present.
//
// What changed from cpu_standard: no N×N matrix. Each task takes one block of 192 query
// rows of one (batch, head) and walks the keys in blocks of 64 (48 on 16-register SIMD),
// folding each block of scores through the online softmax, as FlashAttention does on the
// GPU. Q·Kᵀ and P·V are register-blocked SIMD micro-kernels, exp is vectorised, and f16/bf16
// are converted to f32 on load (f32 accumulation, output in the input dtype). Highway picks
// the widest SIMD the CPU has at run time; OpenMP spreads the tasks over the cores.
// The kernels are in flash_kernels-inl.hpp; this file holds the backend entry and threads.
//
// Measured (one thread, AVX-512, B=1 H=8 N=4096 d=64 fp32, on the 2-core dev VM whose
// FMA loop peaks at 240 GFLOP/s): 160-165 GFLOP/s non-causal, 150-155 causal; 1.9-2.0x on
// two threads. The steps that got there are in docs/JOURNEY.md (cpu_flash).
#include <omp.h>

#include <algorithm>
#include <string>

#include "api/backend.hpp"
#include "cpu/flash.hpp"

#if FLASHTILE_WITH_HWY
#include "hwy/aligned_allocator.h"
#endif

namespace flashtile::detail {
namespace {

std::string flash_unavailable() {
#if FLASHTILE_WITH_HWY
  return "";
#else
  return "built without Google Highway (install libhwy-dev and reconfigure)";
#endif
}

std::string flash_unsupported(const AttentionParams& p) {
  if (std::string why = journey_unsupported(p, "cpu_flash"); !why.empty()) return why;
  if (p.head_dim % cpu_flash::kHeadDimMultiple != 0 || p.head_dim > cpu_flash::kMaxHeadDim)
    return "head_dim must be a multiple of " + std::to_string(cpu_flash::kHeadDimMultiple) +
           " up to " + std::to_string(cpu_flash::kMaxHeadDim) + ", got " +
           std::to_string(p.head_dim);
  return "";
}

#if FLASHTILE_WITH_HWY

int64_t query_blocks(const AttentionParams& p, const cpu_flash::Geometry& g) {
  return (p.seqlen_q + g.block_m - 1) / g.block_m;
}

// One scratch per thread that has work; no more threads than tasks.
int thread_count(const AttentionParams& p, const cpu_flash::Geometry& g) {
  const int64_t tasks = p.batch * p.heads_q * query_blocks(p, g);
  return static_cast<int>(std::min<int64_t>(omp_get_max_threads(), tasks));
}

int64_t flash_workspace_bytes(const AttentionParams& p) {
  const cpu_flash::Geometry g = cpu_flash::geometry(p.head_dim);
  return thread_count(p, g) * g.scratch_floats * int64_t(sizeof(float));
}

void run_flash(const AttentionParams& p) {
  const cpu_flash::Geometry g = cpu_flash::geometry(p.head_dim);
  const cpu_flash::QueryBlockFn kernel = cpu_flash::query_block_kernel();
  const int threads = thread_count(p, g);
  auto scratch = hwy::AllocateAligned<float>(static_cast<size_t>(threads * g.scratch_floats));
  if (!scratch) throw Error(ErrorKind::runtime, "cpu_flash: out of memory for its scratch");

  const int64_t heads = p.heads_q, batch_heads = p.batch * heads;
  const int64_t blocks = query_blocks(p, g), tasks = batch_heads * blocks;
#pragma omp parallel num_threads(threads)
  {
    float* mine = scratch.get() + omp_get_thread_num() * g.scratch_floats;
    // Heaviest first: under a causal mask the last query blocks see the most keys, so
    // they are handed out first and the short ones fill the gaps at the end
    // (longest-processing-time order). Each task's arithmetic does not depend on which
    // thread runs it, so the output is bitwise the same for any thread count.
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t bh = t / blocks, qb = blocks - 1 - t % blocks;
      kernel(p, bh / heads, bh % heads, qb, mine);
    }
  }
}

#else

int64_t flash_workspace_bytes(const AttentionParams&) { return 0; }
void run_flash(const AttentionParams&) {
  throw Error(ErrorKind::unsupported, "cpu_flash: " + flash_unavailable());
}

#endif

}  // namespace

BackendEntry make_cpu_flash_backend() {
  // Above cpu_standard (1): `automatic` takes cpu_flash for every CPU call it supports.
  return {Backend::cpu_flash, DeviceType::cpu, /*priority=*/5, flash_unavailable,
          flash_unsupported, flash_workspace_bytes, run_flash};
}

}  // namespace flashtile::detail
