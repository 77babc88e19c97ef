// Tile sizes of the cuda_mma backward (backward_kernel.cuh), one configuration per
// specialised head dim; any head dim 1..128 runs zero-padded on the next one up.
// MmaBackwardConfig<kHeadDim, kBlockM, kNWarps (16 keys' worth each), kMinBlocks, kChunkRows,
// kDqWarpMTiles, kWarpKeys>.
// Larger head dims are refused: dK and dV of a warp's 16 keys live in 2·kHeadDim/2
// fp32 registers per thread, which at 256 leaves nothing for S and dP.
#pragma once

#include "cuda/03_mma/backward_kernel.cuh"

namespace flashtile::detail::mma {

inline constexpr int kBackwardHeadDims[] = {64, 128};

// dQ = dS·K's warp tile at both head dims: 2 m-tiles (32 rows) by 32 columns, as
// FlashAttention-2's dQ product (2 x 4 warps at d=128, 4 x 2 at d=64), 32 LDSM a step; 1 is
// the earlier 16 rows by 64 (d=128) or 64 (d=64, 128-row steps) columns, 40 LDSM a step.
// -DFLASHTILE_MMA_BACKWARD_DQ_MTILES=1 builds the earlier tile for an A/B. Alone, on the
// third session's kernel, the 32 x 32 tile measured 1.014-1.051x of the earlier one (H200,
// bf16, 4k, d 64/128, causal and not; docs/JOURNEY.md "Step 3b, fourth session").
#ifndef FLASHTILE_MMA_BACKWARD_DQ_MTILES
#define FLASHTILE_MMA_BACKWARD_DQ_MTILES 2
#endif
inline constexpr int kBackwardDqWarpMTiles = FLASHTILE_MMA_BACKWARD_DQ_MTILES;

template <int kHeadDim>
struct MmaBackwardTraits;
// Both head dims: 128 keys (8 warps) per CTA, one CTA per SM (<= 255 registers); 64 query
// rows per step at d=128 (161 KB of shared memory), 128 at d=64 (162 KB). Against
// the first configuration, <D, 64, 4, 2> (64 keys, two CTAs per SM), it loads Q and dO and
// adds dQ half as often per key. TFLOP/s of the backward (H200, bf16, non-causal, seqlen
// 1k / 4k / 16k; docs/JOURNEY.md "Step 3b"):
//                                            d=64                   d=128
//   <D, 64, 4, 2>, first kernel (1)   90.5 /  99.5 / 103.2    87.5 / 102.8 / 110.2
//   <D, 64, 8, 1>, first kernel (1)  114.7 / 122.9 / 129.3   133.0 / 150.3 / 157.5
//   <D, 64, 8, 1>, first kernel (2)  112.2 / 123.5 / 129.7   132.8 / 148.7 / 156.3
//   <D, 64, 8, 1>, second kernel (2) 151.0 / 185.1 / 194.4   176.6 / 203.0 / 215.1
//   the same, re-timed (3)           149.2 / 183.1 / 194.0   169.4 / 201.7 / 214.2
//   the third session's (3)          181.6 / 229.0 / 246.5   178.6 / 228.6 / 241.9
//   the fourth session's (4)         182.3 / 222.7 / 243.2   194.0 / 233.8 / 247.1
//   d=128 on 32-key warps (5)              -                     - / 255.1 / 271.4
//   this kernel (6)                        - / 231.9 / 251.3         - / 250.3 / 268.8
// (1) one call, first session; (2) one call, second session (dQ by 16-byte reductions, one
// barrier per step); (3) one call, third session: chunks, dPᵀ from −D, the unmasked P/dS
// copy, 8-byte reductions, d=64 at 128 rows; (4) one call, fourth session: dQ on 32 x 32
// warp tiles, row stats untouched until staged, predicated dQ adds. The last two measured
// 0.96-0.98x of the 32 x 32 tile alone at 4k, so the kernel is that tile alone (JOURNEY
// "Step 3b, fourth session"). (5) one call, fifth session, beside main's binary at 236.2 /
// 248.2 (JOURNEY "Step 3b, fifth session"). (6) one call (bwd4b): d=64 on the fourth
// session's machine code, d=128 on (5)'s layout, beside the fourth session's binary at
// 232.3 / 252.1 (d=64) and 235.6 / 245.3 (d=128). The 4-warp shape was not re-timed since (1).
// d=64 takes 128 query rows per step (FlashAttention-2's d=64 tile, 128 x 128) in two chunks
// of 64, on 16-key warps: Sᵀ and dPᵀ 32 registers each, dK and dV 64 each, Pᵀ in registers,
// 176 LDSM a step. Half the steps per key block of 64-row steps, so half the barriers,
// row-stat stagings, Q/dO issues and step bookkeeping. FlashAttention-2's 32-key warps (one
// chunk of 128 rows, warp tiles 32 keys x 64 rows, 144 LDSM) measured 0.91-0.95x of this
// (bf16, 4k and 16k, causal and not; JOURNEY "Step 3b, fifth session"), so d=64 stays here,
// its kernels the fourth session's instruction for instruction. No local loads or stores
// (cuobjdump -sass, sm_90a).
template <>
struct MmaBackwardTraits<64> : MmaBackwardConfig<64, 128, 8, 1, 64, kBackwardDqWarpMTiles, 16> {};
// d=128 takes each step's 64 rows in one chunk on FlashAttention-2's 32-key warps: Sᵀ and
// dPᵀ 32 keys x 32 rows a warp (32 registers each next to dK and dV's 64 each), Pᵀ and dSᵀ
// through shared memory, 144 LDSM a step (16-key warps in two chunks of 32: 192). Measured
// 1.07-1.11x of the 16-key warps (bf16, 4k and 16k, causal and not), and this kernel
// 1.06-1.11x in the bwd4b call (1.03x in the second timing of causal 4k, the noisiest
// point). The plain bf16 kernel keeps 8 bytes of stack (one local store, two loads a step;
// cuobjdump -sass, sm_90a).
template <>
struct MmaBackwardTraits<128> : MmaBackwardConfig<128, 64, 8, 1, 64, kBackwardDqWarpMTiles, 32> {};

// The smallest backward head dim that holds head_dim (0 when none does).
constexpr int backward_head_dim(int64_t head_dim) {
  for (int d : kBackwardHeadDims)
    if (head_dim <= d) return d;
  return 0;
}

template <class T, int kHeadDim>
void run_mma_backward(const BackwardParams& bp, void* workspace, cudaStream_t stream) {
  run_mma_backward_passes<T, MmaBackwardTraits<kHeadDim>>(bp, workspace, stream);
}

// Instantiated once per head dim in backward_hdim<D>.cu and nowhere else.
#define FLASHTILE_MMA_BACKWARD_INSTANTIATIONS(prefix, D)                                     \
  prefix template void run_mma_backward<__half, D>(const BackwardParams&, void*, cudaStream_t); \
  prefix template void run_mma_backward<__nv_bfloat16, D>(const BackwardParams&, void*,         \
                                                          cudaStream_t);
FLASHTILE_MMA_BACKWARD_INSTANTIATIONS(extern, 64)
FLASHTILE_MMA_BACKWARD_INSTANTIATIONS(extern, 128)

}  // namespace flashtile::detail::mma
