// What cuda_mma (mma.sync m16n8k16, fp16/bf16; forward and backward) and cuda_tf32x3
// (m16n8k8, tf32) do alike to their fp32 accumulators: zeroing them, and the forward's score
// passes (logits, mask, row max). Both shapes lay the accumulator out alike: lane 4·g + t
// holds rows g and g+8, columns 2t and 2t+1 of each 16x8 tile, so element 2·half + e of a
// tile is (row g + 8·half, column 2t + e).
#pragma once

#include <limits>
#include <type_traits>

#include "attn/mask.hpp"
#include "attn/softmax_state.hpp"
#include "attn/variant.hpp"

namespace flashtile::detail {

// What each backend's RuntimeLogits derives from: the narrow layouts' one kernel, softcap
// and ALiBi read at run time through LogitsTransform::operator() (precise tanh). The
// backends keep tags of their own so that their kernels' symbols stay apart.
struct RuntimeLogitsTag {
  static constexpr bool kSoftcap = true, kAlibi = true, kPlain = false;
};

template <class Logits>
inline constexpr bool is_runtime_logits_v = std::is_base_of_v<RuntimeLogitsTag, Logits>;

// The logit of raw score qk for query row i and key j under Logits: LogitsFlags through
// apply() with `tanh`, RuntimeLogits through operator().
template <class Logits, class Tanh>
__device__ __forceinline__ float transformed_logit(const LogitsTransform<float>& transform,
                                                   float qk, const Mask<int>& mask, int i, int j,
                                                   Tanh tanh) {
  if constexpr (is_runtime_logits_v<Logits>)
    return transform(qk, mask, i, j);
  else
    return transform.template apply<Logits::kSoftcap, Logits::kAlibi>(qk, mask, i, j, tanh);
}

// Zeroes an accumulator: one tile's [kTiles][4] registers, or a warp's [kMTiles][kNTiles][4].
template <int kTiles>
__device__ __forceinline__ void zero_accumulator(float (&acc)[kTiles][4]) {
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[tile][r] = 0.0f;
}
// Two [kTiles][4] accumulators in one pass (the backward's Sᵀ and dPᵀ compiled otherwise
// when zeroed one after the other).
template <int kTiles>
__device__ __forceinline__ void zero_accumulators(float (&a)[kTiles][4], float (&b)[kTiles][4]) {
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[tile][r] = b[tile][r] = 0.0f;
}
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void zero_accumulator(float (&acc)[kMTiles][kNTiles][4]) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) zero_accumulator(acc[mt]);
}

// Calls fn(x, row, key) for every element x of a warp's scores s (kMTiles 16-row m-tiles by
// kNTiles 8-key n-tiles): rows from block_row0 + warp_row0, keys from key0. The two row
// offsets come apart because summed here, per row, they compile as the kernels' own loops
// did (their sum passed in did not).
template <int kMTiles, int kNTiles, class Fn>
__device__ __forceinline__ void for_each_score(float (&s)[kMTiles][kNTiles][4], int lane,
                                               int block_row0, int warp_row0, int key0,
                                               Fn&& fn) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = block_row0 + warp_row0 + mt * 16 + g + 8 * half;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) fn(s[mt][nt][2 * half + e], row, key0 + nt * 8 + 2 * t + e);
    }
}

// Raw scores to logits under Logits (softcap, ALiBi), in place.
template <class Logits, int kMTiles, int kNTiles, class Tanh>
__device__ __forceinline__ void transform_scores(float (&s)[kMTiles][kNTiles][4], int lane,
                                                 int block_row0, int warp_row0, int key0,
                                                 const LogitsTransform<float>& transform,
                                                 const Mask<int>& mask, Tanh tanh) {
  for_each_score(s, lane, block_row0, warp_row0, key0, [&](float& x, int row, int key) {
    x = transformed_logit<Logits>(transform, x, mask, row, key, tanh);
  });
}

// -inf for the keys the mask hides from each row, on a key block that needs the mask
// (KeyBlocks::needs_mask). only_end_cuts: every row sees the block's first key (always
// under causal), so only Mask::key_end cuts, which is cheaper to test than visible().
// (The caller makes both tests: made in here, they compiled in another order.)
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void mask_scores(float (&s)[kMTiles][kNTiles][4], int lane,
                                            int block_row0, int warp_row0, int key0,
                                            const Mask<int>& mask, bool only_end_cuts) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (only_end_cuts)
    for_each_score(s, lane, block_row0, warp_row0, key0, [&](float& x, int row, int key) {
      if (key >= mask.key_end(row)) x = kNegInf;
    });
  else
    for_each_score(s, lane, block_row0, warp_row0, key0, [&](float& x, int row, int key) {
      if (!mask.visible(row, key)) x = kNegInf;
    });
}

// The max of row g + 8·half of one m-tile's scores: this lane's columns, then the quad's
// (its four lanes hold the row's columns).
template <int kNTiles>
__device__ __forceinline__ float quad_row_max(const float (&s)[kNTiles][4], int half) {
  float row_max = -std::numeric_limits<float>::infinity();
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
    row_max = fmaxf(row_max, fmaxf(s[nt][2 * half], s[nt][2 * half + 1]));
  row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
  row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
  return row_max;
}

// A row's softmax state from a lane's: the same running max (every lane of the quad holds
// it), the quad's four partial sums l added (each lane summed its own columns).
__device__ __forceinline__ SoftmaxState<float> quad_row_state(SoftmaxState<float> st) {
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 1);
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 2);
  return st;
}

}  // namespace flashtile::detail
