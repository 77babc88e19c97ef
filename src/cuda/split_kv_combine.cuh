// Split-KV on the GPU, second half: merging the partial outputs of a split forward into out
// and lse. The first half is the forward kernel itself, which runs each (query block, head,
// batch entry) tile `splits` times, once per split_key_blocks() range, and writes a partial
// output normalised by its own denominator plus its log-sum-exp (no NaN rule, no sink: those
// belong to the whole row). combine_partials_unrolled (src/attn/split_kv.hpp) turns a row's
// partial LSEs into weights and the row's LSE with the rules of cpu_flash's
// combine_partials, in registers. Any kernel family can use it: the partials are fp32
// whatever the output dtype.
//
// Two ways to merge, with the same weights (weigh_row_partials) and the same sum in split
// order, so the same bits:
// - in the forward's own launch (cuda_tf32x3's path): each split CTA writes its partial,
//   arrives on its tile's counter (last_split_to_arrive), and the last to arrive merges the
//   tile (merge_tile_partials). One launch per call; the merge runs on one CTA per tile.
// - a combine kernel after the forward (combine_split_kv_kernel), one warp per row, launched
//   by launch_split_kv_combine; on sm_90+ it can be a programmatic dependent launch, whose
//   CTAs are scheduled while the forward still runs (once every forward CTA has called
//   allow_dependent_launch() or exited) and wait in griddepcontrol.wait until the forward
//   grid has completed and its writes are visible.
//   cuda_tf32x3 takes it only under FLASHTILE_TF32X3_MERGE=combine, the two-launch baseline
//   that bench/tf32x3_breakdown.cu times beside the one launch (H200, third session: forward
//   + combine 19.5 us, 18.2 us with the programmatic launch; the combine alone 6.5 us). It
//   spreads a tile's merge over block_m / 4 CTAs where the one launch gives it to one: the
//   write-up's case (16 tiles, 16 splits) is where that may still pay (docs/JOURNEY.md 2b).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>

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
  // (tiles) arrival counters for the merge in the forward's launch, all zero between calls
  // (the last CTA of a tile sets its counter back to zero); null: the forward only writes
  // the partials and a combine kernel merges them.
  uint32_t* arrivals = nullptr;
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

// The weights of row `local_row` of `tile`'s partials (weight[s] for split s, 0 from
// parts.splits on) and the row's LSE, with the NaN rule and the sink: the row's partial LSEs
// are all loaded first (from L2: other CTAs wrote them), then combine_partials_unrolled.
__device__ __forceinline__ float weigh_row_partials(const SplitPartials& parts, int64_t tile,
                                                    int local_row, float sink, bool row_sees_keys,
                                                    float (&weight)[kMaxSplits]) {
  // Split s + 1 of this row lies block_m rows after split s.
  const float* lse_of_split = parts.lse + parts.row_index(tile, 0, local_row);
  float partial_lse[kMaxSplits];
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s)
    partial_lse[s] = s < parts.splits ? __ldcg(lse_of_split + s * parts.block_m) : 0.0f;
  return combine_partials_unrolled(partial_lse, parts.splits, sink, row_sees_keys, weight);
}

// The election of the merged split-KV forward: whether this CTA is the last of its tile's
// `splits` CTAs to have written its partial (the same answer in every thread of the CTA).
// Call it with every thread, after the partial's stores; `flag` is one word of shared memory.
// Every thread fences its own stores (release, gpu scope) before thread 0 arrives on the
// tile's counter; the last arriver fences again (acquire) before anyone reads the partials,
// which it must read through L2 (__ldcg), not L1. It also sets the counter back to zero: every
// split has arrived, so nothing else touches it in this call, and the next call on the same
// counters (ordered after this one on its stream) finds zero.
__device__ __forceinline__ bool last_split_to_arrive(uint32_t* arrival, int splits,
                                                     uint32_t* flag) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const bool last = atomicAdd(arrival, 1u) == static_cast<uint32_t>(splits - 1);
    if (last) {
      atomicExch(arrival, 0u);
      __threadfence();
    }
    *flag = last ? 1u : 0u;
  }
  __syncthreads();
  return *flag != 0;
}

// The last CTA's merge of its tile into out and lse, with kThreads threads. First one thread
// per row weighs the row's partials (weigh_row_partials; the weights go to `scratch`, shared
// memory of (kBlockM, kMaxSplits + 1) floats) and writes its LSE; then every thread sums
// 16-byte chunks of the partials in split order, thread i taking chunk i % (kPitch / 4) of
// rows i / (kPitch / 4) + r · (kThreads / (kPitch / 4)), so that a warp's loads of one split
// are whole rows of the workspace. The sum is combine_split_kv_kernel's (same weights, same
// order): the same bits. kVectorStores: out rows start on 16 bytes and head_dim is whole
// chunks (fp32 out only), else one store per element.
template <class T, int kThreads, int kBlockM, int kPitch, bool kVectorStores>
__device__ __forceinline__ void merge_tile_partials(const AttentionParams& p,
                                                    const SeqlenInfo<int>& seq,
                                                    const Mask<int>& mask,
                                                    const SplitPartials& parts, int64_t tile,
                                                    int64_t b, int64_t h, int row_start,
                                                    float* scratch) {
  constexpr int kChunks = kPitch / 4;              // 16-byte chunks per partial row
  constexpr int kPassRows = kThreads / kChunks;    // rows per pass of the CTA
  constexpr int kWeightPitch = kMaxSplits + 1;     // a warp's two rows in distinct banks
  static_assert(kPitch % 4 == 0, "partial rows are whole 16-byte chunks");
  static_assert(kThreads % kChunks == 0 && kBlockM % kPassRows == 0,
                "the passes cover the tile's rows exactly");
  static_assert(kThreads >= kBlockM, "one thread weighs each row");
  static_assert(!kVectorStores || std::is_same_v<T, float>, "vector stores are fp32 only");
  const int rows = min(kBlockM, seq.seqlen_q - row_start);  // rows past the end have no partial
  if (threadIdx.x < rows) {
    const int local_row = threadIdx.x, row = row_start + local_row;
    float weight[kMaxSplits];
    const float row_lse = weigh_row_partials(parts, tile, local_row, sink_logit<float>(p, h),
                                             mask.visible_keys(row) > 0, weight);
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) scratch[local_row * kWeightPitch + s] = weight[s];
    if (p.lse != nullptr) p.lse[seq.lse_index(p, b, h, row)] = row_lse;
  }
  __syncthreads();

  const int first_row = threadIdx.x / kChunks, col = (threadIdx.x % kChunks) * 4;
  const int64_t split_stride = int64_t(parts.block_m) * parts.pitch;  // floats, split to split
  // A fixed number of passes, two at a time, both passes' loads issued before either's
  // stores (which the compiler may not move loads across) and every load a select rather
  // than a branch: 32 loads of 16 bytes in flight per thread, since the merge is one CTA's
  // reads of every split of its tile from L2. (A loop to `rows` compiled its remainder pass
  // into a branch and a round trip per split, SASS.)
  constexpr int kPasses = kBlockM / kPassRows;
  static_assert(kPasses % 2 == 0, "passes go two at a time");
  auto load_pass = [&](int local_row, float4 (&x)[kMaxSplits]) {
    const float* from = parts.out_row(tile, 0, local_row) + col;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s)
      x[s] = local_row < rows && s < parts.splits
                 ? __ldcg(reinterpret_cast<const float4*>(from + s * split_stride))
                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  };
  auto sum_and_store = [&](int local_row, const float4 (&x)[kMaxSplits]) {
    if (local_row >= rows) return;
    const float* weight = scratch + local_row * kWeightPitch;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // out[row][col .. col + 3]
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s)
      if (s < parts.splits) {
        sum.x += weight[s] * x[s].x;
        sum.y += weight[s] * x[s].y;
        sum.z += weight[s] * x[s].z;
        sum.w += weight[s] * x[s].w;
      }
    T* to = static_cast<T*>(p.o) + seq.o_offset(p, b, row_start + local_row, h) + col;
    if constexpr (kVectorStores) {
      // __stcg: nvcc 13.0 split a plain float4 store of `sum` into four (PTX).
      if (col < p.head_dim) __stcg(reinterpret_cast<float4*>(to), sum);
    } else {
      const float out4[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (col + e < p.head_dim) store_output(to + e, out4[e]);
    }
  };
#pragma unroll 1
  for (int pass = 0; pass < kPasses; pass += 2) {
    const int row_a = first_row + pass * kPassRows, row_b = row_a + kPassRows;
    float4 x_a[kMaxSplits], x_b[kMaxSplits];  // (split) this thread's chunk of rows a and b
    load_pass(row_a, x_a);
    load_pass(row_b, x_b);
    sum_and_store(row_a, x_a);
    sum_and_store(row_b, x_b);
  }
}

// One warp per row. Every lane loads its own columns of every partial and the row's LSEs
// (all loads independent, one memory round trip), weighs the partials with
// weigh_row_partials (registers only: the split count is bounded by kMaxSplits at compile
// time) and sums its columns. Lane l holds the column pairs 2l + 64j of the
// workspace row (pitch <= 64 · kPairsPerLane), so a warp's loads of one split are whole
// 256-byte lines. Grid: x = query blocks · (block_m / rows per CTA), y = heads, z = batch;
// kRowsPerCta rows per CTA.
template <class T, int kRowsPerCta, int kPairsPerLane>
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
  const int splits = parts.splits;
  // Everything above reads only p; the partials exist once the forward grid is done.
  wait_for_prerequisite_grids();

  // Split s + 1 of this row lies block_m rows after split s.
  const float* out_of_split = parts.out_row(tile, 0, local_row) + 2 * lane;  // pair j = 0
  const int64_t out_split_stride = int64_t(parts.block_m) * parts.pitch;
  bool pair_in_row[kPairsPerLane];
#pragma unroll
  for (int j = 0; j < kPairsPerLane; ++j) pair_in_row[j] = 64 * j + 2 * lane < parts.pitch;
  float2 partial_out[kMaxSplits][kPairsPerLane];  // (split, this lane's column pair j)
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s) {
#pragma unroll
    for (int j = 0; j < kPairsPerLane; ++j)
      partial_out[s][j] = s < splits && pair_in_row[j]
                              ? *reinterpret_cast<const float2*>(out_of_split + 64 * j)
                              : make_float2(0.0f, 0.0f);
    out_of_split += out_split_stride;
  }
  float weight[kMaxSplits];
  const float row_lse = weigh_row_partials(parts, tile, local_row, sink_logit<float>(p, h),
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

// Merges `parts` into p.o and p.lse on `stream`. overlap_with_producer: launch it as a
// programmatic dependent of the kernel just before it on `stream` (sm_90+ devices only; that
// kernel should call allow_dependent_launch(), else the combine starts when it ends).
template <class T>
void launch_split_kv_combine(const AttentionParams& p, const SplitPartials& parts,
                             cudaStream_t stream, bool overlap_with_producer = false) {
  constexpr int kRowsPerCta = 4;
  if (parts.block_m % kRowsPerCta != 0)
    throw Error(ErrorKind::runtime, "split-KV combine: block_m must be a multiple of 4");
  // float2 loads of the partials: rows of an even pitch stay 8-byte aligned.
  if (parts.pitch % 2 != 0 || parts.pitch > 128 || parts.pitch < p.head_dim)
    throw Error(ErrorKind::runtime,
                "split-KV combine: the partials' pitch must be even, at most 128 and at least "
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
  // One column pair per lane up to a pitch of 64, two up to 128.
  const cudaError_t status =
      parts.pitch <= 64
          ? cudaLaunchKernelEx(&config, combine_split_kv_kernel<T, kRowsPerCta, 1>, p, parts)
          : cudaLaunchKernelEx(&config, combine_split_kv_kernel<T, kRowsPerCta, 2>, p, parts);
  check_cuda(status, "cudaLaunchKernelEx(combine_split_kv_kernel)");
  check_launch("combine_split_kv_kernel");
}

}  // namespace flashtile::detail
