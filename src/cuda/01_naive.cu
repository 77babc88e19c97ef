// Journey step 1 — cuda_naive: the write-up's first GPU kernel.
//
// What it does: one thread per query row. The thread keeps q (pre-scaled) and the output
// accumulator in registers and streams every key and value row straight from global
// memory, folding one score at a time through the online softmax. No N×N buffer exists.
// What it costs: every thread re-reads all of K and V (through L1/L2), each key costs two
// exponentials, and only 32 warps exist at N=1024, so the GPU is mostly idle.
// Measured (H200, B=1 H=1 N=1024 d=64 fp32, `flashtile bench`): 0.606 ms, 61× cpu_standard
// (37.0 ms); the first version, which loaded K/V element by element without prefetching,
// took 2.28 ms. N=131072: 392 ms (11.2 TFLOP/s). The versions between: docs/JOURNEY.md.
#include <algorithm>
#include <cstdint>

#include "attn/seqlen.hpp"
#include "attn/softmax_state.hpp"
#include "cuda/common.cuh"
#include "cuda/device_guard.cuh"

namespace flashtile::detail {
namespace {

// 32 threads (one warp) per block: at the write-up's N=1024 that spreads the 32 warps over
// 32 SMs instead of 8.
constexpr int kNaiveThreads = 32;

// Loads one K or V row into registers before any of it is used, so that all its loads are
// in flight at once. With one warp per SM there is no other warp to hide load latency
// behind: element-by-element loads interleaved with the FMAs that use them made every
// element wait for its own load (~2.2 µs per key at N=1024, i.e. ~64 L1 latencies).
// kVector: 16-byte loads when every row start is 16-byte aligned.
template <int kHeadDim, bool kVector>
__device__ __forceinline__ void load_row(const float* src, float (&dst)[kHeadDim]) {
  if constexpr (kVector) {
    static_assert(kHeadDim % 4 == 0, "vector loads need head_dim % 4 == 0");
    const float4* src4 = reinterpret_cast<const float4*>(src);
#pragma unroll
    for (int c = 0; c < kHeadDim / 4; ++c) {
      const float4 x = __ldg(src4 + c);
      dst[4 * c] = x.x, dst[4 * c + 1] = x.y, dst[4 * c + 2] = x.z, dst[4 * c + 3] = x.w;
    }
  } else {
#pragma unroll
    for (int c = 0; c < kHeadDim; ++c) dst[c] = __ldg(src + c);
  }
}

// Rows ahead of the current key whose K and V lines are requested into L1 each step. The
// loads of one key still wait on each other (dot product, then softmax, then P·V), so
// without prefetching every key paid two trips to L2; prefetches cost no registers.
constexpr int kPrefetchDistance = 8;

template <int kHeadDim>
__device__ __forceinline__ void prefetch_row_to_l1(const float* row) {
  constexpr int kLineFloats = 32;  // 128-byte cache lines
#pragma unroll
  for (int c = 0; c < kHeadDim; c += kLineFloats)
    asm volatile("prefetch.global.L1 [%0];" ::"l"(row + c));
}

template <int kHeadDim, bool kVector>
__global__ void __launch_bounds__(kNaiveThreads) naive_forward_kernel(const AttentionParams p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // query row
  const int64_t h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seqlen_q) return;
  const int64_t hk = h / p.heads_per_kv();

  const float* q_row = bshd_ptr(static_cast<const float*>(p.q), b, i, h, p.q_batch_stride,
                                p.q_row_stride, p.q_head_stride);
  const float* k_head = bshd_ptr(static_cast<const float*>(p.k), b, 0, hk, p.k_batch_stride,
                                 p.k_row_stride, p.k_head_stride);
  const float* v_head = bshd_ptr(static_cast<const float*>(p.v), b, 0, hk, p.v_batch_stride,
                                 p.v_row_stride, p.v_head_stride);

  float q[kHeadDim], acc[kHeadDim], row[kHeadDim];  // (kHeadDim) each, in registers
  load_row<kHeadDim, kVector>(q_row, q);
#pragma unroll
  for (int c = 0; c < kHeadDim; ++c) {
    q[c] *= p.scale;
    acc[c] = 0.0f;
  }
  // Keys this row may see: all, or j <= i + seqlen_k - seqlen_q when causal (may be none).
  const SeqlenInfo<int64_t> seq(p, b);
  const int64_t n_keys = seq.mask(p).key_end(i);
  SoftmaxState<float> state;
  for (int64_t j = 0; j < n_keys; ++j) {
    if (j + kPrefetchDistance < n_keys) {
      prefetch_row_to_l1<kHeadDim>(k_head + (j + kPrefetchDistance) * p.k_row_stride);
      prefetch_row_to_l1<kHeadDim>(v_head + (j + kPrefetchDistance) * p.v_row_stride);
    }
    load_row<kHeadDim, kVector>(k_head + j * p.k_row_stride, row);
    // Four partial sums break the dependent FMA chain of the dot product.
    float partial[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < kHeadDim; ++c) partial[c % 4] += q[c] * row[c];
    float score = (partial[0] + partial[1]) + (partial[2] + partial[3]);
    const float alpha = online_softmax_block(state, &score, 1);  // score -> probability
    load_row<kHeadDim, kVector>(v_head + j * p.v_row_stride, row);
#pragma unroll
    for (int c = 0; c < kHeadDim; ++c) acc[c] = acc[c] * alpha + score * row[c];
  }

  nan_if_no_finite_score(state, n_keys > 0);
  const float inv_l = output_scale(state);
  float* o_row = bshd_ptr(static_cast<float*>(p.o), b, i, h, p.o_batch_stride, p.o_row_stride,
                          p.o_head_stride);
#pragma unroll
  for (int c = 0; c < kHeadDim; ++c) o_row[c] = acc[c] * inv_l;
  if (p.lse != nullptr) p.lse[seq.lse_index(p, b, h, i)] = log_sum_exp(state);
}

// Every q, k and v row starts on a 16-byte boundary (base pointers and strides).
bool rows_16_byte_aligned(const AttentionParams& p) {
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  const int64_t strides[] = {p.q_batch_stride, p.q_row_stride, p.q_head_stride,
                             p.k_batch_stride, p.k_row_stride, p.k_head_stride,
                             p.v_batch_stride, p.v_row_stride, p.v_head_stride};
  for (int64_t stride : strides)
    if (stride % 4 != 0) return false;
  return aligned(p.q) && aligned(p.k) && aligned(p.v);
}

std::string naive_unsupported(const AttentionParams& p) {
  if (p.dtype != DType::f32) return "cuda_naive supports float32 only";
  if (std::string why = journey_unsupported(p, "cuda_naive"); !why.empty()) return why;
  if (std::string why = head_dim_unsupported<32, 64, 128>(p, "cuda_naive"); !why.empty())
    return why;
  return grid_unsupported(p);
}

void run_naive(const AttentionParams& p) {
  const DeviceGuard on_device(p.device_index);
  const dim3 grid(static_cast<unsigned>((p.seqlen_q + kNaiveThreads - 1) / kNaiveThreads),
                  static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
  auto stream = static_cast<cudaStream_t>(p.stream);
  const bool vector_loads = rows_16_byte_aligned(p);
  dispatch_head_dim<32, 64, 128>(p.head_dim, [&](auto head_dim) {
    if (vector_loads)
      naive_forward_kernel<head_dim(), true><<<grid, kNaiveThreads, 0, stream>>>(p);
    else
      naive_forward_kernel<head_dim(), false><<<grid, kNaiveThreads, 0, stream>>>(p);
  });
  check_launch("naive_forward_kernel");
}

}  // namespace

BackendEntry make_cuda_naive_backend() {
  return {Backend::cuda_naive, DeviceType::cuda, /*priority=*/10, cuda_backend_unavailable,
          naive_unsupported, no_workspace, run_naive};
}

}  // namespace flashtile::detail
