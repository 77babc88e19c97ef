// What cuda_tf32x3's sm_90a translation units (sm90_hdim<D>.cu, step 2c: wgmma) offer the
// backend: one forward entry per head dim served. Built, and declared here as existing, only
// when FLASHTILE_TF32X3_WITH_SM90 (CMAKE_CUDA_ARCHITECTURES names 90a).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "api/params.hpp"

namespace flashtile::detail::tf32x3 {

// The head dims the wgmma path has kernels for (exactly these; others run on mma.sync).
inline constexpr int kSm90HeadDims[] = {64, 128};

// How the d=128 kernel (one set of K/Vᵀ planes, split between two barriers) orders its two
// consumer warpgroups' wgmma, set by FLASHTILE_TF32X3_SM90_SCHEDULE (read per call by
// backend.cu; d=64's overlapped pipeline ignores it):
//   "producer" (default)  pingpong's order, and a third warpgroup that loads and splits K
//                         and V while the consumers compute (mbarriers; step 2c.6)
//   "pingpong"            warpgroup 1 issues S after warpgroup 0 (both meet a named barrier),
//                         so each softmax runs under the other warpgroup's wgmma (step 2c.4)
//   "together"            both issue S at once, so both softmaxes run with the tensor
//                         cores idle (step 2c's first kernel)
// Measured (H200, fp32 field grid, d=128, one call, seventh session's final call;
// docs/JOURNEY.md step 2c.4): pingpong 63.0/66.0/66.8 TFLOP/s full 1k/4k/16k and
// 51.2/60.4/67.3 causal against together's 60.4/62.9/63.5 and 49.6/58.2/63.5, +3-6% at every
// point, outputs bitwise equal; racecheck 0 hazards on each schedule alone. Producer (eighth
// session, step 2c.6, same call as main's pingpong binary): 75.0/78.9/80.2 full and
// 59.2/71.9/79.6 causal against 63.4/66.4/67.3 and 51.4/60.9/67.9, +15-19%, bitwise equal.
enum class Tf32Sm90Schedule { together, pingpong, producer };

// The schedule FLASHTILE_TF32X3_SM90_SCHEDULE's value names (null: unset).
inline Tf32Sm90Schedule tf32x3_sm90_schedule_of(const char* value) {
  if (value == nullptr || *value == '\0' || std::string(value) == "producer")
    return Tf32Sm90Schedule::producer;
  if (std::string(value) == "pingpong") return Tf32Sm90Schedule::pingpong;
  if (std::string(value) == "together") return Tf32Sm90Schedule::together;
  throw Error(ErrorKind::invalid_argument,
              std::string("FLASHTILE_TF32X3_SM90_SCHEDULE must be \"producer\", \"pingpong\" "
                          "or \"together\"; got \"") +
                  value + "\"");
}

struct SplitArgs;  // kernel.cuh: the key splits and, with more than one, their partials

// Runs the wgmma forward for head dim kHeadDim (p validated; fp32, head_dim == kHeadDim,
// rows on 16 bytes: backend.cu checks), on `stream`: finished rows, or with
// split_args.splits > 1 the partials that launch_split_kv_combine then merges.
template <int kHeadDim>
void run_tf32x3_sm90_forward(const AttentionParams& p, const SplitArgs& split_args,
                             Tf32Sm90Schedule schedule, cudaStream_t stream);

extern template void run_tf32x3_sm90_forward<64>(const AttentionParams&, const SplitArgs&,
                                                 Tf32Sm90Schedule, cudaStream_t);
extern template void run_tf32x3_sm90_forward<128>(const AttentionParams&, const SplitArgs&,
                                                  Tf32Sm90Schedule, cudaStream_t);

// The wgmma kernel's tile for head dim kHeadDim (Tf32Sm90Traits), which the split plan of a
// call on this path is worked out from (backend.cu's split_plan): one CTA per SM.
struct Tf32Sm90Tile {
  int block_m, block_n, smem_bytes;
};
template <int kHeadDim>
Tf32Sm90Tile tf32x3_sm90_tile();

extern template Tf32Sm90Tile tf32x3_sm90_tile<64>();
extern template Tf32Sm90Tile tf32x3_sm90_tile<128>();

}  // namespace flashtile::detail::tf32x3
