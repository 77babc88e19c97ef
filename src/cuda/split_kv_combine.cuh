// Split-KV on the GPU, second half: the kernel that merges the partial outputs of a split
// forward into out and lse. The first half is the forward kernel itself, which runs each
// (query block, head, batch entry) tile `splits` times, once per split_key_blocks() range,
// and writes a partial output normalised by its own denominator plus its log-sum-exp (no
// NaN rule, no sink: those belong to the whole row). combine_partials (src/attn/split_kv.hpp)
// turns a row's partial LSEs into weights and the row's LSE, exactly as cpu_flash does.
// Any kernel family can use it: the partials are fp32 whatever the output dtype.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "api/params.hpp"
#include "attn/seqlen.hpp"
#include "attn/split_kv.hpp"
#include "attn/variant.hpp"
#include "cuda/common.cuh"

namespace flashtile::detail {

// The workspace of one split forward. Partial (tile, split) holds block_m rows of `pitch`
// floats, and block_m LSEs; tile = (b · heads_q + h) · query_blocks + query block.
struct SplitPartials {
  float* out = nullptr;  // (tiles, splits, block_m, pitch)
  float* lse = nullptr;  // (tiles, splits, block_m)
  int splits = 1, block_m = 0, pitch = 0, query_blocks = 0;

  FT_HOST_DEVICE int64_t tile(int64_t b, int64_t h, int64_t heads_q, int query_block) const {
    return (b * heads_q + h) * query_blocks + query_block;
  }
  FT_HOST_DEVICE int64_t row_index(int64_t tile, int split, int local_row) const {
    return (tile * splits + split) * block_m + local_row;
  }
  FT_HOST_DEVICE float* out_row(int64_t tile, int split, int local_row) const {
    return out + row_index(tile, split, local_row) * pitch;
  }
  // Bytes of the workspace for `tiles` tiles (out and lse, lse 16-byte aligned after out).
  static int64_t bytes(int64_t tiles, int splits, int block_m, int pitch) {
    const int64_t rows = tiles * splits * block_m;
    return (rows * pitch + (rows + 3) / 4 * 4) * int64_t(sizeof(float));
  }
  // Carves the workspace at `base` (laid out as bytes() counts it).
  static SplitPartials at(void* base, int64_t tiles, int splits, int block_m, int pitch,
                          int query_blocks) {
    SplitPartials parts;
    parts.out = static_cast<float*>(base);
    parts.lse = parts.out + tiles * splits * block_m * pitch;
    parts.splits = splits, parts.block_m = block_m, parts.pitch = pitch;
    parts.query_blocks = query_blocks;
    return parts;
  }
};

// The most splits a combine reads per row (its weights live in registers).
inline constexpr int kMaxSplits = 16;

__device__ __forceinline__ void store_output(float* to, float x) { *to = x; }
__device__ __forceinline__ void store_output(__half* to, float x) { *to = __float2half_rn(x); }
__device__ __forceinline__ void store_output(__nv_bfloat16* to, float x) {
  *to = __float2bfloat16_rn(x);
}

// One warp per row: every lane merges the row's LSEs itself (at most kMaxSplits), then the
// lanes share its columns. Grid: x = query blocks · (block_m / rows per CTA), y = heads,
// z = batch; kRowsPerCta rows per CTA.
template <class T, int kRowsPerCta>
__global__ void __launch_bounds__(kRowsPerCta * 32)
    combine_split_kv_kernel(const AttentionParams p, const SplitPartials parts) {
  const int lane = threadIdx.x % 32;
  const int ctas_per_block = parts.block_m / kRowsPerCta;
  const int query_block = blockIdx.x / ctas_per_block;
  const int local_row = (blockIdx.x % ctas_per_block) * kRowsPerCta + threadIdx.x / 32;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const SeqlenInfo<int> seq(p, b);
  const int row = query_block * parts.block_m + local_row;
  if (row >= seq.seqlen_q) return;
  const Mask<int> mask = seq.mask(p);
  const int64_t tile = parts.tile(b, h, p.heads_q, query_block);

  float partial_lse[kMaxSplits], weight[kMaxSplits];
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s)
    partial_lse[s] = s < parts.splits ? parts.lse[parts.row_index(tile, s, local_row)] : 0.0f;
  const float row_lse = combine_partials(partial_lse, parts.splits, sink_logit<float>(p, h),
                                         mask.visible_keys(row) > 0, weight);

  T* out_row = static_cast<T*>(p.o) + seq.o_offset(p, b, row, h);
  for (int c = lane; c < p.head_dim; c += 32) {
    float x = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s)
      if (s < parts.splits) x += weight[s] * parts.out_row(tile, s, local_row)[c];
    store_output(out_row + c, x);
  }
  if (p.lse != nullptr && lane == 0) p.lse[seq.lse_index(p, b, h, row)] = row_lse;
}

// Merges `parts` into p.o and p.lse on `stream`.
template <class T>
void launch_split_kv_combine(const AttentionParams& p, const SplitPartials& parts,
                             cudaStream_t stream) {
  constexpr int kRowsPerCta = 4;
  if (parts.block_m % kRowsPerCta != 0)
    throw Error(ErrorKind::runtime, "split-KV combine: block_m must be a multiple of 4");
  const dim3 grid(static_cast<unsigned>(parts.query_blocks * (parts.block_m / kRowsPerCta)),
                  static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
  combine_split_kv_kernel<T, kRowsPerCta><<<grid, kRowsPerCta * 32, 0, stream>>>(p, parts);
  check_launch("combine_split_kv_kernel");
}

}  // namespace flashtile::detail
