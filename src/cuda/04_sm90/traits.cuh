// Tile sizes of cuda_sm90, one configuration per head dim, and the instantiations
// (one translation unit per head dim, so they compile in parallel).
// Sm90Config<kHeadDim, kBlockN, kWarpgroups, kStages, kMinBlocks>.
#pragma once

#include "cuda/04_sm90/kernel.cuh"
#include "cuda/04_sm90/sm90.hpp"

namespace flashtile::detail::sm90 {

template <int kHeadDim>
struct Sm90Traits;

// The first choice, not yet swept: two consumer warpgroups (128 query rows) share 128-key
// tiles, two stages (plus the producer warpgroup in steps 4.3-4.5). d=128: 32 KB of Q +
// 2·2·32 KB of K/V = 160 KB, one CTA per SM; d=64: 80 KB. A third stage fits at both
// (d=128: 224 KB of the 227 KB); with K and V on their own barriers (step 4.4) two suffice.
//
// dense_pipeline(p): the pipeline a dense full or causal call takes, from the grid measured
// in one H200 call (bf16, seqlen 512-16k; docs/JOURNEY.md, step 4.4 on split barriers):
// the overlapped pipelines (4.4, 4.5) pay where a CTA walks many key tiles and lose on short
// causal calls, whose diagonal blocks walk few (their first S and last P·V run alone).
//
// kPersistentOverlap, kPersistentPingPong: the consumers step 4.6 (Pipeline::tma_persistent,
// which dense_pipeline takes for full calls at d=256 from 4k and at d=128 from 1k to 2k,
// where it measured faster) runs, those of the pipeline measured fastest at 16k for the
// head dim: 4.3 (neither), 4.4 (overlap) or 4.5 (both).
template <>
struct Sm90Traits<64> : Sm90Config<64, 128, 2, 2, 1> {
  // 4.3 410 / 404 TFLOP/s (full / causal, bf16 16k), 4.4 404 / 391, 4.5 407 / 391.
  static constexpr bool kPersistentOverlap = false, kPersistentPingPong = false;
  // kGroupedMaskedGrid: masked calls list the grid's blocks in groups of heads, heaviest
  // first in each (step 4.9, CtaWork::grid_item). At d=64 that measured 1.4-2.4% slower at
  // causal 4k and 8k (4.3, bf16; H200, one call, beside main's binary), so d=64 keeps the
  // plain grid; d=128 and 256 gained (4.9).
  static constexpr bool kGroupedMaskedGrid = false;
  // Step 4.7: three consumer warpgroups (192 query rows) on 128-key tiles, 160 registers
  // each: S 64, O 32 and P 32 per thread. 24 KB of Q + 2·2·16 KB of K/V = 88 KB. At d=64 a
  // tile's exp2 (one per score on the MUFU, 16 a clock per SM) take as long as its two GEMMs
  // at the tensor cores' peak, so the softmax must hide under other warps' GEMMs: a third
  // warp per scheduler gives it one more to hide under (docs/JOURNEY.md, 4.7).
  using BlockM192 = Sm90Config<64, 128, 3, 2, 1>;
  // 4.3 by default: 4.4 and 4.5 measured 1-14% slower at 4k-16k (most at causal 4k), 4.4 up
  // to 33% slower at 512-2k causal. Step 4.7's ping-pong on 192 rows where it measured faster
  // (H200, one call, TFLOP/s, 4.3 -> 4.7 ping-pong): full bf16 4k 385 -> 428, 16k 410 -> 467;
  // full fp16 4k 382 -> 411, 16k 390 -> 451; causal bf16 16k 406 -> 426, but 4k 346 -> 326
  // (a 192-row block near the diagonal walks few tiles). Not measured: full below 4k, causal
  // 8k, causal fp16; those stay on 4.3.
  static Pipeline dense_pipeline(const AttentionParams& p) {
    const bool m192 = p.is_causal() ? p.dtype == DType::bf16 && p.seqlen_k >= 16384
                                    : p.seqlen_k >= 4096;
    return m192 ? Pipeline::tma_ping_pong_m192 : Pipeline::tma_warp_specialized;
  }
  // Windowed calls (bf16, 4k and 16k, two runs; docs/JOURNEY.md, "cuda_sm90: the window's
  // pipeline"): the persistent kernel on 4.3's consumers 7-10% faster than 4.3 at window
  // (1024, 0), level at (4096, 0); the overlapped and 192-row ones 4-30% slower.
  static constexpr Pipeline kWindowPipeline = Pipeline::tma_persistent;
};
template <>
struct Sm90Traits<128> : Sm90Config<128, 128, 2, 2, 1> {
  // 4.5 590 / 565, 4.4 556 / 543, 4.3 544 / 534.
  static constexpr bool kPersistentOverlap = true, kPersistentPingPong = true;
  // Step 4.9's grouped grid: causal 4k +2.7/+3.3% (4.3, two runs), 8k +1.8% (4.5).
  static constexpr bool kGroupedMaskedGrid = true;
  // Full: 4.5 from 4k (+6-9% over 4.3); 4.6 (persistent, 4.5's consumers) at 1k-2k, where
  // it measured 9-10% faster than 4.4 and 2-7% faster than 4.5 (with 4.12a's rescale skip;
  // H100, one call, JOURNEY 4.12); 4.4 below 1k (+2-3% over 4.3; 4.6 not measured there).
  // Causal: 4.5 from 8k (+4-6% at 16k, even with 4.3 at 4k), 4.3 below (4.4 9-26% slower
  // at 512-2k).
  static Pipeline dense_pipeline(const AttentionParams& p) {
    if (p.is_causal())
      return p.seqlen_k >= 8192 ? Pipeline::tma_ping_pong : Pipeline::tma_warp_specialized;
    if (p.seqlen_k >= 4096) return Pipeline::tma_ping_pong;
    return p.seqlen_k >= 1024 ? Pipeline::tma_persistent : Pipeline::tma_warp_specialized_overlap;
  }
  // Windowed calls: 4.3, which the persistent kernel and ping-pong trail by 5-11% at window
  // (1024, 0) and lead by 1-2% at (4096, 0).
  static constexpr Pipeline kWindowPipeline = Pipeline::tma_warp_specialized;
};
// d=256: 80-key tiles (step 4.12b, FlashAttention-3's d=256 tile; 64 before, +2-7% on an
// H100, JOURNEY 4.12), so S (40 registers), P (20) and O (128) fit the consumers' 240
// registers; 64 KB of Q + 2·2·40 KB of K/V = 224 KB of the 227. The 4.4 one-block kernel
// (causal calls from 2k) spills two of the key-block bounds (8 B, reloaded once a tile,
// beside the P·V issue); its spill-free 4.5 measured within ±2% of it at causal 2k-16k
// (two calls, either ahead), so the choice stays.
template <>
struct Sm90Traits<256> : Sm90Config<256, 80, 2, 2, 1> {
  // On 64-key tiles: 4.4 634 / 610, 4.5 625 / 610, 4.3 587 / 570.
  static constexpr bool kPersistentOverlap = true, kPersistentPingPong = false;
  // Step 4.9's grouped grid: 4.4 causal 4k +5.0%, 8k +6.1% (against main's 4.4).
  static constexpr bool kGroupedMaskedGrid = true;
  // 4.4: +3-8% over 4.3 full at every length and causal from 2k; 4.3 causal below 2k (4.4
  // 2-5% slower). 4.5 within 3% of 4.4 at 4k-16k. 4.6 (persistent, 4.4's consumers) against
  // 4.4, two runs of each interleaved in one call (seventh session, JOURNEY 4.8): full 4k
  // +1.2/+2.1%, full 16k +2.0/+1.6%, so 4.6 takes full calls from 4k. Causal: 4.6 led the
  // plain-grid 4.4 at 4k by 1.8-2.8%, but 4.4 on 4.9's grouped grid is 5.5-6.3% ahead of
  // 4.6 there (one call), so causal calls from 2k take 4.4.
  static Pipeline dense_pipeline(const AttentionParams& p) {
    if (p.is_causal())
      return p.seqlen_k < 2048 ? Pipeline::tma_warp_specialized : Pipeline::tma_warp_specialized_overlap;
    return p.seqlen_k >= 4096 ? Pipeline::tma_persistent : Pipeline::tma_warp_specialized_overlap;
  }
  // Windowed calls: the persistent kernel (4.4's consumers), level with 4.3 at window (1024,
  // 0) and 5.6% faster at (4096, 0), as ping-pong is.
  static constexpr Pipeline kWindowPipeline = Pipeline::tma_persistent;
};

// The shared-memory budget of every kernel, per head dim (the persistent one double-buffers Q
// where it fits: Sm90Config::kPersistentQBuffers).
static_assert(Sm90Traits<64>::kSmemBytes <= kSmemLimit && Sm90Traits<64>::kPersistentSmemBytes <= kSmemLimit,
              "d=64: Q (16 KB, x2 persistent) and the K/V ring (64 KB) fit 227 KB");
static_assert(Sm90Traits<128>::kSmemBytes <= kSmemLimit && Sm90Traits<128>::kPersistentSmemBytes <= kSmemLimit,
              "d=128: Q (32 KB, x2 persistent) and the K/V ring (128 KB) fit 227 KB");
static_assert(Sm90Traits<256>::kSmemBytes <= kSmemLimit && Sm90Traits<256>::kPersistentSmemBytes <= kSmemLimit,
              "d=256: Q (64 KB, one buffer) and the K/V ring (160 KB) fit 227 KB");
static_assert(Sm90Traits<64>::BlockM192::kSmemBytes <= kSmemLimit &&
                  Sm90Traits<64>::BlockM192::kBlockM == 192,
              "d=64, step 4.7: Q (24 KB) and the K/V ring (64 KB) fit 227 KB");
static_assert(Sm90Traits<64>::BlockM192::kQBytes % kAtomBytes == 0,
              "d=64, step 4.7: 192 rows of Q are whole 1024-byte swizzle atoms");
static_assert(Sm90Traits<64>::kPersistentQBuffers == 2 && Sm90Traits<128>::kPersistentQBuffers == 2 &&
                  Sm90Traits<256>::kPersistentQBuffers == 1,
              "the Q buffering the journey's 4.6 note describes");

template <class T, int kHeadDim>
void run_sm90_forward(const AttentionParams& p, cudaStream_t stream, std::optional<Pipeline> pinned) {
  launch_sm90_forward<T, Sm90Traits<kHeadDim>>(p, stream, pinned);
}

// Instantiated in hdim<D>.cu and nowhere else: the dispatcher only sees these declarations.
#define FLASHTILE_SM90_INSTANTIATIONS(prefix, D)                                            \
  prefix template void run_sm90_forward<__half, D>(const AttentionParams&, cudaStream_t, \
                                                std::optional<Pipeline>); \
  prefix template void run_sm90_forward<__nv_bfloat16, D>(const AttentionParams&, cudaStream_t, \
                                                std::optional<Pipeline>);
FLASHTILE_SM90_INSTANTIATIONS(extern, 64)
FLASHTILE_SM90_INSTANTIATIONS(extern, 128)
FLASHTILE_SM90_INSTANTIATIONS(extern, 256)

}  // namespace flashtile::detail::sm90
