// Journey step 1 — cuda_naive: the write-up's first GPU kernel.
//
// What it does: one thread per query row. The thread keeps q (pre-scaled) and the output
// accumulator in registers and streams every key and value row straight from global
// memory, folding a few scores at a time through the online softmax. No N×N buffer exists.
// What it costs: every thread re-reads all of K and V (through L1/L2) with scalar loads,
// and only 32 warps exist at N=1024, so the GPU is mostly idle.
// Measured (H200, B=1 H=1 N=1024 d=64 fp32, `flashtile bench`): see docs/JOURNEY.md, step 1.
#include <algorithm>
#include <limits>

#include "common/online_softmax.hpp"
#include "cuda/common.cuh"

namespace flashtile::detail {
namespace {

// 32 threads (one warp) per block: every thread of a block loads the same K/V row, so a
// block's loads are broadcasts that queue on one SM's load unit. At the write-up's N=1024,
// one warp per block spreads the 32 warps over 32 SMs instead of 8 (first H200 run, 128
// threads per block and a single dependent FMA chain per score: 2.28 ms).
constexpr int kNaiveThreads = 32;
// Keys folded per online-softmax step. One key per step (the write-up's form) left every
// iteration waiting on its own K and V loads from L2: 2.24 ms at N=1024 on the H200.
// Eight keys per step put eight rows' loads in flight at once and cut the exponentials
// for the rescale from one per key to one per eight.
constexpr int kKeysPerStep = 8;

template <int kHeadDim>
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

  float q[kHeadDim], acc[kHeadDim];  // (kHeadDim) each, in registers
#pragma unroll
  for (int c = 0; c < kHeadDim; ++c) {
    q[c] = q_row[c] * p.scale;
    acc[c] = 0.0f;
  }
  // Keys this row may see: all, or j <= i + seqlen_k - seqlen_q when causal (may be none).
  const int64_t n_keys = p.causal ? std::min<int64_t>(p.seqlen_k, i + p.causal_offset() + 1)
                                  : p.seqlen_k;
  SoftmaxState<float> state;
  for (int64_t j0 = 0; j0 < n_keys; j0 += kKeysPerStep) {
    float s[kKeysPerStep];  // (kKeysPerStep) scores, then probabilities
#pragma unroll
    for (int t = 0; t < kKeysPerStep; ++t) {
      s[t] = -std::numeric_limits<float>::infinity();
      if (j0 + t < n_keys) {
        const float* k_row = k_head + (j0 + t) * p.k_row_stride;
        // Four partial sums break the dependent FMA chain of the dot product.
        float partial[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int c = 0; c < kHeadDim; ++c) partial[c % 4] += q[c] * k_row[c];
        s[t] = (partial[0] + partial[1]) + (partial[2] + partial[3]);
      }
    }
    const float alpha = online_softmax_block(state, s, kKeysPerStep);
#pragma unroll
    for (int c = 0; c < kHeadDim; ++c) acc[c] *= alpha;
#pragma unroll
    for (int t = 0; t < kKeysPerStep; ++t) {
      if (j0 + t < n_keys) {
        const float* v_row = v_head + (j0 + t) * p.v_row_stride;
#pragma unroll
        for (int c = 0; c < kHeadDim; ++c) acc[c] += s[t] * v_row[c];
      }
    }
  }

  const float inv_l = output_scale(state);
  float* o_row = bshd_ptr(static_cast<float*>(p.o), b, i, h, p.o_batch_stride, p.o_row_stride,
                          p.o_head_stride);
#pragma unroll
  for (int c = 0; c < kHeadDim; ++c) o_row[c] = acc[c] * inv_l;
  if (p.lse != nullptr) p.lse[(b * p.heads_q + h) * p.seqlen_q + i] = log_sum_exp(state);
}

std::string naive_unsupported(const AttentionParams& p) {
  if (p.dtype != DType::f32) return "cuda_naive supports float32 only";
  if (std::string why = head_dim_unsupported<32, 64, 128>(p, "cuda_naive"); !why.empty())
    return why;
  return grid_unsupported(p);
}

void run_naive(const AttentionParams& p) {
  check_cuda(cudaSetDevice(p.device_index), "cudaSetDevice");
  const dim3 grid(static_cast<unsigned>((p.seqlen_q + kNaiveThreads - 1) / kNaiveThreads),
                  static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
  auto stream = static_cast<cudaStream_t>(p.stream);
  dispatch_head_dim<32, 64, 128>(p.head_dim, [&](auto head_dim) {
    naive_forward_kernel<head_dim()><<<grid, kNaiveThreads, 0, stream>>>(p);
  });
  check_launch("naive_forward_kernel");
}

}  // namespace

BackendEntry make_cuda_naive_backend() {
  return {Backend::cuda_naive, DeviceType::cuda, /*priority=*/10, cuda_backend_unavailable,
          naive_unsupported, no_workspace, run_naive};
}

}  // namespace flashtile::detail
