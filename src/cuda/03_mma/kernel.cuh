// Journey step 3 — cuda_mma: tensor cores (mma.sync m16n8k16), fp16/bf16, sm_80+.
//
// What changed from step 2 (src/cuda/02_tiled.cu, fp32 SIMT, 4 threads per query row):
//  - Both products run on the tensor cores: S = Q·Kᵀ and O += P·V are mma.sync.m16n8k16
//    with fp32 accumulators; each warp owns kWarpRows = 16·kMTiles query rows.
//  - Operand fragments come from shared memory through ldmatrix (.trans for V, whose
//    B operand is column-major), from a 16-byte-chunk XOR swizzle that makes every
//    ldmatrix and every cp.async free of bank conflicts without padding.
//  - K and V tiles stream through a kStages-deep cp.async ring: tile t+kStages-1 is in
//    flight while tile t is computed; one __syncthreads per tile.
//  - S and P never leave registers: the fp32 accumulator layout of S is, pairwise, the
//    A-operand layout of P·V, so P is packed to 16-bit pairs in place.
//  - exp2 on the SFU with scale·log2(e) folded into one FFMA per score; the m/l update
//    goes through src/attn/softmax_state.hpp (natural-log state, l kept as per-thread
//    partial sums and reduced across the quad once at the end).
//  - Masking costs nothing on interior tiles: only tiles that cross the causal diagonal
//    or the end of K evaluate the mask; causal blocks skip tiles above the diagonal, and
//    the heaviest query blocks are launched first.
// Measured (H200, ANCHORS grid: 16k tokens, hidden 2048; bench/peers.py, one run beside
// PyTorch 2.11 SDPA, 2026-12-01; bench/results/peers.json): bf16 d=128 343 TFLOP/s
// non-causal and 320 causal at 16k (PyTorch's FlashAttention-2 356 / 325: 0.97x, 0.99x);
// d=64 293 / 283 (FA2 308 / 297: 0.95x, 0.96x). Over seqlen 1k..16k, d 64/128, bf16/fp16,
// causal or not: 0.88x-0.99x of FA2, i.e. not yet at parity; cuDNN is 1.6-1.9x faster.
// Step 2 (fp32 SIMT) is a different dtype: the tensor cores are the point of this step.
//
// On the feature core (issue 8, docs/JOURNEY.md "3d/3e"): every variant and varlen batch.
//  - Key tiles come from key_blocks() (src/attn/block_range.hpp): causal and sliding
//    windows skip what no row of the block sees; only needs_mask() tiles evaluate
//    Mask::key_end / Mask::visible. Positions and offsets come from SeqlenInfo (dense and
//    varlen alike); blocks past their sequence's end exit at once.
//  - Softcap and ALiBi go through LogitsTransform::apply<kSoftcap, kAlibi> (tanh.approx:
//    worst fp16/bf16 error 0.54-0.57 of FlashAttention's bound in the tests), one kernel
//    per LogitsFlags; the plain kernel keeps its folded exp2. Sinks join at finalisation
//    (add_sink); the LSE index is SeqlenInfo::lse_index.
//  - Any head_dim 1..256 runs zero-padded on the next specialisation; rows that are not
//    16-byte aligned take tile_io.cuh's narrow path instead of being refused.
// Measured (H200, bench/mma_variants.cu beside c0a5533 in the same call, two runs each;
// bench/results/mma_core_v2_*): the dense bf16 grid at 0.980x-1.106x of the previous
// kernel (d=64 +2..11%, d=256 -0.1..+3%, d=128 -2.0% at seqlen 512 causal to +1.8%); at
// 16k d=128 causal: window (1024, 0) 6.7x faster than causal (target 8x: missed, tile
// granularity bounds it at 7.4x), softcap +11.5% (target 10%: missed), ALiBi +7.4%,
// sinks +0%; varlen 256..4096 (kernel) within 2.4% of the dense batch of the same work.
//
// Layout conventions: lane = 4·g + t (g = lane/4 is the fragment row, t = lane%4 the
// column pair). A 16x8 fp32 accumulator tile holds rows g and g+8, columns 2t and 2t+1.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attn/block_range.hpp"
#include "attn/seqlen.hpp"
#include "attn/softmax_state.hpp"
#include "attn/split_kv.hpp"
#include "attn/variant.hpp"
#include "cuda/03_mma/pieces.cuh"
#include "cuda/03_mma/tile_io.cuh"
#include "cuda/common.cuh"
#include "cuda/mma_fragment.cuh"
#include "cuda/ptx/exp2_fma.cuh"
#include "cuda/ptx/mma.cuh"
#include "cuda/split_kv_combine.cuh"

namespace flashtile::detail::mma {

// One kernel configuration. MmaTraits<head_dim> (traits.cuh) picks one per head dim.
//   kHeadDim  : specialised head dim (a multiple of 16; smaller dims are zero-padded)
//   kBlockM   : query rows per CTA, kBlockN: keys per K/V tile
//   kNWarps   : warps per CTA; each owns kBlockM / kNWarps rows (16 per m-tile)
//   kStages   : depth of the K/V cp.async ring
//   kQInRegs  : keep the Q fragments in registers for the whole loop (else re-read them
//               from shared memory with ldmatrix for every tile)
//   kMinBlocks: CTAs per SM asked of the register allocator (__launch_bounds__)
//   kSoftcapFmaExp2Tiles: in the softcap kernel (softcap without ALiBi), the first this many
//               8-key n-tiles of each tile take their exp2 on the FMA pipe (ptx/exp2_fma.cuh)
//               instead of the MUFU, which the softcap's tanh already loads with one op per
//               score; 0 = every exp2 on the MUFU
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kStages_, bool kQInRegs_,
          int kMinBlocks_, int kSoftcapFmaExp2Tiles_ = 0>
struct MmaConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kStages = kStages_;
  static constexpr bool kQInRegs = kQInRegs_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kSoftcapFmaExp2Tiles = kSoftcapFmaExp2Tiles_;

  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kWarpRows = kBlockM / kNWarps;
  static constexpr int kMTiles = kWarpRows / 16;  // 16-row mma tiles per warp
  static constexpr int kNTiles = kBlockN / 8;     // 8-key tiles of S
  static constexpr int kKSteps = kHeadDim / 16;   // k-steps of Q·Kᵀ
  static constexpr int kDTiles = kHeadDim / 8;    // 8-column tiles of O
  static constexpr int kPvSteps = kBlockN / 16;   // k-steps of P·V
  // Shared rows are a whole number of 128-byte lines so the swizzle below stays inside
  // the row (head_dim 96 is stored with a pitch of 128; its chunks 12..15 stay unused).
  static constexpr int kRowChunks = (kHeadDim + 63) / 64 * 8;  // 16-byte chunks per row
  static constexpr int kDataChunks = kHeadDim / 8;
  static constexpr int kRowBytes = kRowChunks * 16;
  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kTileBytes = kBlockN * kRowBytes;  // one K or one V tile
  static constexpr int kSmemBytes = kQBytes + kStages * 2 * kTileBytes;
  static constexpr int kRowsPerPass = kThreads / kRowChunks;  // rows one cp.async pass fills

  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 256, "head dim: a multiple of 16, <= 256");
  static_assert(kBlockM % kNWarps == 0 && kWarpRows % 16 == 0,
                "each warp owns a whole number of 16-row mma tiles");
  static_assert(kBlockN % 16 == 0, "K/V tiles hold whole 16-key k-steps (and n-tile pairs)");
  static_assert(kStages >= 2, "the cp.async ring needs at least two stages");
  static_assert(kThreads % kRowChunks == 0, "a cp.async pass covers whole rows");
  static_assert(kBlockM % kRowsPerPass == 0 && kBlockN % kRowsPerPass == 0,
                "tiles are a whole number of cp.async passes");
  static_assert(32 % kRowChunks == 0 || kRowChunks % 32 == 0,
                "the output copy maps lanes onto whole rows");
  static_assert(kSoftcapFmaExp2Tiles >= 0 && kSoftcapFmaExp2Tiles <= kNTiles,
                "the FMA-pipe exp2 takes some of a tile's n-tiles");
};

// How a launch assigns CTAs to (batch entry, head, query block) (docs/JOURNEY.md 3g).
//   kBlockMajor: a 1D grid with the query block outermost: the heaviest block of every head
//     first, the lightest of every head last (under a sliding window the first blocks of
//     each head are the short ones, and they fill the last wave); else the grid
//     (query block, head, batch entry), query block fastest.
// (3g also measured an L2 prefetch of K/V tiles ahead and of the next resident block's Q:
// +3..5% at window (1024, 0), d=128, so it was removed; it is on branch feat/window.)
template <bool kBlockMajor_>
struct BlockSchedule {
  static constexpr bool kBlockMajor = kBlockMajor_;
};
// Dense and causal calls: the grid as it always was.
using GridSchedule = BlockSchedule<false>;

// The query block a CTA computes: its rank in heaviest-first order among `count` blocks of
// one sequence, the head and the batch entry.
struct BlockCoords {
  int rank, count;
  int64_t h, b;
};

// Coordinates of the block-major CTA with 1D launch index `linear` (< 2^31:
// block_major_grid_fits).
template <class Cfg>
__device__ __forceinline__ BlockCoords block_major_coords(const AttentionParams& p, int linear) {
  const int count = static_cast<int>((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM);
  const int heads = static_cast<int>(p.heads_q);
  const int per_rank = heads * static_cast<int>(p.batch);
  const int rest = linear % per_rank;
  return {linear / per_rank, count, rest % heads, rest / heads};
}

// Whether a 1D block-major grid of p's blocks fits CUDA's 2^31 - 1 CTAs (the launcher and
// the dispatcher both ask).
template <class Cfg>
inline bool block_major_grid_fits(const AttentionParams& p) {
  const int64_t blocks = (p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  return blocks * p.heads_q * p.batch <= int64_t(INT32_MAX);
}

// Logits: LogitsFlags (attn/features.hpp) or RuntimeLogits. kAligned: every row of q, k, v
// and out starts on 16 bytes and head_dim % 8 == 0 (tile_io.cuh's aligned path), else the
// narrow path.
// Schedule: a BlockSchedule (GridSchedule for dense and causal calls).
// kSplitKv (GridSchedule only): the keys are split in parts.splits (split-KV, JOURNEY 3i):
// CTA x computes split x % splits of query block rank x / splits, and writes its partial and
// LSE to the workspace for the combine (split_kv_combine.cuh); else out and lse directly.
// A compile-time flag, not a test of parts.splits: the run-time test cost the unsplit plain
// d=64 kernel 40 bytes of spills (sm_90a; its rows no longer derive from blockIdx alone).
template <class T, class Cfg, class Logits, bool kAligned, class Schedule = GridSchedule,
          bool kSplitKv = false>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    mma_forward_kernel(const AttentionParams p, const SplitPartials parts) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kMTiles = Cfg::kMTiles, kNTiles = Cfg::kNTiles, kKSteps = Cfg::kKSteps;
  constexpr int kDTiles = Cfg::kDTiles, kPvSteps = Cfg::kPvSteps, kRowBytes = Cfg::kRowBytes;
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  extern __shared__ __align__(128) unsigned char smem[];
  // [ Q (kBlockM, kRowChunks·8) | stage 0: K (kBlockN, ·), V (kBlockN, ·) | stage 1 ... ]
  const uint32_t smem_q = ptx::smem_addr(smem);
  const uint32_t smem_kv = smem_q + Cfg::kQBytes;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  // The block-major schedule decodes its 1D index; GridSchedule reads the grid where it
  // always did (moving those reads changed the dense kernels' register allocation).
  static_assert(!(kSplitKv && Schedule::kBlockMajor), "split calls keep the grid schedule");
  constexpr bool split_kv = kSplitKv;
  BlockCoords at{};
  if constexpr (Schedule::kBlockMajor)
    at = block_major_coords<Cfg>(p, static_cast<int>(blockIdx.x));
  const int splits = split_kv ? parts.splits : 1;
  const int rank = Schedule::kBlockMajor ? at.rank : static_cast<int>(blockIdx.x) / splits;
  const int count = Schedule::kBlockMajor ? at.count : static_cast<int>(gridDim.x) / splits;
  const int64_t h = Schedule::kBlockMajor ? at.h : blockIdx.y;
  const int64_t b = Schedule::kBlockMajor ? at.b : blockIdx.z, hk = h / p.heads_per_kv();
  // Where sequence b lives and how long it is (dense or varlen); the grid covers the
  // longest sequence, so blocks past this one's end have nothing to do.
  const SeqlenInfo<int> seq(p, b);
  const int row_start = heaviest_first_block(p.window_left, p.window_right, rank, count) * kBlockM;
  if (row_start >= seq.seqlen_q) return;
  // The combine (a programmatic dependent launch on sm_90) may be scheduled from here on.
  if constexpr (split_kv) allow_dependent_launch();
  const Mask<int> mask = seq.mask(p);
  // Key tiles some row of this block sees (this split's share of them), and those every row
  // sees whole (no mask); they are visited last-first, so tile i is key block blocks.end - 1 - i.
  KeyBlocks<int> blocks =
      key_blocks(mask, row_start, min(row_start + kBlockM, seq.seqlen_q), kBlockN);
  if constexpr (split_kv) blocks = split_key_blocks(blocks, static_cast<int>(blockIdx.x) % splits, splits);
  const int n_tiles = blocks.count();
  const int head_dim = static_cast<int>(p.head_dim);
  const int valid_chunks = head_dim / 8;  // the aligned path's whole chunks

  const T* q_tile = static_cast<const T*>(p.q) + seq.q_offset(p, b, row_start, h);
  const T* k_head = static_cast<const T*>(p.k) + seq.k_offset(p, b, 0, hk);
  const T* v_head = static_cast<const T*>(p.v) + seq.v_offset(p, b, 0, hk);
  // The narrow path's access widths (elements), from each tensor's alignment.
  int q_granule = 8, k_granule = 8, v_granule = 8;
  if constexpr (!kAligned) {
    q_granule = access_granule(p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
    k_granule = access_granule(p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
    v_granule = access_granule(p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  }

  if constexpr (kAligned)
    load_tile_async<Cfg, kBlockM>(smem_q, q_tile, p.q_row_stride, seq.seqlen_q - row_start,
                                  valid_chunks);
  else
    load_tile_narrow<Cfg, kBlockM>(smem, q_tile, p.q_row_stride, seq.seqlen_q - row_start,
                                   head_dim, q_granule);
  ptx::cp_async_commit();
  auto issue_tile = [&](int tile) {
    if (tile < n_tiles) {
      const int n0 = (blocks.end - 1 - tile) * kBlockN;
      const int stage_offset = (tile % kStages) * 2 * Cfg::kTileBytes;
      const T* k_rows = k_head + n0 * p.k_row_stride;
      const T* v_rows = v_head + n0 * p.v_row_stride;
      const int valid_rows = seq.seqlen_k - n0;
      if constexpr (kAligned) {
        const uint32_t stage = smem_kv + stage_offset;
        if (valid_rows >= kBlockN) {  // every tile but the one holding the end of K
          load_full_tile_async<Cfg, kBlockN>(stage, k_rows, p.k_row_stride, valid_chunks);
          load_full_tile_async<Cfg, kBlockN>(stage + Cfg::kTileBytes, v_rows, p.v_row_stride,
                                             valid_chunks);
        } else {
          load_tile_async<Cfg, kBlockN>(stage, k_rows, p.k_row_stride, valid_rows, valid_chunks);
          load_tile_async<Cfg, kBlockN>(stage + Cfg::kTileBytes, v_rows, p.v_row_stride,
                                        valid_rows, valid_chunks);
        }
      } else {
        unsigned char* stage = smem + Cfg::kQBytes + stage_offset;
        load_tile_narrow<Cfg, kBlockN>(stage, k_rows, p.k_row_stride, valid_rows, head_dim,
                                       k_granule);
        load_tile_narrow<Cfg, kBlockN>(stage + Cfg::kTileBytes, v_rows, p.v_row_stride,
                                       valid_rows, head_dim, v_granule);
      }
    }
    ptx::cp_async_commit();  // empty groups keep the wait counts uniform
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue_tile(s);

  // Per-lane ldmatrix addressing. Every fragment row index is (multiple of 8) + lane % 8,
  // so row % 8 == lane % 8 for all of them.
  const int warp_row0 = warp * Cfg::kWarpRows;
  // Q (A operand): matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
  const uint32_t q_lane = smem_q + (warp_row0 + lane % 16) * kRowBytes;
  const SwizzledPairs q_cols(lane / 16, lane % 8);
  // K (B operand of Q·Kᵀ, K rows are its columns): (keys 0-7, k 0-7), (0-7, 8-15),
  // (8-15, 0-7), (8-15, 8-15) = b0, b1 of n-tile 2j and b0, b1 of n-tile 2j+1.
  const uint32_t k_lane_row = (lane % 8 + (lane / 16) * 8) * kRowBytes;
  const SwizzledPairs k_cols((lane / 8) % 2, lane % 8);
  // V (B operand of P·V through .trans): (keys 0-7, d 0-7), (8-15, 0-7), (0-7, 8-15),
  // (8-15, 8-15) = b0, b1 of d-tile 2j and b0, b1 of d-tile 2j+1.
  const uint32_t v_lane_row = (lane % 8 + ((lane / 8) % 2) * 8) * kRowBytes;
  const SwizzledPairs v_cols(lane / 16, lane % 8);

  // The plain kernel folds a negative scale into Q by flipping its sign bits once in shared
  // memory (exact in fp16/bf16), so its softmax only ever sees scale >= 0 and the max of the
  // raw scores stays the max of the logits. scale_log2 is kept above 0 so that a masked
  // score (-inf) still gives 2^-inf = 0 when scale == 0 (every visible score then gives
  // 2^0 = 1, as it should). The transformed kernels take their maxima over the finished
  // logits, so the sign stays in the transform.
  const float scale = fabsf(p.scale);
  const float scale_log2 = fmaxf(scale * kLog2e, FLT_MIN);
  if (Logits::kPlain && p.scale < 0.0f) {
    ptx::cp_async_wait<kStages - 1>();  // the Q group is the oldest
    __syncthreads();
    for (int i = threadIdx.x; i < Cfg::kQBytes / 4; i += Cfg::kThreads)
      reinterpret_cast<uint32_t*>(smem)[i] ^= 0x80008000u;
    __syncthreads();
  }
  // Softcap and ALiBi (when Logits asks for them) turn raw scores into natural-unit logits
  // before the softmax; the plain kernel instead folds the scale into its exp2, and the
  // softcap-only kernel the cap c (its scores are tanh(scale·qk / c), logits / c; c > 0).
  const LogitsTransform<float> logits = logits_transform<float>(p, b, h);
  constexpr bool kCapUnits = Logits::kSoftcap && !Logits::kAlibi;  // RuntimeLogits has both
  constexpr bool kScoresInUnits = Logits::kPlain || kCapUnits;
  const float score_unit = Logits::kPlain ? scale : (kCapUnits ? logits.softcap : 1.0f);
  const float unit_log2 = Logits::kPlain ? scale_log2 : score_unit * kLog2e;
  // The last query row of the block: its first key bounds every row's (masks are monotone).
  const int last_row = min(row_start + kBlockM, seq.seqlen_q) - 1;

  auto load_q_fragment = [&](uint32_t (&a)[4], int mt, int ks) {
    ptx::ldmatrix_x4(a, q_lane + mt * 16 * kRowBytes + q_cols(ks));
  };

  constexpr int kQRegTiles = Cfg::kQInRegs ? kMTiles : 1;
  constexpr int kQRegSteps = Cfg::kQInRegs ? kKSteps : 1;
  uint32_t q_frag[kQRegTiles][kQRegSteps][4];  // (kWarpRows, kHeadDim) as A fragments
  if constexpr (Cfg::kQInRegs) {
    ptx::cp_async_wait<kStages - 1>();  // the Q group is the oldest
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) load_q_fragment(q_frag[mt][ks], mt, ks);
  }

  float o[kMTiles][kDTiles][4];  // (kWarpRows, kHeadDim) fp32 accumulator
  zero_accumulator(o);
  // Rows g and g+8 of each m-tile. m is the row's running max of the logits (natural
  // units); l is this lane's partial sum over its columns (the quad's four partials add up
  // to l). Set explicitly: nvcc 13.0 was seen to leave m = 0 instead of the member
  // initializer's -inf for state[1][*] (cuobjdump of the kMTiles = 2 kernels), which only
  // shows as rounding (m is a shift) but breaks the exact single-key rows.
  SoftmaxState<float> state[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) state[mt][half] = {kNegInf, 0.0f};

  for (int tile = 0; tile < n_tiles; ++tile) {
    ptx::cp_async_wait<kStages - 2>();  // this tile's K and V have landed (for this thread)
    __syncthreads();                    // ... for every thread; the oldest stage is free
    issue_tile(tile + kStages - 1);

    const uint32_t k_stage = smem_kv + (tile % kStages) * 2 * Cfg::kTileBytes;
    const uint32_t v_stage = k_stage + Cfg::kTileBytes;
    const int n_block = blocks.end - 1 - tile;
    const int n0 = n_block * kBlockN;

    // S = Q·Kᵀ  (kWarpRows, kBlockN), raw (unscaled) scores.
    float s[kMTiles][kNTiles][4];
    zero_accumulator(s);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        if constexpr (Cfg::kQInRegs) {
#pragma unroll
          for (int r = 0; r < 4; ++r) a[mt][r] = q_frag[mt][ks][r];
        } else {
          load_q_fragment(a[mt], mt, ks);
        }
      }
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t kb[4];
        ptx::ldmatrix_x4(kb, k_stage + k_lane_row + np * 16 * kRowBytes + k_cols(ks));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          ptx::mma_m16n8k16<T>(s[mt][2 * np], a[mt], kb[0], kb[1]);
          ptx::mma_m16n8k16<T>(s[mt][2 * np + 1], a[mt], kb[2], kb[3]);
        }
      }
    }

    // Softcap and ALiBi, then the mask, on S.
    if constexpr (kCapUnits)
      for_each_score(s, lane, row_start, warp_row0, n0, [&](float& x, int, int) {
        x = logits.capped_in_cap_units(x, ptx::TanhApprox{});
      });
    else if constexpr (!Logits::kPlain)
      transform_scores<Logits>(s, lane, row_start, warp_row0, n0, logits, mask, ptx::TanhApprox{});
    // Only the tiles key_blocks() names hold keys some row must not see (the diagonal, the
    // window's edges, the end of K); every other tile is seen whole by every row.
    if (blocks.needs_mask(n_block))
      mask_scores(s, lane, row_start, warp_row0, n0, mask, n0 >= mask.first_key(last_row));

    // Online softmax; P overwrites S (fp32), then is packed into A fragments of P·V.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float row_max = quad_row_max(s[mt], half);
        // In natural units: the plain kernel's raw scores still lack the scale, the softcap
        // kernel's the cap.
        float block_max = row_max;
        if constexpr (kScoresInUnits)
          block_max = row_max == kNegInf ? kNegInf : row_max * score_unit;
        SoftmaxState<float>& st = state[mt][half];
        const float alpha = online_softmax_rescale(st, block_max);
        // Once the running maxima settle, most tiles leave every row's m unchanged
        // (alpha = 1): the warp then skips the rescale of these rows of O.
        if (__any_sync(0xffffffffu, alpha != 1.0f)) {
#pragma unroll
          for (int dt = 0; dt < kDTiles; ++dt) {
            o[mt][dt][2 * half] *= alpha;
            o[mt][dt][2 * half + 1] *= alpha;
          }
        }
        // P = exp(logit - m) = 2^(logit·log2e - m·log2e), the logit being unit·s: one FFMA +
        // one MUFU.EX2 per score. The softcap kernel's tanh is a second MUFU op per score:
        // it takes kSoftcapFmaExp2Tiles n-tiles' exp2 on the FMA pipe.
        const float shift = safe_shift(st.m) * kLog2e;
        const float to_log2 = kScoresInUnits ? unit_log2 : kLog2e;
        constexpr int kFmaExp2Tiles =
            Logits::kSoftcap && !Logits::kAlibi ? Cfg::kSoftcapFmaExp2Tiles : 0;
        float row_sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[mt][nt][2 * half + e];
            const float exponent = fmaf(x, to_log2, -shift);
            x = nt < kFmaExp2Tiles ? ptx::exp2_fma(exponent) : ptx::exp2_approx(exponent);
            row_sum += x;
          }
        st.l += row_sum;
      }

    // O += P·V. The A fragment of k-step kk is S n-tiles 2kk and 2kk+1, row halves g/g+8:
    // (a0, a1, a2, a3) = (tile 2kk rows g, tile 2kk rows g+8, tile 2kk+1 rows g, ... g+8).
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) {
      uint32_t pa[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
        ptx::accumulators_to_a<T>(s[mt][2 * kk], s[mt][2 * kk + 1], pa[mt]);
#pragma unroll
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t vb[4];
        ptx::ldmatrix_x4_trans(vb, v_stage + v_lane_row + kk * 16 * kRowBytes + v_cols(dp));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          ptx::mma_m16n8k16<T>(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
          ptx::mma_m16n8k16<T>(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
  }

  // Epilogue. Drain the ring (only empty groups remain, or the Q group when no tile ran)
  // and make sure no warp still reads Q before the Q rows are reused to stage O.
  ptx::cp_async_wait<0>();
  __syncthreads();

  if constexpr (split_kv) {  // fp32 partial rows straight from the accumulators
    const int split = static_cast<int>(blockIdx.x) % splits;
    const int64_t split_tile = parts.tile(b, h, p.heads_q, row_start / kBlockM);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        SoftmaxState<float> st = quad_row_state(state[mt][half]);
        const int local_row = warp_row0 + mt * 16 + g + 8 * half;
        if (row_start + local_row < seq.seqlen_q)
          store_partial_row<kDTiles>(parts, split_tile, split, local_row, t, st, [&](int dt) {
            return make_float2(o[mt][dt][2 * half], o[mt][dt][2 * half + 1]);
          });
      }
    return;
  }
  const float sink = sink_logit<float>(p, h);
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      SoftmaxState<float> st = quad_row_state(state[mt][half]);
      const int local_row = warp_row0 + mt * 16 + g + 8 * half;
      const int row = row_start + local_row;
      nan_if_no_finite_score(st, mask.visible_keys(row) > 0);
      // add_sink would leave a state without sinks unchanged; the branch spares its exps.
      const float sink_factor = p.sinks != nullptr ? add_sink(st, sink) : 1.0f;
      const float out_scale = sink_factor * output_scale(st);  // 0 for a fully masked row
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        // Conflict-free: the quad writes one 16-byte chunk, the 8 rows 8 distinct ones.
        const uint32_t packed =
            ptx::pack2<T>(o[mt][dt][2 * half] * out_scale, o[mt][dt][2 * half + 1] * out_scale);
        *reinterpret_cast<uint32_t*>(smem + swizzle<Cfg>(local_row, dt) + 4 * t) = packed;
      }
      if (p.lse != nullptr && t == 0 && row < seq.seqlen_q)
        p.lse[seq.lse_index(p, b, h, row)] = log_sum_exp(st);
    }
  __syncwarp();

  // Each warp copies its own rows out: 16-byte stores on the aligned path, the widest the
  // output allows on the narrow one; masked to the true head_dim.
  constexpr int kLanesPerRow = Cfg::kRowChunks < 32 ? Cfg::kRowChunks : 32;
  constexpr int kRowsPerStep = 32 / kLanesPerRow;
  T* o_tile = static_cast<T*>(p.o) + seq.o_offset(p, b, row_start, h);
  int o_granule = 8;
  if constexpr (!kAligned)
    o_granule = access_granule(p.o, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  const int out_chunks = (head_dim + 7) / 8;
#pragma unroll
  for (int r = lane / kLanesPerRow; r < Cfg::kWarpRows; r += kRowsPerStep) {
    const int local_row = warp_row0 + r;
    if (row_start + local_row >= seq.seqlen_q) break;
#pragma unroll
    for (int chunk = lane % kLanesPerRow; chunk < Cfg::kRowChunks; chunk += kLanesPerRow) {
      if (chunk >= out_chunks) break;
      const uint4 value = *reinterpret_cast<const uint4*>(smem + swizzle<Cfg>(local_row, chunk));
      T* to = o_tile + local_row * p.o_row_stride + chunk * 8;
      if constexpr (kAligned)
        *reinterpret_cast<uint4*>(to) = value;
      else
        store_chunk_narrow(reinterpret_cast<uint16_t*>(to), value,
                           chunk_elements(chunk, head_dim), o_granule);
    }
  }
}

// Launches the kernel for one configuration on `stream`; the grid covers the longest
// sequence (p.seqlen_q) of every (head, batch entry), times parts.splits in x.
// A block-major Schedule needs block_major_grid_fits(p) (the dispatcher checks it) and one split.
template <class T, class Cfg, class Logits, bool kAligned, class Schedule = GridSchedule,
          bool kSplitKv = false>
void launch_mma_forward(const AttentionParams& p, const SplitPartials& parts,
                        cudaStream_t stream) {
  auto* kernel = &mma_forward_kernel<T, Cfg, Logits, kAligned, Schedule, kSplitKv>;
  if (kSplitKv != (parts.splits > 1))
    throw Error(ErrorKind::runtime, "cuda_mma: a split call reached an unsplit kernel or back");
  static std::atomic<uint64_t> smem_raised{0};  // one per kernel
  raise_smem_limit_once(kernel, Cfg::kSmemBytes, p.device_index, smem_raised);
  const int64_t query_blocks = (p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  dim3 grid(static_cast<unsigned>(query_blocks * parts.splits), static_cast<unsigned>(p.heads_q),
            static_cast<unsigned>(p.batch));
  if constexpr (Schedule::kBlockMajor)
    grid = dim3(static_cast<unsigned>(query_blocks * p.heads_q * p.batch));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, parts);
  check_launch("mma_forward_kernel");
}

}  // namespace flashtile::detail::mma
