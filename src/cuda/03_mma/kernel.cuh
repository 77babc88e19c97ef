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
// Layout conventions: lane = 4·g + t (g = lane/4 is the fragment row, t = lane%4 the
// column pair). A 16x8 fp32 accumulator tile holds rows g and g+8, columns 2t and 2t+1.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>

#include "attn/softmax_state.hpp"
#include "cuda/common.cuh"
#include "cuda/ptx/mma.cuh"

namespace flashtile::detail::mma {

// One kernel configuration. MmaTraits<head_dim> (traits.cuh) picks one per head dim.
//   kHeadDim  : specialised head dim (a multiple of 16; smaller dims are zero-padded)
//   kBlockM   : query rows per CTA, kBlockN: keys per K/V tile
//   kNWarps   : warps per CTA; each owns kBlockM / kNWarps rows (16 per m-tile)
//   kStages   : depth of the K/V cp.async ring
//   kQInRegs  : keep the Q fragments in registers for the whole loop (else re-read them
//               from shared memory with ldmatrix for every tile)
//   kMinBlocks: CTAs per SM asked of the register allocator (__launch_bounds__)
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kStages_, bool kQInRegs_,
          int kMinBlocks_>
struct MmaConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kStages = kStages_;
  static constexpr bool kQInRegs = kQInRegs_;
  static constexpr int kMinBlocks = kMinBlocks_;

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
};

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile: the chunk index is
// XORed with row % 8, so the 8 rows one ldmatrix phase reads (same logical chunk) land in
// 8 different 16-byte bank groups. kRowChunks is a multiple of 8, so the XOR stays in-row.
template <class Cfg>
__device__ __forceinline__ uint32_t swizzle(int row, int chunk) {
  return static_cast<uint32_t>(row * Cfg::kRowChunks + (chunk ^ (row & 7))) * 16u;
}

// Copies rows [0, kRows) of a strided tensor (row 0 at `src`, `row_stride` elements apart)
// into a swizzled shared tile; rows >= valid_rows and chunks >= valid_chunks (past the true
// head_dim) are zero-filled, so padding never injects garbage (0·NaN) into the products.
template <class Cfg, int kRows, class T>
__device__ __forceinline__ void load_tile_async(uint32_t tile, const T* src, int64_t row_stride,
                                                int valid_rows, int valid_chunks) {
  const int chunk = threadIdx.x % Cfg::kRowChunks;
  const int row0 = threadIdx.x / Cfg::kRowChunks;
  if (chunk >= Cfg::kDataChunks) return;  // pitch padding (head_dim 96 only)
  const bool chunk_ok = chunk < valid_chunks;
#pragma unroll
  for (int i = 0; i < kRows / Cfg::kRowsPerPass; ++i) {
    const int row = row0 + i * Cfg::kRowsPerPass;
    const bool ok = chunk_ok && row < valid_rows;
    // A skipped copy still names a valid address (row 0 always exists) but reads nothing.
    const T* from = ok ? src + row * row_stride + chunk * 8 : src;
    ptx::cp_async_16(tile + swizzle<Cfg>(row, chunk), from, ok);
  }
}

// The same for a tile known to be whole (every row < seqlen): no per-row predicate and
// addresses that advance by a fixed stride, so each chunk costs a 64-bit add and a copy.
template <class Cfg, int kRows, class T>
__device__ __forceinline__ void load_full_tile_async(uint32_t tile, const T* src,
                                                     int64_t row_stride, int valid_chunks) {
  const int chunk = threadIdx.x % Cfg::kRowChunks;
  const int row0 = threadIdx.x / Cfg::kRowChunks;
  if (chunk >= Cfg::kDataChunks || chunk >= valid_chunks) {
    // Padding columns (head_dim below the specialisation) stay zero.
    if (chunk < Cfg::kDataChunks)
#pragma unroll
      for (int i = 0; i < kRows / Cfg::kRowsPerPass; ++i)
        ptx::cp_async_16(tile + swizzle<Cfg>(row0 + i * Cfg::kRowsPerPass, chunk), src, false);
    return;
  }
  const T* from = src + row0 * row_stride + chunk * 8;
  const int64_t pass_stride = Cfg::kRowsPerPass * row_stride;
  // Not unrolled up to head_dim 128 on purpose: unrolled, nvcc keeps every pass's 64-bit
  // offset live across the main loop, which costs the kernel its spare registers (spills at
  // head_dim 128). At 256 (4 rows per pass, short key tiles) the loop overhead shows more.
  constexpr int kUnroll = Cfg::kHeadDim > 128 ? kRows / Cfg::kRowsPerPass : 1;
#pragma unroll kUnroll
  for (int i = 0; i < kRows / Cfg::kRowsPerPass; ++i, from += pass_stride)
    ptx::cp_async_16(tile + swizzle<Cfg>(row0 + i * Cfg::kRowsPerPass, chunk), from);
}

// Per-lane byte offsets (within an aligned group of 8 chunks) of chunk 2j + hi for
// j = 0..3, after the swizzle: ldmatrix addresses then differ between k-steps only by a
// compile-time constant plus one of these four registers.
struct SwizzledPairs {
  uint32_t off[4];
  __device__ __forceinline__ SwizzledPairs(int hi, int row_mod8) {
#pragma unroll
    for (int j = 0; j < 4; ++j) off[j] = static_cast<uint32_t>(((2 * j + hi) ^ row_mod8) * 16);
  }
  // Offset of chunk pair index `pair` (chunks 2·pair and 2·pair+1): the group of 8 is
  // additive, the position inside it comes from the table.
  __device__ __forceinline__ uint32_t operator()(int pair) const {
    return static_cast<uint32_t>(pair / 4) * 128u + off[pair % 4];
  }
};

template <class T, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    mma_forward_kernel(const AttentionParams p) {
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
  // Heaviest causal blocks (the last query rows) first: the short ones fill the tail.
  const int m_block = static_cast<int>(gridDim.x - 1 - blockIdx.x);
  const int64_t h = blockIdx.y, b = blockIdx.z, hk = h / p.heads_per_kv();
  const int seqlen_q = static_cast<int>(p.seqlen_q), seqlen_k = static_cast<int>(p.seqlen_k);
  const int row_start = m_block * kBlockM;
  const int causal_offset = seqlen_k - seqlen_q;  // row i sees keys j <= i + causal_offset
  const int valid_chunks = static_cast<int>(p.head_dim) / 8;

  const T* q_tile = bshd_ptr(static_cast<const T*>(p.q), b, int64_t(row_start), h,
                             p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  const T* k_head = bshd_ptr(static_cast<const T*>(p.k), b, int64_t(0), hk, p.k_batch_stride,
                             p.k_row_stride, p.k_head_stride);
  const T* v_head = bshd_ptr(static_cast<const T*>(p.v), b, int64_t(0), hk, p.v_batch_stride,
                             p.v_row_stride, p.v_head_stride);

  // Keys this block needs: with causal, tiles wholly above the last row's diagonal are
  // skipped. Tiles are visited last-first, so tile t covers keys from (n_tiles-1-t)·kBlockN.
  int n_keys = seqlen_k;
  if (p.is_causal()) {
    const int last_row = min(row_start + kBlockM, seqlen_q) - 1;
    n_keys = max(0, min(seqlen_k, last_row + causal_offset + 1));
  }
  const int n_tiles = (n_keys + kBlockN - 1) / kBlockN;

  load_tile_async<Cfg, kBlockM>(smem_q, q_tile, p.q_row_stride, seqlen_q - row_start,
                                valid_chunks);
  ptx::cp_async_commit();
  auto issue_tile = [&](int tile) {
    if (tile < n_tiles) {
      const int n0 = (n_tiles - 1 - tile) * kBlockN;
      const uint32_t stage = smem_kv + (tile % kStages) * 2 * Cfg::kTileBytes;
      if (n0 + kBlockN <= seqlen_k) {  // every tile but the one holding the end of K
        load_full_tile_async<Cfg, kBlockN>(stage, k_head + n0 * p.k_row_stride, p.k_row_stride,
                                           valid_chunks);
        load_full_tile_async<Cfg, kBlockN>(stage + Cfg::kTileBytes, v_head + n0 * p.v_row_stride,
                                           p.v_row_stride, valid_chunks);
      } else {
        load_tile_async<Cfg, kBlockN>(stage, k_head + n0 * p.k_row_stride, p.k_row_stride,
                                      seqlen_k - n0, valid_chunks);
        load_tile_async<Cfg, kBlockN>(stage + Cfg::kTileBytes, v_head + n0 * p.v_row_stride,
                                      p.v_row_stride, seqlen_k - n0, valid_chunks);
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

  // A negative scale is folded into Q by flipping its sign bits once in shared memory
  // (exact in fp16/bf16), so the softmax below only ever sees scale >= 0 and the row max
  // stays a max. scale_log2 is kept above 0 so that a masked score (-inf) still gives
  // 2^-inf = 0 when scale == 0 (every visible score then gives 2^0 = 1, as it should).
  const float scale = fabsf(p.scale);
  const float scale_log2 = fmaxf(scale * kLog2e, FLT_MIN);
  if (p.scale < 0.0f) {
    ptx::cp_async_wait<kStages - 1>();  // the Q group is the oldest
    __syncthreads();
    for (int i = threadIdx.x; i < Cfg::kQBytes / 4; i += Cfg::kThreads)
      reinterpret_cast<uint32_t*>(smem)[i] ^= 0x80008000u;
    __syncthreads();
  }

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
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int r = 0; r < 4; ++r) o[mt][dt][r] = 0.0f;
  // Rows g and g+8 of each m-tile. m is the row's running max of scale·S (natural units);
  // l is this lane's partial sum over its columns (the quad's four partials add up to l).
  // Set explicitly: nvcc 13.0 was seen to leave m = 0 instead of the member initializer's
  // -inf for state[1][*] (cuobjdump of the kMTiles = 2 kernels), which only shows as
  // rounding (m is a shift) but breaks the exact single-key rows.
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
    const int n0 = (n_tiles - 1 - tile) * kBlockN;

    // S = Q·Kᵀ  (kWarpRows, kBlockN), raw (unscaled) scores.
    float s[kMTiles][kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) s[mt][nt][r] = 0.0f;
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

    // Mask only the tiles that cross the end of K or the causal diagonal of the block's
    // first row; every other tile is fully visible to every row of the block.
    const bool needs_mask = n0 + kBlockN > seqlen_k ||
                            (p.is_causal() && n0 + kBlockN - 1 > row_start + causal_offset);
    if (needs_mask) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = row_start + warp_row0 + mt * 16 + g + 8 * half;
          const int key_end = p.is_causal() ? min(seqlen_k, row + causal_offset + 1) : seqlen_k;
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (n0 + nt * 8 + 2 * t + e >= key_end) s[mt][nt][2 * half + e] = kNegInf;
        }
    }

    // Online softmax; P overwrites S (fp32), then is packed into A fragments of P·V.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float row_max = kNegInf;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
          row_max = fmaxf(row_max, fmaxf(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]));
        // The quad's four lanes hold the row's columns.
        row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
        row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
        const float block_max = row_max == kNegInf ? kNegInf : row_max * scale;
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
        // P = exp(scale·s - m) = 2^(s·scale·log2e - m·log2e): one FFMA + one MUFU.EX2.
        const float shift = safe_shift(st.m) * kLog2e;
        float row_sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[mt][nt][2 * half + e];
            x = ptx::exp2_approx(fmaf(x, scale_log2, -shift));
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
      for (int mt = 0; mt < kMTiles; ++mt) {
        pa[mt][0] = ptx::pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = ptx::pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = ptx::pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = ptx::pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
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

  const int64_t lse_row0 = (b * p.heads_q + h) * p.seqlen_q;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      SoftmaxState<float> st = state[mt][half];
      st.l += __shfl_xor_sync(0xffffffffu, st.l, 1);
      st.l += __shfl_xor_sync(0xffffffffu, st.l, 2);
      const float inv_l = output_scale(st);  // 0 for a fully masked row
      const int local_row = warp_row0 + mt * 16 + g + 8 * half;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        // Conflict-free: the quad writes one 16-byte chunk, the 8 rows 8 distinct ones.
        const uint32_t packed =
            ptx::pack2<T>(o[mt][dt][2 * half] * inv_l, o[mt][dt][2 * half + 1] * inv_l);
        *reinterpret_cast<uint32_t*>(smem + swizzle<Cfg>(local_row, dt) + 4 * t) = packed;
      }
      const int row = row_start + local_row;
      if (p.lse != nullptr && t == 0 && row < seqlen_q) p.lse[lse_row0 + row] = log_sum_exp(st);
    }
  __syncwarp();

  // Each warp copies its own rows out with 16-byte stores, masked to the true head_dim.
  constexpr int kLanesPerRow = Cfg::kRowChunks < 32 ? Cfg::kRowChunks : 32;
  constexpr int kRowsPerStep = 32 / kLanesPerRow;
  T* o_tile = bshd_ptr(static_cast<T*>(p.o), b, int64_t(row_start), h, p.o_batch_stride,
                       p.o_row_stride, p.o_head_stride);
#pragma unroll
  for (int r = lane / kLanesPerRow; r < Cfg::kWarpRows; r += kRowsPerStep) {
    const int local_row = warp_row0 + r;
    if (row_start + local_row >= seqlen_q) break;
#pragma unroll
    for (int chunk = lane % kLanesPerRow; chunk < Cfg::kRowChunks; chunk += kLanesPerRow) {
      if (chunk >= valid_chunks) break;
      const uint4 value = *reinterpret_cast<const uint4*>(smem + swizzle<Cfg>(local_row, chunk));
      *reinterpret_cast<uint4*>(o_tile + local_row * p.o_row_stride + chunk * 8) = value;
    }
  }
}

// Launches the kernel for one configuration on `stream`.
template <class T, class Cfg>
void launch_mma_forward(const AttentionParams& p, cudaStream_t stream) {
  auto* kernel = &mma_forward_kernel<T, Cfg>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  Cfg::kSmemBytes),
             "cudaFuncSetAttribute(mma_forward_kernel)");
  const dim3 grid(static_cast<unsigned>((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM),
                  static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  check_launch("mma_forward_kernel");
}

}  // namespace flashtile::detail::mma
