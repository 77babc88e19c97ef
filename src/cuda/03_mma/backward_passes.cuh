// The passes every 16-bit backward shares around its main kernel (docs/BACKWARD.md): the
// workspace's layout, the D pre-pass (D_i = rowsum(dO_i ∘ O_i), and the sinks' partials),
// the dQ post-pass (fp32 accumulator to q's dtype), the sinks' sum, the zeroing of varlen's
// unused key rows, and the device pieces both main kernels call: the logit's derivative,
// P and dS of one score, the fp32 dQ adds and deterministic mode's key-block order.
// cuda_mma's main kernel (mma.sync) is backward_kernel.cuh, cuda_sm90's (wgmma)
// 04_sm90/backward_kernel.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attn/block_range.hpp"
#include "attn/features.hpp"
#include "attn/seqlen.hpp"
#include "attn/variant.hpp"
#include "cuda/03_mma/pieces.cuh"
#include "cuda/03_mma/tile_io.cuh"
#include "cuda/common.cuh"
#include "cuda/mma_fragment.cuh"
#include "cuda/ptx/mma.cuh"
#include "cuda/workspace_pool.hpp"

namespace flashtile::detail::mma {

// Where the backward's scratch lives in its one workspace allocation (bytes from its start).
struct BackwardWorkspace {
  int64_t d_offset = 0, d_floats = 0;              // D, indexed as the LSE
  int64_t dq_offset = 0, dq_floats = 0;            // fp32 dQ accumulator
  ViewStrides dq_strides;                          // its (batch, row, head) strides
  int64_t sink_offset = 0, sink_floats = 0;        // the sinks' partials
  int64_t sink_blocks = 0;                         // partials per (batch, head)
  int64_t counter_offset = 0, counter_count = 0;   // deterministic mode's counters
  int64_t query_blocks = 0;                        // counters per (batch, head)
  int64_t bytes = 0;
};

// Rows of the pre-pass's block (the sinks' partials are per such block).
inline constexpr int kRowsumBlockRows = 64;

inline int64_t align_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

inline BackwardWorkspace backward_workspace(const BackwardParams& bp, int head_dim_spec,
                                            int block_m) {
  const AttentionParams& p = bp.fwd;
  BackwardWorkspace w;
  const int64_t rows = p.is_varlen() ? p.total_q : p.batch * p.seqlen_q;  // rows of q
  w.d_floats = p.is_varlen() ? p.heads_q * p.total_q : p.batch * p.lse_batch_stride;
  w.dq_strides.head = head_dim_spec;
  w.dq_strides.row = p.heads_q * head_dim_spec;
  w.dq_strides.batch = p.is_varlen() ? 0 : p.seqlen_q * w.dq_strides.row;
  w.dq_floats = rows * w.dq_strides.row;
  w.sink_blocks = (p.seqlen_q + kRowsumBlockRows - 1) / kRowsumBlockRows;
  w.sink_floats = p.sinks != nullptr ? p.batch * p.heads_q * w.sink_blocks : 0;
  w.query_blocks = (p.seqlen_q + block_m - 1) / block_m;
  w.counter_count = bp.deterministic ? p.batch * p.heads_q * w.query_blocks : 0;
  int64_t at = 0;
  w.d_offset = at, at = align_up(at + 4 * w.d_floats, 256);
  w.dq_offset = at, at = align_up(at + 4 * w.dq_floats, 256);
  w.sink_offset = at, at = align_up(at + 4 * w.sink_floats, 256);
  w.counter_offset = at, at = align_up(at + 4 * w.counter_count, 256);
  w.bytes = at;
  return w;
}

// What the kernels read of the workspace.
struct BackwardScratch {
  float* d = nullptr;
  float* dq = nullptr;
  int64_t dq_floats = 0;
  ViewStrides dq_strides;
  float* sink_partials = nullptr;
  int sink_blocks = 0;
  int* counters = nullptr;
  int query_blocks = 0;
};

// ---- pass 1: D = rowsum(dO ∘ O), the sinks' partials -----------------------------------

template <class T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x);
  else
    return __half2float(x);
}

// Whether O's and dO's rows are whole, aligned 16-byte chunks of a count that divides a warp:
// then the pre-pass reads them with 16-byte loads (rowsum_chunks), else element by element.
inline int rowsum_chunks(const BackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  const int64_t chunks = p.head_dim / 8;
  if (p.head_dim % 8 != 0 || chunks > 32 || (chunks & (chunks - 1)) != 0) return 0;
  const ViewStrides& ds = bp.dout_strides;
  if (access_granule(p.o, p.o_batch_stride, p.o_row_stride, p.o_head_stride) != 8 ||
      access_granule(bp.dout, ds.batch, ds.row, ds.head) != 8)
    return 0;
  return static_cast<int>(chunks);
}

template <class T>
__device__ __forceinline__ float dot_chunk(const T* a, const T* b) {
  const uint4 va = *reinterpret_cast<const uint4*>(a), vb = *reinterpret_cast<const uint4*>(b);
  const T* ea = reinterpret_cast<const T*>(&va);
  const T* eb = reinterpret_cast<const T*>(&vb);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) sum += to_float(ea[i]) * to_float(eb[i]);
  return sum;
}

// Grid (row blocks of kRowsumBlockRows, heads_q, batch), 256 threads. chunks = 0: one warp
// per row at a time, lanes across the head dim (coalesced for any stride, elements of any
// alignment); else (rowsum_chunks) a lane reads one 16-byte chunk of a row, a warp 32 / chunks
// rows at once. Each CTA also zeroes its slice of the dQ accumulator, which the main kernel
// adds to (one pass over memory instead of a memset beside this one).
template <class T>
__global__ void __launch_bounds__(256) backward_rowsum_kernel(const BackwardParams bp,
                                                              const BackwardScratch ws,
                                                              int chunks) {
  const AttentionParams& p = bp.fwd;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  {
    const int64_t cta = (b * gridDim.y + h) * gridDim.x + blockIdx.x;
    const int64_t ctas = int64_t(gridDim.x) * gridDim.y * gridDim.z;
    const int64_t per = (ws.dq_floats / 4 + ctas - 1) / ctas * 4;  // whole float4s a CTA
    const int64_t begin = cta * per, end = min(begin + per, ws.dq_floats);
    for (int64_t i = begin + 4 * threadIdx.x; i < end; i += 4 * 256) {
      if (i + 4 <= end)
        *reinterpret_cast<float4*>(ws.dq + i) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      else
        for (int64_t j = i; j < end; ++j) ws.dq[j] = 0.0f;
    }
  }
  const SeqlenInfo<int> seq(p, b);
  const int row0 = blockIdx.x * kRowsumBlockRows;
  const float sink = sink_logit<float>(p, h);
  // Lanes that own a row: their rows' −exp(σ − lse)·D, in row order.
  float sink_sum = 0.0f;
  auto finish_row = [&](int row, float sum) {
    const int64_t at = seq.lse_index(p, b, h, row);
    // A gradient g into the LSE adds g·P to dS: D' = D − g serves for D, here and in the
    // sinks' partials (docs/BACKWARD.md).
    if (bp.dlse != nullptr) sum -= bp.dlse[at];
    ws.d[at] = sum;
    const float lse = p.lse[at];
    if (p.sinks != nullptr && lse != -INFINITY) sink_sum -= expf(sink - lse) * sum;
  };
  const T* const dout_base = static_cast<const T*>(bp.dout);
  const T* const out_base = static_cast<const T*>(p.o);
  if (chunks == 0) {
    for (int r = warp; r < kRowsumBlockRows; r += 8) {
      const int row = row0 + r;
      if (row >= seq.seqlen_q) break;
      const T* dout = dout_base + seq.row_offset_q(bp.dout_strides, b, row, h);
      const T* out = out_base + seq.o_offset(p, b, row, h);
      float sum = 0.0f;
      for (int c = lane; c < p.head_dim; c += 32) sum += to_float(dout[c]) * to_float(out[c]);
#pragma unroll
      for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      if (lane == 0) finish_row(row, sum);
    }
  } else {
    const int rows_at_once = 32 / chunks, chunk = lane % chunks;
    for (int r = warp * rows_at_once; r < kRowsumBlockRows; r += 8 * rows_at_once) {
      const int row = row0 + r + lane / chunks;
      const bool valid = row < seq.seqlen_q;
      float sum = 0.0f;
      if (valid)
        sum = dot_chunk(dout_base + seq.row_offset_q(bp.dout_strides, b, row, h) + 8 * chunk,
                        out_base + seq.o_offset(p, b, row, h) + 8 * chunk);
      for (int off = chunks / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      if (valid && chunk == 0) finish_row(row, sum);
    }
  }
  if (p.sinks == nullptr) return;
  // The row owners' partials to lane 0 (a fixed tree: deterministic), then the warps' in order.
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sink_sum += __shfl_xor_sync(0xffffffffu, sink_sum, off);
  __shared__ float warp_sums[8];
  if (lane == 0) warp_sums[warp] = sink_sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < 8; ++w) total += warp_sums[w];  // fixed order: deterministic
    ws.sink_partials[(b * p.heads_q + h) * ws.sink_blocks + blockIdx.x] = total;
  }
}

// dsinks[h] = the partials of head h summed over batch entries and blocks, in order.
// (A template, as every kernel of this header, so that each TU's copy is a weak symbol.)
template <class T>
__global__ void backward_dsinks_kernel(const BackwardParams bp, const BackwardScratch ws) {
  const AttentionParams& p = bp.fwd;
  for (int64_t h = blockIdx.x * blockDim.x + threadIdx.x; h < p.heads_q; h += blockDim.x) {
    float total = 0.0f;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int x = 0; x < ws.sink_blocks; ++x)
        total += ws.sink_partials[(b * p.heads_q + h) * ws.sink_blocks + x];
    bp.dsinks[h] = total;
  }
}

// ---- pass 2's shared pieces: one score's P and dS, the dQ adds --------------------------

// The logit of raw score qk and d logit / d qk, under Logits (as the forward's
// transformed_logit in mma_fragment.cuh, keeping the capped value the chain rule needs).
template <class Logits>
__device__ __forceinline__ float logit_and_derivative(const LogitsTransform<float>& transform,
                                                      float qk, const Mask<int>& mask, int i,
                                                      int j, float& derivative) {
  if constexpr (is_runtime_logits_v<Logits>) {
    const bool capped = transform.softcap != 0.0f;
    const float c = capped ? transform.scaled<true>(qk) : transform.scaled<false>(qk);
    derivative = capped ? transform.scaled_derivative<true>(c) : transform.scaled_derivative<false>(c);
    return transform.slope != 0.0f ? c + transform.alibi_bias(mask, i, j) : c;
  } else {
    const float c = transform.template scaled<Logits::kSoftcap>(qk, ptx::TanhApprox{});
    derivative = transform.template scaled_derivative<Logits::kSoftcap>(c);
    if constexpr (Logits::kAlibi) return c + transform.alibi_bias(mask, i, j);
    return c;
  }
}

// Adds v to the two fp32 at `to` (8-byte aligned): one vector reduction on sm_90 (one
// instruction where scalar adds take two), two atomics before it. Either way each element
// gets one add, so deterministic mode's fixed order is unchanged.
__device__ __forceinline__ void atomic_add_pair(float* to, float2 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};" ::"l"(to), "f"(v.x), "f"(v.y)
               : "memory");
#else
  atomicAdd(to, v.x);
  atomicAdd(to + 1, v.y);
#endif
}

// One score's probability and gradient in two halves, for kernels that read P before dP has
// landed. probability(): x holds the raw score q·k of query row `row` and key `key`; returns
// P and leaves in x the factor dS needs, P·∂logit/∂qk (plain logits: P, their uniform scale
// applied by ds()). lse_log2 is the row's lse·log2e (+inf for rows that see nothing);
// scale_log2 is scale·log2e (plain logits fold the scale into the exp2). kMasked: keys the
// mask hides get P = 0 (kernels take the unmasked copy off the mask's edges).
template <class Logits, bool kMasked>
__device__ __forceinline__ float probability(const LogitsTransform<float>& logits,
                                             const Mask<int>& mask, float scale_log2,
                                             float lse_log2, int row, int key, float& x) {
  constexpr float kLog2e = 1.4426950408889634f;
  float prob;
  float derivative = 1.0f;
  if constexpr (Logits::kPlain) {
    prob = ptx::exp2_approx(fmaf(x, scale_log2, -lse_log2));
  } else {
    const float logit = logit_and_derivative<Logits>(logits, x, mask, row, key, derivative);
    prob = ptx::exp2_approx(fmaf(logit, kLog2e, -lse_log2));
  }
  if constexpr (kMasked) {
    if (!mask.visible(row, key)) prob = 0.0f;
  }
  x = Logits::kPlain ? prob : prob * derivative;
  return prob;
}
// dS = P·(dP − D)·∂logit/∂qk from probability()'s factor and dp = dP − D.
template <class Logits>
__device__ __forceinline__ float ds(const LogitsTransform<float>& logits, float factor, float dp) {
  if constexpr (Logits::kPlain) return factor * dp * logits.scale;
  return factor * dp;
}
// Both halves in place: x becomes P, dp (dP − D) becomes dS.
template <class Logits, bool kMasked>
__device__ __forceinline__ void probability_and_ds(const LogitsTransform<float>& logits,
                                                   const Mask<int>& mask, float scale_log2,
                                                   float lse_log2, int row, int key, float& x,
                                                   float& dp) {
  const float prob = probability<Logits, kMasked>(logits, mask, scale_log2, lse_log2, row, key, x);
  dp = ds<Logits>(logits, x, dp);
  x = prob;
}

// Query row `row`'s stats: lse·log2e and D, left as given (the callers' +inf and 0) for
// rows past seqlen_q and rows that see nothing (lse = −inf), so that their P is 0.
__device__ __forceinline__ void row_stats(const BackwardParams& bp, const BackwardScratch& ws,
                                          const SeqlenInfo<int>& seq, int64_t b, int64_t h, int row,
                                          float& lse_log2, float& d_row) {
  constexpr float kLog2e = 1.4426950408889634f;
  if (row < seq.seqlen_q) {
    const int64_t at = seq.lse_index(bp.fwd, b, h, row);
    const float lse = bp.fwd.lse[at];
    if (lse != -INFINITY) lse_log2 = lse * kLog2e;
    d_row = ws.d[at];
  }
}
// This thread's row of the query block at row0 (threads < block_m, a row each).
__device__ __forceinline__ void fetch_row_stats(const BackwardParams& bp, const BackwardScratch& ws,
                                                const SeqlenInfo<int>& seq, int64_t b, int64_t h,
                                                int row0, int block_m, float& lse_log2,
                                                float& d_row) {
  if (threadIdx.x < block_m)
    row_stats(bp, ws, seq, b, h, row0 + static_cast<int>(threadIdx.x), lse_log2, d_row);
}
// Stores them into stage s % 2 of the (2, block_m) shared arrays.
__device__ __forceinline__ void stage_row_stats(float* smem_lse, float* smem_d, int block_m, int s,
                                                float lse_log2, float d_row) {
  if (threadIdx.x < block_m) {
    smem_lse[(s % 2) * block_m + threadIdx.x] = lse_log2;
    smem_d[(s % 2) * block_m + threadIdx.x] = d_row;
  }
}

// Deterministic mode: the key blocks that visit a query block add their dQ in key-block
// order. They are the contiguous range key_blocks() names, and lower key blocks are launched
// first (x is the grid's fastest index), so waiting on them cannot deadlock. A CTA's turn at
// query block m_block comes when its counter reaches `before`, the key blocks ahead of it.
struct DqTurn {
  int* counter = nullptr;
  int before = 0;
  // One thread: spins until the key blocks ahead have passed.
  __device__ __forceinline__ void wait() const {
    while (ptx::load_acquire_gpu(counter) != before) {
    }
  }
};
// One thread, once the caller's adds are performed: the next key block's turn.
__device__ __forceinline__ void pass_turn(int* counter) {
  __threadfence();  // the adds are visible before the next key block may start its own
  atomicAdd(counter, 1);
}
// n_block: the caller's key block (key blocks take their turns in this order).
__device__ __forceinline__ DqTurn dq_turn(const BackwardParams& bp, const BackwardScratch& ws,
                                          const SeqlenInfo<int>& seq, const Mask<int>& mask,
                                          int64_t b, int64_t h, int m_block, int n_block,
                                          int block_m, int block_n) {
  const int row0 = m_block * block_m;
  return {ws.counters + (b * bp.fwd.heads_q + h) * ws.query_blocks + m_block,
          n_block - key_blocks(mask, row0, min(row0 + block_m, seq.seqlen_q), block_n).begin};
}
// Every thread of the CTA calls both (the counter is null when the mode is off).
__device__ __forceinline__ int* wait_for_dq_turn(const BackwardParams& bp, const BackwardScratch& ws,
                                                 const SeqlenInfo<int>& seq, const Mask<int>& mask,
                                                 int64_t b, int64_t h, int m_block, int block_m,
                                                 int block_n) {
  if (!bp.deterministic) return nullptr;
  const DqTurn turn =
      dq_turn(bp, ws, seq, mask, b, h, m_block, static_cast<int>(blockIdx.x), block_m, block_n);
  if (threadIdx.x == 0) turn.wait();
  __syncthreads();
  return turn.counter;
}
__device__ __forceinline__ void pass_dq_turn(const BackwardParams& bp, int* counter) {
  if (!bp.deterministic) return;
  __syncthreads();  // every thread's adds are issued
  if (threadIdx.x == 0) pass_turn(counter);
}

// ---- pass 3: dQ to q's dtype --------------------------------------------------------------

// Grid (row blocks of 256 / (chunks per row) rows, heads_q, batch): one thread per 8
// columns of one row, 16-byte stores when dq allows them.
template <class T>
__global__ void __launch_bounds__(256) backward_dq_kernel(const BackwardParams bp,
                                                          const BackwardScratch ws,
                                                          int rows_per_block) {
  const AttentionParams& p = bp.fwd;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const SeqlenInfo<int> seq(p, b);
  const int head_dim = static_cast<int>(p.head_dim);
  const int chunks = (head_dim + 7) / 8;
  const int row = blockIdx.x * rows_per_block + static_cast<int>(threadIdx.x) / chunks;
  const int chunk = static_cast<int>(threadIdx.x) % chunks;
  if (static_cast<int>(threadIdx.x) >= rows_per_block * chunks || row >= seq.seqlen_q) return;
  const float* acc = ws.dq + seq.row_offset_q(ws.dq_strides, b, row, h) + chunk * 8;
  const float4 lo = *reinterpret_cast<const float4*>(acc);
  const float4 hi = *reinterpret_cast<const float4*>(acc + 4);
  const uint4 value = make_uint4(ptx::pack2<T>(lo.x, lo.y), ptx::pack2<T>(lo.z, lo.w),
                                 ptx::pack2<T>(hi.x, hi.y), ptx::pack2<T>(hi.z, hi.w));
  T* to = static_cast<T*>(bp.dq) + seq.row_offset_q(bp.dq_strides, b, row, h) + chunk * 8;
  const int granule = access_granule(bp.dq, bp.dq_strides.batch, bp.dq_strides.row,
                                     bp.dq_strides.head);
  store_chunk_narrow(reinterpret_cast<uint16_t*>(to), value, chunk_elements(chunk, head_dim),
                     granule);
}

// Writes zeros to every row of a k-shaped gradient (varlen: keys outside every sequence's
// used keys get no other write). Grid-stride over (row, head) pairs, element by element.
template <class T>
__global__ void zero_rows_kernel(T* grad, ViewStrides strides, int64_t batch, int64_t rows,
                                 int64_t heads, int64_t head_dim) {
  const int64_t pairs = batch * rows * heads;
  for (int64_t i = blockIdx.x * int64_t(blockDim.y) + threadIdx.y; i < pairs;
       i += int64_t(gridDim.x) * blockDim.y) {
    const int64_t hh = i % heads, r = (i / heads) % rows, bb = i / (heads * rows);
    T* row = grad + bb * strides.batch + r * strides.row + hh * strides.head;
    for (int64_t c = threadIdx.x; c < head_dim; c += blockDim.x) row[c] = T(0.0f);
  }
}

// Whether the aligned path serves bp: the forward's condition plus dout, dk and dv.
inline bool backward_rows_aligned_16(const BackwardParams& bp) {
  auto aligned = [](const void* data, const ViewStrides& s) {
    return access_granule(data, s.batch, s.row, s.head) == 8;
  };
  return rows_aligned_16(bp.fwd) && aligned(bp.dout, bp.dout_strides) &&
         aligned(bp.dk, bp.dk_strides) && aligned(bp.dv, bp.dv_strides);
}

// The whole backward, the workspace at `workspace` laid out by backward_workspace(bp,
// head_dim_spec, block_m) (the main kernel's padded head dim and query rows a step):
// run_main(ws) launches the main kernel between the pre-pass and the post-pass.
template <class T, class RunMain>
void run_backward_passes(const BackwardParams& bp, void* workspace, cudaStream_t stream,
                         int head_dim_spec, int block_m, RunMain&& run_main) {
  const AttentionParams& p = bp.fwd;
  const BackwardWorkspace layout = backward_workspace(bp, head_dim_spec, block_m);
  auto* base = static_cast<unsigned char*>(workspace);
  BackwardScratch ws;
  ws.d = reinterpret_cast<float*>(base + layout.d_offset);
  ws.dq = reinterpret_cast<float*>(base + layout.dq_offset);
  ws.dq_floats = layout.dq_floats;
  ws.dq_strides = layout.dq_strides;
  ws.sink_partials = reinterpret_cast<float*>(base + layout.sink_offset);
  ws.sink_blocks = static_cast<int>(layout.sink_blocks);
  ws.counters = reinterpret_cast<int*>(base + layout.counter_offset);
  ws.query_blocks = static_cast<int>(layout.query_blocks);

  if (layout.counter_count > 0)
    check_cuda(cudaMemsetAsync(ws.counters, 0, size_t(layout.counter_count) * 4, stream),
               "cudaMemsetAsync(counters)");
  if (p.is_varlen()) {
    const dim3 block(32, 8);
    const unsigned zero_blocks = 1024;
    zero_rows_kernel<T><<<zero_blocks, block, 0, stream>>>(static_cast<T*>(bp.dk), bp.dk_strides,
                                                           1, p.total_k, p.heads_kv, p.head_dim);
    zero_rows_kernel<T><<<zero_blocks, block, 0, stream>>>(static_cast<T*>(bp.dv), bp.dv_strides,
                                                           1, p.total_k, p.heads_kv, p.head_dim);
    check_launch("zero_rows_kernel");
  }
  const unsigned heads = static_cast<unsigned>(p.heads_q), batch = static_cast<unsigned>(p.batch);
  const dim3 rowsum_grid(static_cast<unsigned>(layout.sink_blocks), heads, batch);
  if (p.seqlen_q > 0) {  // zeroes dQ's accumulator too (without query rows it has none)
    backward_rowsum_kernel<T><<<rowsum_grid, 256, 0, stream>>>(bp, ws, rowsum_chunks(bp));
    check_launch("backward_rowsum_kernel");
  }
  if (p.seqlen_k > 0) run_main(static_cast<const BackwardScratch&>(ws));
  if (p.seqlen_q > 0) {
    const int chunks = static_cast<int>((p.head_dim + 7) / 8);
    const int rows_per_block = 256 / chunks;
    const dim3 dq_grid(static_cast<unsigned>((p.seqlen_q + rows_per_block - 1) / rows_per_block),
                       heads, batch);
    backward_dq_kernel<T><<<dq_grid, 256, 0, stream>>>(bp, ws, rows_per_block);
    check_launch("backward_dq_kernel");
  }
  if (bp.dsinks != nullptr) {
    backward_dsinks_kernel<T><<<1, 256, 0, stream>>>(bp, ws);
    check_launch("backward_dsinks_kernel");
  }
}

// The main kernels' grid: (key blocks of Cfg::kBlockN keys, kv heads, batch entries).
template <class Cfg>
dim3 backward_grid(const AttentionParams& p) {
  return dim3(static_cast<unsigned>((p.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN),
              static_cast<unsigned>(p.heads_kv), static_cast<unsigned>(p.batch));
}

// Launches a main kernel, kernel(bp, ws, extra...), over (key blocks of Cfg::kBlockN keys,
// kv heads, batch entries) with Cfg::kThreads threads and Cfg::kSmemBytes of shared memory a
// CTA.
template <class Cfg, class Kernel, class... Extra>
void launch_backward_main(Kernel* kernel, const char* name, const BackwardParams& bp,
                          const BackwardScratch& ws, cudaStream_t stream, const Extra&... extra) {
  const AttentionParams& p = bp.fwd;
  raise_smem_limit_once(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes, p.device_index);
  const dim3 grid = backward_grid<Cfg>(p);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(bp, ws, extra...);
  check_launch(name);
}

// Runs fn(workspace) with `bytes` of stream-ordered scratch from device's workspace pool
// (which keeps it for the next call, synchronised or not), freed after the passes that read
// it, and when fn throws.
template <class Fn>
void with_backward_workspace(int64_t bytes, int device, cudaStream_t stream, Fn&& fn) {
  void* workspace = bytes > 0 ? allocate_workspace(size_t(bytes), device, stream) : nullptr;
  try {
    fn(workspace);
  } catch (...) {
    if (workspace != nullptr) cudaFreeAsync(workspace, stream);
    throw;
  }
  if (workspace != nullptr)
    check_cuda(cudaFreeAsync(workspace, stream), "cudaFreeAsync(workspace)");
}

}  // namespace flashtile::detail::mma
