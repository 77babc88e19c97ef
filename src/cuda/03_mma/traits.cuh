// Tile sizes of cuda_mma, one configuration per specialised head dim. Every choice below
// stays within 99 KB of shared memory per CTA (the opt-in limit of sm_86/sm_89, e.g. the
// write-up's RTX 4050), which also lets two CTAs share an sm_80/sm_90 multiprocessor.
// MmaConfig<kHeadDim, kBlockM, kBlockN, kNWarps, kStages, kQInRegs, kMinBlocks>.
#pragma once

#include "attn/features.hpp"
#include "cuda/03_mma/kernel.cuh"

namespace flashtile::detail::mma {

// The head dims that have their own kernel; any other head dim (1..256) runs on the next
// one up, zero-padded inside the kernel.
inline constexpr int kSpecialisedHeadDims[] = {64, 96, 128, 256};

template <int kHeadDim>
struct MmaTraits;

// Measurement behind each choice: bench/mma_variants.cu on the H200 (bf16, 16k tokens,
// hidden 2048, seqlen 1k/4k/16k, causal and not; 2026-12-01, second device run, after the
// per-tile instruction trims). TFLOP/s at seqlen 16k, non-causal / causal:
//  d=64 : M128 N128 4 warps, Q re-read from smem (FA2's sm80 shape)   293 / 280  <- chosen
//         M64  N128 4 warps, Q in registers, 3 CTAs/SM                 276 / 268
//         M128 N128 8 warps (16 rows each), capped at 128 registers    274 / 265
//         M128 N64  4 warps, Q in registers (first default)            264 / 254
//         M128 N128 8 warps, one CTA/SM                                 235 / 238
//  d=128: M128 N64  4 warps, Q re-read from smem (FA2's sm80 shape)   346 / 322  <- chosen
//         M128 N128 8 warps, Q in registers, one CTA/SM                 293 / 299
//         M128 N32  4 warps                                             287 / 263
//         M128 N64  8 warps, Q in registers                             262 / 264
//  d=256: M64  N32  4 warps, Q re-read from smem                       242 / 245  <- chosen
//         M128 N32  8 warps                                             237 / 240
//         M64  N64  4 warps, one CTA/SM (160 KB)                        204 / 208
//  d=96 : not measured separately; the d=128 shape (its smem rows are padded to 128).
// Pattern: 32 rows per warp (two m-tiles sharing every K/V fragment) and two CTAs per SM
// beat 16 rows per warp at any occupancy: ldmatrix traffic per mma halves.
// The softcap kernel at d=128 (and d=96, the same shape): of each tile's 8 n-tiles, this
// many would take their exp2 on the FMA pipe (kernel.cuh, MmaConfig). H200,
// bench/mma_variants.cu, softcap 50, causal, 16k, ms for 0..4 of 8 (2026-12-01):
//   this tile loop (bench/results/mma_perf_v2_log.txt, plain causal 3.415):
//     3.803 3.865 3.943 4.262 4.230
//   an earlier loop with per-warp 16-key steps (mma_perf_v1_log.txt, plain causal 3.435):
//     3.802 3.721 3.792 3.865 4.018
// One n-tile in eight won 2.1% in one schedule and lost 1.6% in the other: not a robust
// lever at one MUFU.TANH + one MUFU.EX2 per score, so every exp2 stays on the MUFU.
inline constexpr int kSoftcapFmaExp2TilesD128 = 0;
template <>
struct MmaTraits<64> : MmaConfig<64, 128, 128, 4, 2, false, 2> {};
template <>
struct MmaTraits<96> : MmaConfig<96, 128, 64, 4, 2, false, 2, kSoftcapFmaExp2TilesD128> {};
template <>
struct MmaTraits<128> : MmaConfig<128, 128, 64, 4, 2, false, 2, kSoftcapFmaExp2TilesD128> {};
template <>
struct MmaTraits<256> : MmaConfig<256, 64, 32, 4, 2, false, 2> {};

// Calls with a sliding window (left side bounded) and plain logits take a schedule of their
// own (kernel.cuh BlockSchedule, docs/JOURNEY.md 3g): their blocks are short and of one
// length, so the order of the last wave shows. Measured on the H200 (bench/mma_variants.cu
// --window-only, 16k, d=128, bf16, window (1024, 0); bench/results/window_h200/), ms:
//   grid (main's kernel)                 0.5285
//   block-major order only               0.5182  <- chosen (-2.0%)
//   block-major + L2 prefetch, 2/4/8     0.5455 / 0.5418 / 0.5456
//   grid + L2 prefetch 4                 0.5528
// The L2 prefetches cost more issue than the traffic they were to hide (JOURNEY 3g), so the
// library takes the order alone (the prefetch was removed; branch feat/window has it).
// JOURNEY 3h (seventh session) then walked this order persistently (one resident set of CTAs,
// the next block's Q and first K/V tile loaded under the current epilogue): same call,
// ms at windows 512 / 1024 / 2048 / 4096: 0.3245 / 0.5156 / 0.8902 / 1.5028 for this order,
// 0.3452 / 0.5496 / 0.9292 / 1.6203 persistent (+4..8%): removed; branch feat/window3 has it.
using WindowSchedule = BlockSchedule<true>;

// Where the window schedule applies: the M128 N64 shape it was measured on (d=128; d=96 runs
// the same shape). d=64 (M128 N128) and d=256 (M64 N32) keep GridSchedule until measured.
template <int kHeadDim>
inline constexpr bool kWindowScheduleFits = kHeadDim == 96 || kHeadDim == 128;

template <class Cfg>
bool takes_window_schedule(const AttentionParams& p) {
  return p.window_left >= 0 && block_major_grid_fits<Cfg>(p);
}

// The smallest specialised head dim that holds head_dim (0 when none does).
constexpr int specialised_head_dim(int64_t head_dim) {
  for (int d : kSpecialisedHeadDims)
    if (head_dim <= d) return d;
  return 0;
}

// One head dim's kernels, instantiated per head dim in hdim<D>.cu. The aligned path has one
// kernel per LogitsFlags (attn/features.hpp) and the plain one again on WindowSchedule; the
// narrow path (tile_io.cuh) a plain one and one that reads softcap and ALiBi at run time.
// Split calls (parts.splits > 1) take one of two more: the plain aligned kernel split, or
// the narrow run-time-logits one split, which serves every other call (a split call is
// small: its kernel's speed matters less than filling the GPU); JOURNEY 3i.
template <class T, int kHeadDim>
void run_mma_forward(const AttentionParams& p, const SplitPartials& parts, cudaStream_t stream) {
  using Cfg = MmaTraits<kHeadDim>;
  if (parts.splits > 1) {
    if (rows_aligned_16(p) && p.softcap == 0.0f && p.alibi_slopes == nullptr)
      launch_mma_forward<T, Cfg, LogitsFlags<false, false>, true, GridSchedule, true>(p, parts,
                                                                                       stream);
    else
      launch_mma_forward<T, Cfg, RuntimeLogits, false, GridSchedule, true>(p, parts, stream);
    return;
  }
  if (rows_aligned_16(p)) {
    with_logits_flags(p, [&](auto logits) {
      using Logits = decltype(logits);
      if constexpr (Logits::kPlain && kWindowScheduleFits<kHeadDim>) {
        if (takes_window_schedule<Cfg>(p))
          return launch_mma_forward<T, Cfg, Logits, true, WindowSchedule>(p, parts, stream);
      }
      launch_mma_forward<T, Cfg, Logits, true>(p, parts, stream);
    });
  } else if (p.softcap == 0.0f && p.alibi_slopes == nullptr) {
    launch_mma_forward<T, Cfg, LogitsFlags<false, false>, false>(p, parts, stream);
  } else {
    launch_mma_forward<T, Cfg, RuntimeLogits, false>(p, parts, stream);
  }
}

// Instantiated once per head dim in hdim<D>.cu (so the four compile in parallel) and
// nowhere else: the dispatcher only sees these declarations.
#define FLASHTILE_MMA_INSTANTIATIONS(prefix, D)                                            \
  prefix template void run_mma_forward<__half, D>(const AttentionParams&, const SplitPartials&, \
                                                  cudaStream_t);                            \
  prefix template void run_mma_forward<__nv_bfloat16, D>(const AttentionParams&,            \
                                                         const SplitPartials&, cudaStream_t);
FLASHTILE_MMA_INSTANTIATIONS(extern, 64)
FLASHTILE_MMA_INSTANTIATIONS(extern, 96)
FLASHTILE_MMA_INSTANTIATIONS(extern, 128)
FLASHTILE_MMA_INSTANTIATIONS(extern, 256)

}  // namespace flashtile::detail::mma
