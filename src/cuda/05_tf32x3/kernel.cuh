// Journey step 2b — cuda_tf32x3: fp32 attention on the tensor cores, exact to fp32's rule
// (normwise relative error <= 1e-5 against the double oracle), sm_80+.
//
// What changed from step 2 (src/cuda/02_tiled.cu, fp32 on the FMA pipe): both products run
// on mma.sync.m16n8k8 with tf32 operands and fp32 accumulators. A tf32 operand keeps 10 of
// fp32's 23 mantissa bits, so each operand x is split into big = tf32(x) and
// small = tf32(x - big) (ptx/tf32.cuh) and each product is taken as
//   small·big + big·small + big·big
// (the 3xTF32 scheme: Ootomo & Yokota, "Recovering single precision accuracy from Tensor
// Cores while surpassing the FP32 theoretical peak performance", IJHPCA 2022; the dropped
// small·small term is ~2^-22 relative). The tensor cores' accumulator rounds toward zero, so
// the correction products get accumulators of their own and every tensor-core sum is short
// (S over the head dim, P·V over one key tile) before it joins an fp32 round-to-nearest add:
// accumulating O over all keys on the tensor cores gave 8.7e-4 at N = 131072. Both
// S = Q·Kᵀ and O += P·V are split; P is split after its exp. FLASHTILE_TF32X3_MODE=single
// (backend.cu) keeps only big·big: plain TF32, an opt-in whose error (2.3e-4..3.3e-4) is
// recorded in docs/JOURNEY.md.
//
// Measured (H200, docs/JOURNEY.md step 2b, second session): 33.6-42.2 TFLOP/s of fp32 work
// on the field grid (fp32, 16k tokens, d 64/128), 28-35% of the 119 TFLOP/s that 3 tf32
// products per fp32 one leave of the 356 TFLOP/s ceiling, 0.86-1.18x SDPA's memory-efficient
// kernel in the same run; the write-up's case 27.9-29.6 us with 16 key splits, of which the
// host's submission shows ~6 us and the combine kernel ~7 us.
//
// Layout: Q, K and V tiles are fp32 rows in shared memory (pitches in Tf32Config make every
// fragment read conflict-free). Each tile is split once per CTA where it lands, into a big
// and a small plane (for Q once per CTA, for K and V once per tile), so fragments are plain
// shared loads. In Q·Kᵀ dim 2t of each 8-dim k-step is k-index t and 2t + 1 is t + 4, so a
// lane's two A (or B) values of a row are one 8-byte load. The S accumulator's row pairs
// (columns 2t, 2t+1) feed P·V's A operand directly the same way (key 2t as k-index t, 2t + 1
// as t + 4), V's B fragment reading the same two keys: no shuffles.
//
// On the feature core, as cuda_mma: key tiles from key_blocks(), the mask only on
// needs_mask() tiles, LogitsTransform::apply with the precise tanh, sinks and the NaN rule at
// finalisation, SeqlenInfo for every offset and LSE index, heaviest query blocks first.
//
// Split-KV: with splits > 1 each tile's key blocks are cut by split_key_blocks() and the
// CTA (blockIdx.x = query block · splits + split) writes a normalised partial and its LSE to
// the workspace; split_kv_combine.cuh merges them.
#pragma once

#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attn/block_range.hpp"
#include "attn/features.hpp"
#include "attn/seqlen.hpp"
#include "attn/softmax_state.hpp"
#include "attn/split_kv.hpp"
#include "attn/variant.hpp"
#include "cuda/common.cuh"
#include "cuda/mma_fragment.cuh"
#include "cuda/ptx/mma.cuh"
#include "cuda/ptx/tf32.cuh"
#include "cuda/split_kv_combine.cuh"

namespace flashtile::detail::tf32x3 {

// How many TF32 products make one fp32 product.
enum class Precision { split3, single };

// One kernel configuration (traits below pick one per head dim).
//   kHeadDim: specialised head dim (smaller dims run zero-padded), kBlockM query rows per
//   CTA, kBlockN keys per K/V tile, kNWarps warps (16 · kMTiles rows each), kStages deep
//   cp.async ring, kMinBlocks CTAs per SM asked of the register allocator.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kStages_, int kMinBlocks_>
struct Tf32Config {
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_, kStages = kStages_, kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kWarpRows = kBlockM / kNWarps;
  static constexpr int kMTiles = kWarpRows / 16;  // 16-row mma tiles per warp
  static constexpr int kNTiles = kBlockN / 8;     // 8-key n-tiles of S
  static constexpr int kKSteps = kHeadDim / 8;    // 8-wide k-steps of Q·Kᵀ
  static constexpr int kDTiles = kHeadDim / 8;    // 8-column tiles of O
  static constexpr int kPvSteps = kBlockN / 8;    // 8-key k-steps of P·V
  // Floats per shared row. Q and K fragments are read as 8-byte pairs (columns 2t, 2t+1 of
  // row g): a pitch of 8 mod 32 puts a half-warp's pairs in 32 distinct banks. V fragments
  // are single floats of rows 2t, 2t+1 and column g: 4 mod 32 does the same for them.
  static constexpr int kQkPitch = kHeadDim + 8;
  static constexpr int kVPitch = kHeadDim + 4;
  static constexpr int kChunks = kHeadDim / 4;  // 16-byte chunks per row
  static constexpr int kQPlaneFloats = kBlockM * kQkPitch;  // one Q plane
  static constexpr int kKPlaneFloats = kBlockN * kQkPitch;  // one K plane
  static constexpr int kVPlaneFloats = kBlockN * kVPitch;   // one V plane
  static constexpr int kStageFloats = 2 * kKPlaneFloats + 2 * kVPlaneFloats;
  // [ Q big (kBlockM, kQkPitch) | Q small | stage 0: K big (kBlockN, kQkPitch), K small,
  //   V big (kBlockN, kVPitch), V small | stage 1 ... ]
  static constexpr int kSmemBytes =
      (2 * kQPlaneFloats + kStages * kStageFloats) * int(sizeof(float));

  static_assert(kHeadDim % 8 == 0, "head dim: whole 8-wide k-steps and d-tiles");
  static_assert(kQkPitch % 32 == 8 && kVPitch % 32 == 4,
                "the pitches make fragment reads conflict-free");
  static_assert(kQPlaneFloats % 4 == 0 && kKPlaneFloats % 4 == 0 && kVPlaneFloats % 4 == 0,
                "planes start on 16 bytes (cp.async, float4 splits)");
  static_assert(kBlockM % kNWarps == 0 && kWarpRows % 16 == 0,
                "each warp owns a whole number of 16-row mma tiles");
  static_assert(kBlockN % 8 == 0, "K/V tiles hold whole 8-key n-tiles");
  static_assert(kStages >= 2, "the cp.async ring needs at least two stages");
  static_assert(kBlockM % 4 == 0, "the split-KV combine takes rows four at a time");
};

// The narrow layouts' one kernel: softcap and ALiBi read at run time (mma_fragment.cuh).
struct RuntimeLogits : RuntimeLogitsTag {};

// Whether every row of q, k, v and out starts on 16 bytes and head_dim is whole 16-byte
// chunks: then tiles move with 16-byte cp.async, else with 4-byte loads.
inline bool rows_aligned_16(const AttentionParams& p) {
  auto aligned = [](const void* data, int64_t batch, int64_t row, int64_t head) {
    return (reinterpret_cast<uintptr_t>(data) % 16 == 0) && batch % 4 == 0 && row % 4 == 0 &&
           head % 4 == 0;
  };
  return p.head_dim % 4 == 0 && aligned(p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride) &&
         aligned(p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride) &&
         aligned(p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride) &&
         aligned(p.o, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
}

// Rows [0, kRows) of a strided fp32 tensor (row 0 at src) into a shared tile of pitch
// kPitch; rows >= valid_rows and columns >= head_dim are zero, so padding never brings
// garbage (0·NaN) into the products. kAligned: 16-byte cp.async, else synchronous loads.
//
// 16-byte chunks: thread i takes chunk i % kChunks of rows i / kChunks + r · kPassRows, a
// fixed number of passes known at compile time, so the loop unrolls into one pointer bump
// per pass (a loop over i up to the tile's chunks did not: its unknown trip count cost ~300
// integer instructions per K/V tile in the main loop, SASS of commit f934e2d).
template <class Cfg>
struct ChunkPasses {
  static constexpr int kChunks = Cfg::kChunks;                // 16-byte chunks per row
  static constexpr int kPassRows = Cfg::kThreads / kChunks;   // rows per pass of the CTA
  static_assert(Cfg::kThreads % kChunks == 0, "a pass of the CTA covers whole rows");
  template <int kRows>
  static constexpr int passes() {
    static_assert(kRows % kPassRows == 0, "the passes cover the tile's rows exactly");
    return kRows / kPassRows;
  }
};

template <class Cfg, int kRows, int kPitch, bool kAligned>
__device__ __forceinline__ void load_tile(float* tile, const float* src, int64_t row_stride,
                                          int valid_rows, int head_dim) {
  if constexpr (kAligned) {
    using Passes = ChunkPasses<Cfg>;
    constexpr int kPassRows = Passes::kPassRows;
    const int row0 = threadIdx.x / Passes::kChunks, col = (threadIdx.x % Passes::kChunks) * 4;
    const bool col_ok = col < head_dim;  // head_dim is whole chunks on this path
    const uint32_t to = ptx::smem_addr(tile + row0 * kPitch + col);
    const float* from = src + row0 * row_stride + col;
    const int64_t pass_stride = kPassRows * row_stride;
#pragma unroll
    for (int pass = 0; pass < Passes::template passes<kRows>(); ++pass) {
      const bool ok = col_ok && row0 + pass * kPassRows < valid_rows;
      ptx::cp_async_16(to + pass * kPassRows * kPitch * 4, ok ? from : src, ok);
      from += pass_stride;
    }
  } else {
    for (int i = threadIdx.x; i < kRows * Cfg::kHeadDim; i += Cfg::kThreads) {
      const int row = i / Cfg::kHeadDim, col = i % Cfg::kHeadDim;
      tile[row * kPitch + col] =
          row < valid_rows && col < head_dim ? src[row * row_stride + col] : 0.0f;
    }
  }
}

// The 3xTF32 split of N values: the finite-only rounding when all N are finite (the same
// bits as split_tf32 there), behind one test; a group that meets an Inf or a NaN takes
// split_tf32. One test over a whole fragment or a thread's chunks keeps the rare branch out
// of the straight-line code, which a one-tile CTA executes once, i-cache cold (2c.5).
template <int N>
__device__ __forceinline__ void split_tf32x3(const float (&x)[N], uint32_t (&big)[N],
                                             uint32_t (&small)[N]) {
  bool finite = ptx::all_finite(x[0]);
#pragma unroll
  for (int e = 1; e < N; ++e) finite = finite & ptx::all_finite(x[e]);
  if (finite) {
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const ptx::Tf32Split parts = ptx::split_tf32_finite(x[e]);
      big[e] = parts.big, small[e] = parts.small;
    }
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const ptx::Tf32Split parts = ptx::split_tf32(x[e]);
      big[e] = parts.big, small[e] = parts.small;
    }
  }
}
// An array of arrays seen as one flat array (the same registers), for split_tf32x3.
template <class T, int M, int N>
__device__ __forceinline__ T (&flat(T (&a)[M][N]))[M * N] {
  return *reinterpret_cast<T(*)[M * N]>(&a[0][0]);
}
// A 16-byte chunk of a tile, or a P fragment.
__device__ __forceinline__ void split4(const float (&x)[4], uint32_t (&big)[4],
                                       uint32_t (&small)[4]) {
  split_tf32x3<4>(x, big, small);
}

// Splits the raw fp32 rows of a shared tile (loaded into `big`, pitch kPitch) in place: big
// keeps tf32(x), small takes tf32(x - big) (3xTF32 only). Each 16-byte chunk is one
// thread's (on the aligned path the very chunks load_tile gave it), so no thread reads what
// another writes; the caller synchronises around it.
template <class Cfg, int kRows, int kPitch, bool kSplit3>
__device__ __forceinline__ void split_tile(float* big, float* small) {
  using Passes = ChunkPasses<Cfg>;
  const int at0 = (threadIdx.x / Passes::kChunks) * kPitch + (threadIdx.x % Passes::kChunks) * 4;
#pragma unroll
  for (int pass = 0; pass < Passes::template passes<kRows>(); ++pass) {
    const int at = at0 + pass * Passes::kPassRows * kPitch;
    const float4 x4 = *reinterpret_cast<const float4*>(big + at);
    const float x[4] = {x4.x, x4.y, x4.z, x4.w};
    uint4 big4, small4;
    if constexpr (kSplit3) {
      uint32_t b[4], s[4];
      split4(x, b, s);
      big4 = make_uint4(b[0], b[1], b[2], b[3]), small4 = make_uint4(s[0], s[1], s[2], s[3]);
      *reinterpret_cast<uint4*>(small + at) = small4;
    } else {
      big4 = make_uint4(ptx::to_tf32(x[0]), ptx::to_tf32(x[1]), ptx::to_tf32(x[2]),
                        ptx::to_tf32(x[3]));
    }
    *reinterpret_cast<uint4*>(big + at) = big4;
  }
}

// The kernel's view of a split forward: 1 split writes out and lse directly.
struct SplitArgs {
  int splits = 1;
  SplitPartials partials;  // used when splits > 1
  // The split CTAs merge their partials themselves, after a grid barrier, instead of a
  // combine kernel (only tf32x3_sm90_overlap_kernel, launched cooperatively: 2c.5).
  bool merge_in_grid = false;
};

template <class Cfg, class Logits, bool kAligned, Precision kPrecision>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    tf32x3_forward_kernel(const AttentionParams p, const SplitArgs split_args) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kMTiles = Cfg::kMTiles, kNTiles = Cfg::kNTiles, kKSteps = Cfg::kKSteps;
  constexpr int kDTiles = Cfg::kDTiles, kPvSteps = Cfg::kPvSteps;
  constexpr int kQkPitch = Cfg::kQkPitch, kVPitch = Cfg::kVPitch;
  constexpr bool kSplit3 = kPrecision == Precision::split3;
  constexpr float kLog2e = 1.4426950408889634f;

  extern __shared__ __align__(128) float smem[];
  float* q_big = smem;                        // (kBlockM, kQkPitch)
  float* q_small = smem + Cfg::kQPlaneFloats;  // (kBlockM, kQkPitch)
  float* kv_ring = smem + 2 * Cfg::kQPlaneFloats;

  // The split-KV combine (a programmatic dependent launch on sm_90) may be scheduled once
  // every CTA of this grid has started; it still waits for the whole grid to finish.
  allow_dependent_launch();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int splits = split_args.splits;
  const int split = blockIdx.x % splits;
  const int query_blocks = gridDim.x / splits;
  const int64_t h = blockIdx.y, b = blockIdx.z, hk = h / p.heads_per_kv();
  const SeqlenInfo<int> seq(p, b);
  const int query_block =
      heaviest_first_block(p.window_left, p.window_right, blockIdx.x / splits, query_blocks);
  const int row_start = query_block * kBlockM;
  if (row_start >= seq.seqlen_q) return;
  const Mask<int> mask = seq.mask(p);
  // Key tiles some row of this block sees (this split's share of them), visited last-first:
  // tile i is key block blocks.end - 1 - i.
  const KeyBlocks<int> all_blocks =
      key_blocks(mask, row_start, min(row_start + kBlockM, seq.seqlen_q), kBlockN);
  const KeyBlocks<int> blocks = split_key_blocks(all_blocks, split, splits);
  const int n_tiles = blocks.count();
  const int head_dim = static_cast<int>(p.head_dim);

  const float* q_tile = static_cast<const float*>(p.q) + seq.q_offset(p, b, row_start, h);
  const float* k_head = static_cast<const float*>(p.k) + seq.k_offset(p, b, 0, hk);
  const float* v_head = static_cast<const float*>(p.v) + seq.v_offset(p, b, 0, hk);

  load_tile<Cfg, kBlockM, kQkPitch, kAligned>(q_big, q_tile, p.q_row_stride,
                                              seq.seqlen_q - row_start, head_dim);
  ptx::cp_async_commit();
  auto issue_tile = [&](int tile) {
    if (tile < n_tiles) {
      const int n0 = (blocks.end - 1 - tile) * kBlockN;
      float* k_stage = kv_ring + (tile % kStages) * Cfg::kStageFloats;
      const int valid_rows = seq.seqlen_k - n0;
      // Raw rows into the big planes; split_tile splits them once they have landed.
      load_tile<Cfg, kBlockN, kQkPitch, kAligned>(k_stage, k_head + n0 * p.k_row_stride,
                                                  p.k_row_stride, valid_rows, head_dim);
      load_tile<Cfg, kBlockN, kVPitch, kAligned>(k_stage + 2 * Cfg::kKPlaneFloats,
                                                 v_head + n0 * p.v_row_stride, p.v_row_stride,
                                                 valid_rows, head_dim);
    }
    ptx::cp_async_commit();  // empty groups keep the wait counts uniform
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue_tile(s);

  // Q is split once: the big plane overwrites the raw rows, the small plane takes the rest.
  ptx::cp_async_wait<kStages - 1>();  // the Q group is the oldest
  __syncthreads();
  split_tile<Cfg, kBlockM, kQkPitch, kSplit3>(q_big, q_small);
  // (the first iteration's __syncthreads publishes the planes)

  const LogitsTransform<float> logits = logits_transform<float>(p, b, h);
  const int last_row = min(row_start + kBlockM, seq.seqlen_q) - 1;
  const int warp_row0 = warp * Cfg::kWarpRows;

  float o[kMTiles][kDTiles][4];  // (kWarpRows, kHeadDim) fp32 accumulator
  zero_accumulator(o);
  // Rows g and g+8 of each m-tile; l is this lane's partial sum (the quad's add up to l).
  SoftmaxState<float> state[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) state[mt][half] = {-std::numeric_limits<float>::infinity(), 0.0f};

  for (int tile = 0; tile < n_tiles; ++tile) {
    ptx::cp_async_wait<kStages - 2>();  // this tile's K and V have landed (for this thread)
    __syncthreads();                    // ... for every thread; the oldest stage is free
    issue_tile(tile + kStages - 1);

    // K (kBlockN, kQkPitch) big and small planes, then V's (kBlockN, kVPitch).
    float* k_big = kv_ring + (tile % kStages) * Cfg::kStageFloats;
    float* k_small = k_big + Cfg::kKPlaneFloats;
    float* v_big = k_small + Cfg::kKPlaneFloats;
    float* v_small = v_big + Cfg::kVPlaneFloats;
    // Split once per CTA rather than once per warp in registers (which also kept every
    // k-step's fragments live and spilled).
    split_tile<Cfg, kBlockN, kQkPitch, kSplit3>(k_big, k_small);
    split_tile<Cfg, kBlockN, kVPitch, kSplit3>(v_big, v_small);
    __syncthreads();
    const int n_block = blocks.end - 1 - tile;
    const int n0 = n_block * kBlockN;

    // S = Q·Kᵀ  (kWarpRows, kBlockN), raw scores: the big·big products in s, the two
    // correction products in s_corr (added once at the end, in fp32 round-to-nearest: the
    // tensor cores' own accumulation rounds toward zero, and two chains run side by side).
    float s[kMTiles][kNTiles][4], s_corr[kMTiles][kNTiles][4];
    zero_accumulator(s);
    zero_accumulator(s_corr);
    // k-step ks covers dims 8ks .. 8ks + 7 with dim 2t as k-index t and 2t + 1 as t + 4
    // (the sum over dims does not care about their order, as long as A and B agree): each
    // fragment pair is then one 8-byte read.
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t a_big[kMTiles][4], a_small[kMTiles][4];  // Q (16, 8) per m-tile
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        // a0, a2 = Q[g][2t], Q[g][2t+1]; a1, a3 = the same of row g + 8.
        const int at = (warp_row0 + mt * 16 + g) * kQkPitch + ks * 8 + 2 * t;
        const float2 big_g = *reinterpret_cast<const float2*>(q_big + at);
        const float2 big_g8 = *reinterpret_cast<const float2*>(q_big + at + 8 * kQkPitch);
        a_big[mt][0] = __float_as_uint(big_g.x), a_big[mt][2] = __float_as_uint(big_g.y);
        a_big[mt][1] = __float_as_uint(big_g8.x), a_big[mt][3] = __float_as_uint(big_g8.y);
        if constexpr (kSplit3) {
          const float2 small_g = *reinterpret_cast<const float2*>(q_small + at);
          const float2 small_g8 = *reinterpret_cast<const float2*>(q_small + at + 8 * kQkPitch);
          a_small[mt][0] = __float_as_uint(small_g.x), a_small[mt][2] = __float_as_uint(small_g.y);
          a_small[mt][1] = __float_as_uint(small_g8.x), a_small[mt][3] = __float_as_uint(small_g8.y);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        // K (8 keys, 8 dims) as B: b0, b1 = K[key g][2t], K[key g][2t+1].
        const int at = (nt * 8 + g) * kQkPitch + ks * 8 + 2 * t;
        const float2 big = *reinterpret_cast<const float2*>(k_big + at);
        float2 small = big;  // unused by the single-TF32 kernel
        if constexpr (kSplit3) small = *reinterpret_cast<const float2*>(k_small + at);
        const ptx::Tf32Split b0 = {__float_as_uint(big.x), __float_as_uint(small.x)};
        const ptx::Tf32Split b1 = {__float_as_uint(big.y), __float_as_uint(small.y)};
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          if constexpr (kSplit3) {
            ptx::mma_m16n8k8_tf32(s_corr[mt][nt], a_small[mt], b0.big, b1.big);
            ptx::mma_m16n8k8_tf32(s_corr[mt][nt], a_big[mt], b0.small, b1.small);
          }
          ptx::mma_m16n8k8_tf32(s[mt][nt], a_big[mt], b0.big, b1.big);
        }
      }
    }
    if constexpr (kSplit3) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int r = 0; r < 4; ++r) s[mt][nt][r] += s_corr[mt][nt][r];
    }

    // Softcap and ALiBi (precise tanh), then the mask where key_blocks() says it cuts.
    transform_scores<Logits>(s, lane, row_start, warp_row0, n0, logits, mask, PreciseTanh{});
    if (blocks.needs_mask(n_block))
      mask_scores(s, lane, row_start, warp_row0, n0, mask, n0 >= mask.first_key(last_row));

    // Online softmax; P overwrites S.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float row_max = quad_row_max(s[mt], half);
        SoftmaxState<float>& st = state[mt][half];
        const float alpha = online_softmax_rescale(st, row_max);
        if (__any_sync(0xffffffffu, alpha != 1.0f)) {
#pragma unroll
          for (int dt = 0; dt < kDTiles; ++dt) {
            o[mt][dt][2 * half] *= alpha;
            o[mt][dt][2 * half + 1] *= alpha;
          }
        }
        // exp(x - m) as 2^((x - m)·log2e): the difference first, so that a large m costs
        // no precision.
        const float shift = safe_shift(st.m);
        float row_sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[mt][nt][2 * half + e];
            x = ptx::exp2_approx((x - shift) * kLog2e);
            row_sum += x;
          }
        st.l += row_sum;
      }

    // O += P·V. k-step kk covers keys kk·8 .. kk·8 + 7 with key 2t as k-index t and key
    // 2t + 1 as t + 4: A = (P[g][2t], P[g+8][2t], P[g][2t+1], P[g+8][2t+1]) is S n-tile kk's
    // own accumulator, and B = (V[2t][g], V[2t+1][g]) of each 8-column d-tile. P is split
    // once; the d-tiles are the outer loop so that only one d-tile's V fragments are live.
    uint32_t pa_big[kMTiles][kPvSteps][4], pa_small[kMTiles][kPvSteps][4];  // P (16, kBlockN)
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int kk = 0; kk < kPvSteps; ++kk) {
        const float pv[4] = {s[mt][kk][0], s[mt][kk][2], s[mt][kk][1], s[mt][kk][3]};
        split4(pv, pa_big[mt][kk], pa_small[mt][kk]);
      }
    // Each d-tile's products of this tile are summed on the tensor cores (big·big and the
    // corrections apart, as for S) and added to O in fp32 round-to-nearest: accumulated on
    // the tensor cores over every key, O's error grew with the sequence (8.7e-4 normwise at
    // N = 131072 on the H200, where the rule is 1e-5).
    const int v_lane = 2 * t * kVPitch + g;
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      float pv[kMTiles][4], pv_corr[kMTiles][4];  // (16, 8) per m-tile
      zero_accumulator(pv);
      zero_accumulator(pv_corr);
#pragma unroll
      for (int kk = 0; kk < kPvSteps; ++kk) {
        const int at = v_lane + kk * 8 * kVPitch + dt * 8;
        const ptx::Tf32Split b0 = {__float_as_uint(v_big[at]), __float_as_uint(v_small[at])};
        const ptx::Tf32Split b1 = {__float_as_uint(v_big[at + kVPitch]),
                                   __float_as_uint(v_small[at + kVPitch])};
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          if constexpr (kSplit3) {
            ptx::mma_m16n8k8_tf32(pv_corr[mt], pa_small[mt][kk], b0.big, b1.big);
            ptx::mma_m16n8k8_tf32(pv_corr[mt], pa_big[mt][kk], b0.small, b1.small);
          }
          ptx::mma_m16n8k8_tf32(pv[mt], pa_big[mt][kk], b0.big, b1.big);
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int r = 0; r < 4; ++r) o[mt][dt][r] += kSplit3 ? pv[mt][r] + pv_corr[mt][r] : pv[mt][r];
    }
  }
  ptx::cp_async_wait<0>();  // only empty groups remain (or Q's, when no tile ran)

  // Epilogue: unsplit rows are finished here (NaN rule, sink, 1/l); a split's partial is
  // only normalised by its own l and leaves the rest to the combine.
  const bool partial = splits > 1;
  const float sink = sink_logit<float>(p, h);
  const SplitPartials& parts = split_args.partials;
  const int64_t tile_index = partial ? parts.tile(b, h, p.heads_q, query_block) : 0;
  float* o_tile = static_cast<float*>(p.o) + seq.o_offset(p, b, row_start, h);
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      SoftmaxState<float> st = quad_row_state(state[mt][half]);
      const int local_row = warp_row0 + mt * 16 + g + 8 * half;
      const int row = row_start + local_row;
      if (row >= seq.seqlen_q) continue;
      float out_scale = 1.0f;
      float* to = nullptr;
      if (partial) {
        out_scale = output_scale(st);
        to = parts.out_row(tile_index, split, local_row);
        if (t == 0) parts.lse[parts.row_index(tile_index, split, local_row)] = log_sum_exp(st);
      } else {
        nan_if_no_finite_score(st, mask.visible_keys(row) > 0);
        const float sink_factor = p.sinks != nullptr ? add_sink(st, sink) : 1.0f;
        out_scale = sink_factor * output_scale(st);  // 0 for a fully masked row
        to = o_tile + local_row * p.o_row_stride;
        if (p.lse != nullptr && t == 0) p.lse[seq.lse_index(p, b, h, row)] = log_sum_exp(st);
      }
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const int col = dt * 8 + 2 * t;  // this lane's column pair
        const float x0 = o[mt][dt][2 * half] * out_scale, x1 = o[mt][dt][2 * half + 1] * out_scale;
        if (partial || kAligned) {
          // The workspace pitch is kHeadDim; aligned rows hold whole column pairs.
          if (partial || col < head_dim) *reinterpret_cast<float2*>(to + col) = make_float2(x0, x1);
        } else {
          if (col < head_dim) to[col] = x0;
          if (col + 1 < head_dim) to[col + 1] = x1;
        }
      }
    }
}

template <class Cfg, class Logits, bool kAligned, Precision kPrecision>
void launch_tf32x3_forward(const AttentionParams& p, const SplitArgs& split_args,
                           cudaStream_t stream) {
  auto* kernel = &tf32x3_forward_kernel<Cfg, Logits, kAligned, kPrecision>;
  static std::atomic<uint64_t> smem_raised{0};  // one per kernel
  raise_smem_limit_once(kernel, Cfg::kSmemBytes, p.device_index, smem_raised);
  const int query_blocks = static_cast<int>((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM);
  const dim3 grid(static_cast<unsigned>(query_blocks * split_args.splits),
                  static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, split_args);
  check_launch("tf32x3_forward_kernel");
}

// Tile sizes per specialised head dim (H200: two CTAs of 4 warps per SM at d=64, one of 8
// warps at d=128; 227 KB of shared memory per CTA at most). Chosen by what fits, not yet by
// a measured sweep: no alternative has been timed.
template <int kHeadDim>
struct Tf32Traits;
template <>
struct Tf32Traits<64> : Tf32Config<64, 64, 32, 4, 2, 2> {};
template <>
struct Tf32Traits<128> : Tf32Config<128, 128, 16, 8, 2, 1> {};

inline constexpr int kSpecialisedHeadDims[] = {64, 128};
constexpr int specialised_head_dim(int64_t head_dim) {
  for (int d : kSpecialisedHeadDims)
    if (head_dim <= d) return d;
  return 0;
}

// One head dim's kernels (instantiated in hdim<D>.cu): one per LogitsFlags and precision on
// the aligned layouts, one runtime-logits kernel per precision on the narrow ones.
template <int kHeadDim>
void run_tf32x3_forward(const AttentionParams& p, const SplitArgs& split_args, Precision precision,
                        cudaStream_t stream) {
  using Cfg = Tf32Traits<kHeadDim>;
  auto with_precision = [&](auto launch) {
    if (precision == Precision::single)
      launch(std::integral_constant<Precision, Precision::single>{});
    else
      launch(std::integral_constant<Precision, Precision::split3>{});
  };
  with_precision([&](auto mode) {
    if (rows_aligned_16(p))
      with_logits_flags(p, [&](auto flags) {
        launch_tf32x3_forward<Cfg, decltype(flags), true, decltype(mode)::value>(p, split_args,
                                                                                 stream);
      });
    else
      launch_tf32x3_forward<Cfg, RuntimeLogits, false, decltype(mode)::value>(p, split_args, stream);
  });
}

#define FLASHTILE_TF32X3_INSTANTIATIONS(prefix, D)                                        \
  prefix template void run_tf32x3_forward<D>(const AttentionParams&, const SplitArgs&, \
                                             Precision, cudaStream_t);
FLASHTILE_TF32X3_INSTANTIATIONS(extern, 64)
FLASHTILE_TF32X3_INSTANTIATIONS(extern, 128)

}  // namespace flashtile::detail::tf32x3
