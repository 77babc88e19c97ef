// Split-KV on the GPU, second half: the kernel that merges the partial outputs of a split
// forward into out and lse. The first half is the forward kernel itself, which runs each
// (query block, head, batch entry) tile `splits` times, once per split_key_blocks() range,
// and writes a partial output normalised by its own denominator plus its log-sum-exp (no
// NaN rule, no sink: those belong to the whole row). combine_partials_unrolled
// (src/attn/split_kv.hpp) turns a row's partial LSEs into weights and the row's LSE with the
// rules of cpu_flash's combine_partials, in registers.
// Any kernel family can use it: the partials are fp32 whatever the output dtype. The host
// side (how many splits, the workspace, the launch sequence) is split_kv_launch.hpp.
//
// On sm_90+ the combine can be a programmatic dependent launch: its CTAs are scheduled
// while the forward still runs (as soon as every forward CTA has called
// allow_dependent_launch() or exited) and wait in griddepcontrol.wait until the forward grid
// has completed and its writes are visible, so the combine's launch latency and its index
// set-up can hide behind the forward's tail. On the write-up's case (H200) that saved nothing
// measurable, 22.4 vs 21.9 us for the pair, with the earlier combine whose rows merged their
// 16 partials one after another through a stack (docs/JOURNEY.md, step 2b).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

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

// A split forward's partial of one row, from the thread that holds column pair (8c + 2t,
// 8c + 2t + 1) of every 8-column tile c < kColTiles (the mma.sync and wgmma accumulator
// layouts; pair_of(c) returns it unnormalised): the row normalised by its own denominator,
// fp32, and (t == 0) its LSE. st is the row's state over this split's keys, l summed over
// the quad already; no NaN rule and no sink (the combine applies them to the whole row).
template <int kColTiles, class PairOf>
__device__ __forceinline__ void store_partial_row(const SplitPartials& parts, int64_t tile,
                                                  int split, int local_row, int t,
                                                  const SoftmaxState<float>& st, PairOf pair_of) {
  const float scale = output_scale(st);  // 0 when this split saw no key of the row
  float* to = parts.out_row(tile, split, local_row) + 2 * t;
#pragma unroll
  for (int c = 0; c < kColTiles; ++c) {
    const float2 x = pair_of(c);
    *reinterpret_cast<float2*>(to + 8 * c) = make_float2(x.x * scale, x.y * scale);
  }
  if (t == 0) parts.lse[parts.row_index(tile, split, local_row)] = log_sum_exp(st);
}

// A forward kernel whose partials a programmatically launched combine reads calls this
// (any thread, any time: the combine still waits for the whole grid to finish). No-op below
// sm_90 and when the next kernel is launched normally.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Waits until the grids this one depends on have completed and their memory is visible
// (a no-op for a normal launch, which starts only after them).
__device__ __forceinline__ void wait_for_prerequisite_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// The most splits a combine reads per row (its weights live in registers).
inline constexpr int kMaxSplits = 16;

__device__ __forceinline__ void store_output(float* to, float x) { *to = x; }
__device__ __forceinline__ void store_output(__half* to, float x) { *to = __float2half_rn(x); }
__device__ __forceinline__ void store_output(__nv_bfloat16* to, float x) {
  *to = __float2bfloat16_rn(x);
}

// One row of a split forward merged by one warp: every lane loads the row's LSEs and its
// own columns of every partial first (all loads independent, one memory round trip), weighs
// the partials with combine_partials_unrolled (registers only: the split count is bounded
// by kMaxSplits at compile time) and sums its columns. Lane l holds the column pairs 2l + 64j
// of the workspace row (pitch <= 64 · kPairsPerLane), so a warp's loads of one split are
// whole 256-byte lines. The loads skip L1 (ld.global.cg): a forward kernel that merges its
// own grid's partials (cuda_tf32x3, 2c.5) reads lines other SMs have just written.
// kSplits > 0: parts.splits is known to be kSplits, so every split test folds away (the
// in-kernel merge runs this once per CTA with a cold instruction cache: less code is faster).
template <class T, int kPairsPerLane, int kSplits = 0>
__device__ __forceinline__ void combine_row(const AttentionParams& p, const SplitPartials& parts,
                                            const SeqlenInfo<int>& seq, const Mask<int>& mask,
                                            int64_t b, int64_t h, int query_block, int local_row,
                                            int lane) {
  static_assert(kSplits >= 0 && kSplits <= kMaxSplits, "at most kMaxSplits splits");
  const int row = query_block * parts.block_m + local_row;
  const int64_t tile = parts.tile(b, h, p.heads_q, query_block);
  const int splits = kSplits > 0 ? kSplits : parts.splits;
  // Split s + 1 of this row lies block_m rows after split s.
  const float* lse_of_split = parts.lse + parts.row_index(tile, 0, local_row);
  const float* out_of_split = parts.out_row(tile, 0, local_row) + 2 * lane;  // pair j = 0
  const int64_t out_split_stride = int64_t(parts.block_m) * parts.pitch;
  bool pair_in_row[kPairsPerLane];
#pragma unroll
  for (int j = 0; j < kPairsPerLane; ++j) pair_in_row[j] = 64 * j + 2 * lane < parts.pitch;
  float partial_lse[kMaxSplits];
  float2 partial_out[kMaxSplits][kPairsPerLane];  // (split, this lane's column pair j)
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s) {
    partial_lse[s] = s < splits ? __ldcg(lse_of_split) : 0.0f;
#pragma unroll
    for (int j = 0; j < kPairsPerLane; ++j)
      partial_out[s][j] = s < splits && pair_in_row[j]
                              ? __ldcg(reinterpret_cast<const float2*>(out_of_split + 64 * j))
                              : make_float2(0.0f, 0.0f);
    lse_of_split += parts.block_m;
    out_of_split += out_split_stride;
  }
  float weight[kMaxSplits];
  const float row_lse = combine_partials_unrolled(partial_lse, splits, sink_logit<float>(p, h),
                                                  mask.visible_keys(row) > 0, weight);

  T* out_row = static_cast<T*>(p.o) + seq.o_offset(p, b, row, h);
#pragma unroll
  for (int j = 0; j < kPairsPerLane; ++j) {
    const int col = 64 * j + 2 * lane;
    float x0 = 0.0f, x1 = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s)
      if (s < splits) {
        x0 += weight[s] * partial_out[s][j].x;
        x1 += weight[s] * partial_out[s][j].y;
      }
    // out rows need not be 8-byte aligned: two scalar stores.
    if (col < p.head_dim) store_output(out_row + col, x0);
    if (col + 1 < p.head_dim) store_output(out_row + col + 1, x1);
  }
  if (p.lse != nullptr && lane == 0) p.lse[seq.lse_index(p, b, h, row)] = row_lse;
}

// The combine as its own kernel: one warp per row (combine_row). Grid: x = query blocks ·
// (block_m / rows per CTA), y = heads, z = batch; kRowsPerCta rows per CTA.
template <class T, int kRowsPerCta, int kPairsPerLane>
__global__ void __launch_bounds__(kRowsPerCta * 32)
    combine_split_kv_kernel(const AttentionParams p, const SplitPartials parts) {
  const int lane = threadIdx.x % 32;
  const int ctas_per_block = parts.block_m / kRowsPerCta;
  const int query_block = blockIdx.x / ctas_per_block;
  const int local_row = (blockIdx.x % ctas_per_block) * kRowsPerCta + threadIdx.x / 32;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const SeqlenInfo<int> seq(p, b);
  if (query_block * parts.block_m + local_row >= seq.seqlen_q) return;
  const Mask<int> mask = seq.mask(p);
  // Everything above reads only p; the partials exist once the forward grid is done.
  wait_for_prerequisite_grids();
  combine_row<T, kPairsPerLane>(p, parts, seq, mask, b, h, query_block, local_row, lane);
}

// Merges `parts` into p.o and p.lse on `stream` (instantiated in split_kv.cu alone, for every
// output dtype; run_split_forward calls it). overlap_with_producer: launch it as a
// programmatic dependent of the kernel just before it on `stream` (sm_90+ devices only; that
// kernel should call allow_dependent_launch(), else the combine starts when it ends).
template <class T>
void launch_split_kv_combine(const AttentionParams& p, const SplitPartials& parts,
                             cudaStream_t stream, bool overlap_with_producer = false) {
  constexpr int kRowsPerCta = 4;
  if (parts.block_m % kRowsPerCta != 0)
    throw Error(ErrorKind::runtime, "split-KV combine: block_m must be a multiple of 4");
  // float2 loads of the partials: rows of an even pitch stay 8-byte aligned.
  if (parts.pitch % 2 != 0 || parts.pitch > 256 || parts.pitch < p.head_dim)
    throw Error(ErrorKind::runtime,
                "split-KV combine: the partials' pitch must be even, at most 256 and at least "
                "head_dim; got " + std::to_string(parts.pitch));
  if (parts.splits < 1 || parts.splits > kMaxSplits)
    throw Error(ErrorKind::runtime, "split-KV combine: splits must lie in [1, " +
                                        std::to_string(kMaxSplits) + "]; got " +
                                        std::to_string(parts.splits));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(parts.query_blocks * (parts.block_m / kRowsPerCta)),
                        static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
  config.blockDim = dim3(kRowsPerCta * 32);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute programmatic = {};
  programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  programmatic.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &programmatic;
  config.numAttrs = overlap_with_producer ? 1 : 0;
  // One column pair per lane up to a pitch of 64, two up to 128, four up to 256.
  const cudaError_t status =
      parts.pitch <= 64
          ? cudaLaunchKernelEx(&config, combine_split_kv_kernel<T, kRowsPerCta, 1>, p, parts)
      : parts.pitch <= 128
          ? cudaLaunchKernelEx(&config, combine_split_kv_kernel<T, kRowsPerCta, 2>, p, parts)
          : cudaLaunchKernelEx(&config, combine_split_kv_kernel<T, kRowsPerCta, 4>, p, parts);
  check_cuda(status, "cudaLaunchKernelEx(combine_split_kv_kernel)");
  check_launch("combine_split_kv_kernel");
}

}  // namespace flashtile::detail
