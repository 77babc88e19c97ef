// Journey step 2 — cuda_tiled: the write-up's tiled kernel.
//
// What changed from step 1: a block of kBlockM query rows loads each kBlockN-row tile of K
// and V into shared memory once, and every row of the block reuses it, so K and V are read
// from global memory once per block instead of once per row. Scores for the whole tile live
// in registers (the write-up's fix for the 48 KB static shared-memory limit) and the online
// softmax is applied per tile: one rescale of the accumulator per tile, not per key.
// Four threads share a query row, each owning a quarter of head_dim as float4 chunks
// (interleaved, so a warp's shared-memory reads are conflict-free); partial dot products
// meet through two warp shuffles. That quadruples the threads in flight versus one thread
// per row and keeps the per-thread registers small. Causal blocks skip key tiles that lie
// entirely above the diagonal.
// Measured (H200, B=1 H=1 N=1024 d=64 fp32, `flashtile bench`): 0.219 ms, 169× cpu_standard
// and 2.8× step 1; N=131072: 345 ms (12.7 TFLOP/s fp32). Only 32 of 132 SMs have work at
// N=1024 with one head: the floor there is ~5 µs (docs/JOURNEY.md).
#include <algorithm>
#include <limits>

#include "attn/seqlen.hpp"
#include "attn/softmax_state.hpp"
#include "cuda/common.cuh"
#include "cuda/device_guard.cuh"

namespace flashtile::detail {
namespace {

// Tile shape per head_dim. Static shared memory is (kBlockM + 2·kBlockN)·kHeadDim floats,
// which at head_dim 128 is exactly the 48 KB static limit.
template <int kHeadDim>
struct TiledTraits {
  static constexpr int kThreadsPerRow = 4;
  static constexpr int kBlockM = 32;  // query rows per block
  static constexpr int kBlockN = 32;  // keys per tile
  static constexpr int kThreads = kBlockM * kThreadsPerRow;
  static constexpr int kChunks = kHeadDim / 4 / kThreadsPerRow;  // float4 chunks per thread
  static constexpr int kSharedBytes = (kBlockM + 2 * kBlockN) * kHeadDim * 4;
  static_assert(kHeadDim % (4 * kThreadsPerRow) == 0,
                "head_dim must split into float4 chunks over the threads of a row");
  static_assert(kSharedBytes <= 48 * 1024, "tiles exceed the 48 KB static shared-memory budget");
  static_assert(kThreads % 32 == 0 && 32 % kThreadsPerRow == 0,
                "a row's threads must sit in one warp for the shuffles");
};

// Cooperative, coalesced copy of `rows` rows (kHeadDim floats each) of a strided tensor
// into a dense shared tile; rows past `valid_rows` are zero-filled.
template <int kHeadDim, int kRows, int kThreads>
__device__ __forceinline__ void load_tile(float* tile, const float* src, int64_t row_stride,
                                          int64_t valid_rows) {
#pragma unroll 4
  for (int e = threadIdx.x; e < kRows * kHeadDim; e += kThreads) {
    const int row = e / kHeadDim, col = e % kHeadDim;
    tile[e] = row < valid_rows ? src[row * row_stride + col] : 0.0f;
  }
}

template <int kHeadDim>
__global__ void __launch_bounds__(TiledTraits<kHeadDim>::kThreads)
    tiled_forward_kernel(const AttentionParams p) {
  using Traits = TiledTraits<kHeadDim>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kThreadsPerRow = Traits::kThreadsPerRow, kChunks = Traits::kChunks;

  __shared__ float4 q_tile[kBlockM * kHeadDim / 4];  // (kBlockM, kHeadDim)
  __shared__ float4 k_tile[kBlockN * kHeadDim / 4];  // (kBlockN, kHeadDim)
  __shared__ float4 v_tile[kBlockN * kHeadDim / 4];  // (kBlockN, kHeadDim)

  const int64_t h = blockIdx.y, b = blockIdx.z, hk = h / p.heads_per_kv();
  const int64_t row_start = int64_t(blockIdx.x) * kBlockM;
  const int local_row = threadIdx.x / kThreadsPerRow;  // row of this thread in the block
  const int lane_in_row = threadIdx.x % kThreadsPerRow;
  const int64_t i = row_start + local_row;  // query row

  const float* q_block = bshd_ptr(static_cast<const float*>(p.q), b, row_start, h,
                                  p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  load_tile<kHeadDim, kBlockM, Traits::kThreads>(reinterpret_cast<float*>(q_tile), q_block,
                                                 p.q_row_stride, p.seqlen_q - row_start);
  __syncthreads();

  // This thread's slice of q (pre-scaled) and of the accumulator: chunk c = k·4 + lane.
  float4 q[kChunks], acc[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const float4 x = q_tile[local_row * (kHeadDim / 4) + c * kThreadsPerRow + lane_in_row];
    q[c] = make_float4(x.x * p.scale, x.y * p.scale, x.z * p.scale, x.w * p.scale);
    acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }

  // Key range of the whole block; with causal, later tiles are above every row's diagonal.
  const SeqlenInfo<int64_t> seq(p, b);
  const Mask<int64_t> mask = seq.mask(p);
  const int64_t block_last_row = std::min<int64_t>(row_start + kBlockM, p.seqlen_q) - 1;
  const int64_t n_keys = mask.key_end(block_last_row);
  const int64_t row_key_end = mask.key_end(i);

  const float* k_head = bshd_ptr(static_cast<const float*>(p.k), b, 0, hk, p.k_batch_stride,
                                 p.k_row_stride, p.k_head_stride);
  const float* v_head = bshd_ptr(static_cast<const float*>(p.v), b, 0, hk, p.v_batch_stride,
                                 p.v_row_stride, p.v_head_stride);
  SoftmaxState<float> state;

  for (int64_t tile_start = 0; tile_start < n_keys; tile_start += kBlockN) {
    __syncthreads();  // the previous tile is no longer read
    load_tile<kHeadDim, kBlockN, Traits::kThreads>(reinterpret_cast<float*>(k_tile),
                                                   k_head + tile_start * p.k_row_stride,
                                                   p.k_row_stride, p.seqlen_k - tile_start);
    load_tile<kHeadDim, kBlockN, Traits::kThreads>(reinterpret_cast<float*>(v_tile),
                                                   v_head + tile_start * p.v_row_stride,
                                                   p.v_row_stride, p.seqlen_k - tile_start);
    __syncthreads();

    float s[kBlockN];  // (kBlockN) scores of this row, in registers
#pragma unroll
    for (int j = 0; j < kBlockN; ++j) {
      float partial = 0.0f;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const float4 kv = k_tile[j * (kHeadDim / 4) + c * kThreadsPerRow + lane_in_row];
        partial += q[c].x * kv.x + q[c].y * kv.y + q[c].z * kv.z + q[c].w * kv.w;
      }
#pragma unroll
      for (int offset = 1; offset < kThreadsPerRow; offset *= 2)
        partial += __shfl_xor_sync(0xffffffffu, partial, offset);
      const int64_t key = tile_start + j;
      s[j] = key < row_key_end ? partial : -std::numeric_limits<float>::infinity();
    }

    const float alpha = online_softmax_block(state, s, kBlockN);  // s -> probabilities
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      float4 a = make_float4(acc[c].x * alpha, acc[c].y * alpha, acc[c].z * alpha,
                             acc[c].w * alpha);
#pragma unroll
      for (int j = 0; j < kBlockN; ++j) {
        const float4 vv = v_tile[j * (kHeadDim / 4) + c * kThreadsPerRow + lane_in_row];
        a.x += s[j] * vv.x;
        a.y += s[j] * vv.y;
        a.z += s[j] * vv.z;
        a.w += s[j] * vv.w;
      }
      acc[c] = a;
    }
  }

  if (i >= p.seqlen_q) return;
  nan_if_no_finite_score(state, row_key_end > 0);
  const float inv_l = output_scale(state);
  float* o_row = bshd_ptr(static_cast<float*>(p.o), b, i, h, p.o_batch_stride, p.o_row_stride,
                          p.o_head_stride);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    float* dst = o_row + (c * kThreadsPerRow + lane_in_row) * 4;
    dst[0] = acc[c].x * inv_l;
    dst[1] = acc[c].y * inv_l;
    dst[2] = acc[c].z * inv_l;
    dst[3] = acc[c].w * inv_l;
  }
  if (p.lse != nullptr && lane_in_row == 0)
    p.lse[seq.lse_index(p, b, h, i)] = log_sum_exp(state);
}

std::string tiled_unsupported(const AttentionParams& p) {
  if (p.dtype != DType::f32) return "cuda_tiled supports float32 only";
  if (std::string why = journey_unsupported(p, "cuda_tiled"); !why.empty()) return why;
  if (std::string why = head_dim_unsupported<32, 64, 128>(p, "cuda_tiled"); !why.empty())
    return why;
  return grid_unsupported(p);
}

void run_tiled(const AttentionParams& p) {
  const DeviceGuard on_device(p.device_index);
  auto stream = static_cast<cudaStream_t>(p.stream);
  dispatch_head_dim<32, 64, 128>(p.head_dim, [&](auto head_dim) {
    using Traits = TiledTraits<head_dim()>;
    const dim3 grid(static_cast<unsigned>((p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM),
                    static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
    tiled_forward_kernel<head_dim()><<<grid, Traits::kThreads, 0, stream>>>(p);
  });
  check_launch("tiled_forward_kernel");
}

}  // namespace

BackendEntry make_cuda_tiled_backend() {
  return {Backend::cuda_tiled, DeviceType::cuda, /*priority=*/20, cuda_backend_unavailable,
          tiled_unsupported, no_workspace, run_tiled};
}

}  // namespace flashtile::detail
