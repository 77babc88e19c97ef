// The pieces cuda_mma's forward (kernel.cuh) and backward (backward_kernel.cuh) kernels
// share: ldmatrix addressing of the swizzled tiles, the narrow path's run-time logits, and
// which path a call takes.
#pragma once

#include <cstdint>

#include "api/params.hpp"
#include "attn/mask.hpp"
#include "attn/variant.hpp"
#include "cuda/03_mma/tile_io.cuh"
#include "cuda/mma_fragment.cuh"
#include "cuda/ptx/mma.cuh"

namespace flashtile::detail::mma {

// Per-lane byte offsets (within an aligned group of 8 chunks) of chunk 2j + hi for
// j = 0..3, after the swizzle: ldmatrix addresses then differ between k-steps only by a
// compile-time constant plus one of these four registers.
struct SwizzledPairs {
  uint32_t off[4];
  __device__ __forceinline__ SwizzledPairs(int hi, int row_mod8) {
#pragma unroll
    for (int j = 0; j < 4; ++j) off[j] = static_cast<uint32_t>(((2 * j + hi) ^ row_mod8) * 16);
  }
  // Offset of chunk pair index `pair` (chunks 2·pair and 2·pair+1): the group of 8 is
  // additive, the position inside it comes from the table.
  __device__ __forceinline__ uint32_t operator()(int pair) const {
    return static_cast<uint32_t>(pair / 4) * 128u + off[pair % 4];
  }
};

// The narrow path's one transformed kernel (mma_fragment.cuh's RuntimeLogitsTag). The
// fallback layouts trade speed for half the instantiations; the aligned path has one kernel
// per LogitsFlags.
struct RuntimeLogits : RuntimeLogitsTag {};

// Whether the aligned path serves p: 16-byte rows everywhere and whole chunks.
inline bool rows_aligned_16(const AttentionParams& p) {
  return p.head_dim % 8 == 0 &&
         access_granule(p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride) == 8 &&
         access_granule(p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride) == 8 &&
         access_granule(p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride) == 8 &&
         access_granule(p.o, p.o_batch_stride, p.o_row_stride, p.o_head_stride) == 8;
}

}  // namespace flashtile::detail::mma
