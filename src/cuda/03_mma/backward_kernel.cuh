// Journey step 3b — the cuda_mma backward: FlashAttention-2's algorithm on mma.sync
// m16n8k16 (fp16/bf16 operands, fp32 accumulators), sm_80+. Formulas: docs/BACKWARD.md.
//
// Three passes, one stream:
//  1. backward_rowsum_kernel: D_i = rowsum(dO_i ∘ O_i) in fp32 (laid out as the LSE), and
//     the sinks' per-block partials −Σ_i exp(σ_h − lse_i)·D_i; it zeroes the fp32 dQ
//     accumulator beside them.
//  2. mma_backward_kernel: one CTA per (key block of kBlockN keys, kv head, batch entry).
//     K_j and V_j stay in shared memory; each warp owns kWarpKeys (16 or 32) keys and
//     accumulates their dK and dV rows (all of the head dim, or half) in fp32 registers. The
//     CTA walks the query heads of its kv head's group (GQA: the group's sum is formed in
//     registers, no partials, no reduction pass, deterministic by construction) and, per
//     head, the query blocks query_blocks() names (the mask is evaluated only where
//     needs_mask says). Per (query block, key block), in chunks of kChunkRows query rows:
//       Sᵀ = K·Qᵀ and dPᵀ − D = V·dOᵀ − D   (each warp: its keys × its share of the rows)
//       Pᵀ = exp2(logit·log2e − lse·log2e),  dSᵀ = Pᵀ∘(dPᵀ − D)∘∂logit/∂qk
//       dV += Pᵀ·dO,  dK += dSᵀ·Q
//       dQ_i += dS·K  (warps split the kBlockM × d tile, A from dSᵀ in shared memory)
//       through 8-byte fp32 reductions into the workspace accumulator, or, deterministic,
//       the same adds taken in key-block order behind a per-(batch, head, query block)
//       counter.
//     Computing the transposed products (keys as the mma's M) is what lets a 16-key warp
//     feed dV and dK from its accumulators (only dSᵀ goes through shared memory, one
//     barrier a step). 32-key warps are FlashAttention-2's arrangement of the same products:
//     each fragment feeds two m-tiles (25% fewer LDSM at d=128), Pᵀ and dSᵀ cross warps
//     through shared memory, two barriers a step.
//  3. backward_dq_kernel converts the fp32 dQ accumulator to q's dtype with dq's strides;
//     backward_dsinks_kernel sums the sinks' partials in a fixed order.
//
// Layout conventions as kernel.cuh (shared pieces: pieces.cuh, tile_io.cuh): lane = 4·g + t; a 16x8 fp32 accumulator tile holds
// rows g and g+8, columns 2t and 2t+1.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attn/block_range.hpp"
#include "attn/features.hpp"
#include "attn/seqlen.hpp"
#include "attn/variant.hpp"
#include "cuda/03_mma/backward_passes.cuh"
#include "cuda/03_mma/pieces.cuh"
#include "cuda/03_mma/tile_io.cuh"
#include "cuda/common.cuh"
#include "cuda/mma_fragment.cuh"
#include "cuda/ptx/mma.cuh"

namespace flashtile::detail::mma {

// One backward configuration.
//   kHeadDim  : specialised head dim (smaller dims are zero-padded, as in the forward)
//   kBlockM   : query rows per step of the loop
//   kNWarps   : warps per CTA, 16 keys' worth each: a CTA holds kBlockN = 16·kNWarps keys,
//               which kKeyGroups = kBlockN / kWarpKeys warps split kWarpKeys apiece
//   kMinBlocks: CTAs per SM asked of the register allocator
//   kChunkRows: query rows of Sᵀ and dPᵀ the CTA holds at once (a step walks kBlockM /
//               kChunkRows chunks), kChunkRows / kRowGroups of them each warp's: fewer rows
//               free registers, more rows read the K and V fragments fewer times
//   kDqWarpMTiles: 16-row m-tiles of dQ = dS·K per warp. Each k-step of that product reads
//               one dS fragment per m-tile and one K fragment per 16 columns, so a squarer
//               warp tile reads fewer: at 128 keys, 1 m-tile of 64 columns takes 40 LDSM a
//               step, 2 m-tiles of 32 columns 32 (same HMMA, same registers, same adds)
//   kWarpKeys : keys a warp owns. 16: each warp takes all of a chunk's rows in Sᵀ/dPᵀ and all
//               of dV/dK's columns, so Pᵀ and dSᵀ feed dV and dK straight from its
//               accumulators (only dSᵀ goes to shared memory, one barrier a step). 32
//               (FlashAttention-2's warp layout): two row groups split Sᵀ/dPᵀ and two column
//               groups dV/dK, each K/V and Q/dO fragment feeds two m-tiles, and Pᵀ and dSᵀ
//               cross warps through shared memory (two barriers a step)
template <int kHeadDim_, int kBlockM_, int kNWarps_, int kMinBlocks_, int kChunkRows_ = kBlockM_,
          int kDqWarpMTiles_ = 1, int kWarpKeys_ = 16>
struct MmaBackwardConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kChunkRows = kChunkRows_;
  static constexpr int kDqWarpMTiles = kDqWarpMTiles_;
  static constexpr int kWarpKeys = kWarpKeys_;
  static constexpr int kChunks = kBlockM / kChunkRows;
  static constexpr int kBlockN = 16 * kNWarps;
  static constexpr int kThreads = 32 * kNWarps;

  static constexpr int kKSteps = kHeadDim / 16;  // k-steps of K·Qᵀ and V·dOᵀ
  static constexpr int kDTiles = kHeadDim / 8;   // 8-column tiles of dK, dV
  // Sᵀ/dPᵀ and dV/dK warp tiles: warp w takes keys kWarpKeys·(w % kKeyGroups).. and, of
  // Sᵀ/dPᵀ, kWarpRows rows of each chunk (row group w / kKeyGroups), of dV/dK kKvDTiles
  // 8-column tiles (column group w / kKeyGroups).
  static constexpr int kKeyMTiles = kWarpKeys / 16;
  static constexpr bool kPtInShared = kKeyMTiles > 1;  // Pᵀ crosses warps (see kWarpKeys)
  static constexpr int kKeyGroups = kBlockN / kWarpKeys;
  static constexpr int kRowGroups = kNWarps / kKeyGroups;
  static constexpr int kWarpRows = kChunkRows / kRowGroups;
  static constexpr int kKvDTiles = kDTiles / kRowGroups;
  static constexpr int kKeySteps = kBlockN / 16;  // k-steps of dS·K
  // dQ = dS·K, (kBlockM rows, kHeadDim) per step: warp w takes the kDqWarpMTiles m-tiles
  // of row group w % kDqRowGroups and column group w / kDqRowGroups.
  static constexpr int kDqMTiles = kBlockM / 16;
  static constexpr int kDqRowGroups = kDqMTiles / kDqWarpMTiles;
  static constexpr int kDqGroups = kNWarps / kDqRowGroups;
  static constexpr int kDqDTiles = kDTiles / kDqGroups;  // 8-column tiles per warp

  // Shared rows as the forward's (tile_io.cuh reads these names).
  static constexpr int kRowChunks = (kHeadDim + 63) / 64 * 8;
  static constexpr int kDataChunks = kHeadDim / 8;
  static constexpr int kRowBytes = kRowChunks * 16;
  static constexpr int kRowsPerPass = kThreads / kRowChunks;
  static constexpr int kKeyTileBytes = kBlockN * kRowBytes;  // K or V: (kBlockN, head dim)
  static constexpr int kRowTileBytes = kBlockM * kRowBytes;  // Q or dO: (kBlockM, head dim)
  // dSᵀ: (kBlockN keys, kBlockM rows) 16-bit, swizzled rows of kBlockM / 8 chunks.
  static constexpr int kDsRowChunks = kBlockM / 8;
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;
  // [ K | V | Q stage 0, 1 | dO stage 0, 1 | Pᵀ, dSᵀ or dSᵀ stage 0, 1 | lse·log2e stage 0, 1 |
  //   D stage 0, 1 ] (Pᵀ is dSᵀ's shape). With Pᵀ in registers dSᵀ alternates by step, so
  // that one barrier per step serves; with Pᵀ in shared memory the step's second barrier
  // frees both.
  static constexpr int kVOffset = kKeyTileBytes;
  static constexpr int kQOffset = 2 * kKeyTileBytes;
  static constexpr int kDoOffset = kQOffset + 2 * kRowTileBytes;
  static constexpr int kPOffset = kDoOffset + 2 * kRowTileBytes;  // kPtInShared only
  static constexpr int kDsOffset = kPOffset + (kPtInShared ? kDsBytes : 0);
  static constexpr int kDsBuffers = kPtInShared ? 1 : 2;
  static constexpr int kLseOffset = kDsOffset + kDsBuffers * kDsBytes;
  static constexpr int kDOffset = kLseOffset + 2 * kBlockM * 4;
  static constexpr int kSmemBytes = kDOffset + 2 * kBlockM * 4;

  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 128,
                "backward head dim: a multiple of 16, <= 128 (dK and dV live in registers)");
  static_assert(kBlockM % 64 == 0, "dSᵀ rows are whole groups of 8 swizzled chunks");
  static_assert(kChunkRows % 16 == 0 && kBlockM % kChunkRows == 0,
                "a chunk is whole k-steps of Pᵀ·dO, and the block whole chunks");
  static_assert((kWarpKeys == 16 || kWarpKeys == 32) && kBlockN % kWarpKeys == 0 &&
                    kNWarps % kKeyGroups == 0,
                "warps split the keys 16 or 32 apiece and the rows and columns evenly");
  static_assert(kWarpRows % 16 == 0 && kKvDTiles % 2 == 0,
                "a warp's rows are whole k-steps, its dV/dK columns whole d-tile pairs");
  static_assert(kDqMTiles % kDqWarpMTiles == 0, "dQ's row groups are whole m-tiles");
  static_assert(kNWarps % kDqRowGroups == 0, "the warps split dQ's row groups evenly");
  static_assert(kDTiles % (2 * kDqGroups) == 0, "each warp's dQ columns are whole d-tile pairs");
  static_assert(kThreads >= kBlockM, "one thread stages each query row's lse and D");
  static_assert(kThreads % kRowChunks == 0, "a cp.async pass covers whole rows");
  static_assert(kBlockM % kRowsPerPass == 0 && kBlockN % kRowsPerPass == 0,
                "tiles are a whole number of cp.async passes");
  static_assert(32 % kRowChunks == 0 || kRowChunks % 32 == 0,
                "the output copy maps lanes onto whole rows");
};

// The dSᵀ tile as tile_io.cuh's swizzle sees it.
template <class Cfg>
struct DsTile {
  static constexpr int kRowChunks = Cfg::kDsRowChunks;
};

template <class T, class Cfg, class Logits, bool kAligned>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    mma_backward_kernel(const BackwardParams bp, const BackwardScratch ws) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kRowBytes = Cfg::kRowBytes;
  constexpr int kKSteps = Cfg::kKSteps;
  constexpr int kChunkRows = Cfg::kChunkRows;
  constexpr int kDsRowBytes = Cfg::kDsRowChunks * 16;
  constexpr float kLog2e = 1.4426950408889634f;
  const AttentionParams& p = bp.fwd;

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t smem_base = ptx::smem_addr(smem);
  const uint32_t smem_k = smem_base, smem_v = smem_base + Cfg::kVOffset;
  float* const smem_lse = reinterpret_cast<float*>(smem + Cfg::kLseOffset);  // (2, kBlockM)
  float* const smem_d = reinterpret_cast<float*>(smem + Cfg::kDOffset);      // (2, kBlockM)

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t hk = blockIdx.y, b = blockIdx.z;
  const int group = static_cast<int>(p.heads_per_kv());
  const SeqlenInfo<int> seq(p, b);
  const int key0 = blockIdx.x * kBlockN;
  if (key0 >= seq.seqlen_k) return;  // varlen: past this sequence's keys (zeroed before)
  const Mask<int> mask = seq.mask(p);
  const int key_end = min(key0 + kBlockN, seq.seqlen_k);
  // A partial key block holds zero-filled keys past seqlen_k: the mask removes them.
  const bool partial_keys = key_end - key0 < kBlockN;
  const QueryBlocks<int> blocks = query_blocks(mask, key0, key_end, kBlockM);
  const int n_blocks = blocks.count();
  const int steps = group * n_blocks;  // (query head of the group, query block) pairs
  const int head_dim = static_cast<int>(p.head_dim);
  const int valid_chunks = head_dim / 8;

  int q_granule = 8, k_granule = 8, v_granule = 8, do_granule = 8;
  if constexpr (!kAligned) {
    q_granule = access_granule(p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
    k_granule = access_granule(p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
    v_granule = access_granule(p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
    do_granule = access_granule(bp.dout, bp.dout_strides.batch, bp.dout_strides.row,
                                bp.dout_strides.head);
  }
  // Copies `rows` rows of a tensor (row 0 at src) into the shared tile at byte offset `at`.
  auto load_rows = [&](auto rows_tag, uint32_t at, const T* src, int64_t row_stride,
                       int valid_rows, int granule) {
    constexpr int kRows = decltype(rows_tag)::value;
    if constexpr (kAligned)
      load_tile_async<Cfg, kRows>(smem_base + at, src, row_stride, valid_rows, valid_chunks);
    else
      load_tile_narrow<Cfg, kRows>(smem + at, src, row_stride, valid_rows, head_dim, granule);
  };
  using KeyRows = std::integral_constant<int, kBlockN>;
  using QueryRows = std::integral_constant<int, kBlockM>;

  load_rows(KeyRows{}, 0, static_cast<const T*>(p.k) + seq.k_offset(p, b, key0, hk),
            p.k_row_stride, seq.seqlen_k - key0, k_granule);
  load_rows(KeyRows{}, Cfg::kVOffset, static_cast<const T*>(p.v) + seq.v_offset(p, b, key0, hk),
            p.v_row_stride, seq.seqlen_k - key0, v_granule);

  // Step s is query head `head_of(s)` and query block `block_of(s)`.
  auto head_of = [&](int s) { return hk * group + s / n_blocks; };
  auto block_of = [&](int s) { return blocks.begin + s % n_blocks; };
  // Issues step s's Q and dO tiles into stage s % 2 and returns its lse·log2e and D for
  // this thread's row (threads < kBlockM), which the caller stores once the stage is free.
  // Rows past seqlen_q, and rows that see nothing (lse = −inf), get lse = +inf: P = 0.
  auto issue_step = [&](int s, float& lse_log2, float& d_row) {
    lse_log2 = INFINITY, d_row = 0.0f;
    if (s >= steps) return;
    const int64_t h = head_of(s);
    const int row0 = block_of(s) * kBlockM;
    const int stage = s % 2;
    load_rows(QueryRows{}, Cfg::kQOffset + stage * Cfg::kRowTileBytes,
              static_cast<const T*>(p.q) + seq.q_offset(p, b, row0, h), p.q_row_stride,
              seq.seqlen_q - row0, q_granule);
    load_rows(QueryRows{}, Cfg::kDoOffset + stage * Cfg::kRowTileBytes,
              static_cast<const T*>(bp.dout) + seq.row_offset_q(bp.dout_strides, b, row0, h),
              bp.dout_strides.row, seq.seqlen_q - row0, do_granule);
    fetch_row_stats(bp, ws, seq, b, h, row0, kBlockM, lse_log2, d_row);
  };
  auto stage_row_stats = [&](int s, float lse_log2, float d_row) {
    mma::stage_row_stats(smem_lse, smem_d, kBlockM, s, lse_log2, d_row);
  };
  {
    float lse_log2, d_row;
    issue_step(0, lse_log2, d_row);
    stage_row_stats(0, lse_log2, d_row);
  }
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();  // K, V and step 0's tiles have landed for this thread ...
  __syncthreads();          // ... and for every thread, as have step 0's row stats

  // Warp tiles: warp w owns keys [warp_key0, +kWarpKeys) in Sᵀ/dPᵀ and dV/dK. In Sᵀ/dPᵀ it
  // takes rows [warp_row0, +kWarpRows) of each chunk; in dV/dK columns [kv_col0,
  // +8·kKvDTiles); in dQ its own tile. (With one row group the offsets are constants.)
  constexpr int kWarpRows = Cfg::kWarpRows, kRowTiles = Cfg::kWarpRows / 8;
  constexpr int kKvDTiles = Cfg::kKvDTiles, kKeyMTiles = Cfg::kKeyMTiles;
  constexpr bool kPtInShared = Cfg::kPtInShared;
  const int row_group = Cfg::kRowGroups == 1 ? 0 : warp / Cfg::kKeyGroups;
  const int warp_key0 = (Cfg::kRowGroups == 1 ? warp : warp % Cfg::kKeyGroups) * Cfg::kWarpKeys;
  const int warp_row0 = row_group * kWarpRows;
  const int kv_col0 = row_group * kKvDTiles * 8;
  // ldmatrix addressing (every fragment row is a multiple of 8 plus lane % 8, so the
  // swizzle's row % 8 is lane % 8 throughout).
  // A operand, rows = this warp's keys, from a row-major (keys, k) tile: K and V (k = head
  // dim), Pᵀ and dSᵀ (k = query rows): kernel.cuh's Q pattern; + 16 rows per m-tile.
  const uint32_t a_lane = (warp_key0 + lane % 16) * kRowBytes;
  const SwizzledPairs a_cols(lane / 16, lane % 8);
  // B operand from a row-major tile whose rows are the n dimension (Q or dO for Sᵀ, dPᵀ):
  // kernel.cuh's K pattern. The same addresses with .trans give dS's A operand from dSᵀ.
  const uint32_t bn_lane_row = (lane % 8 + (lane / 16) * 8);
  const SwizzledPairs bn_cols((lane / 8) % 2, lane % 8);
  // B operand from a row-major tile whose rows are the k dimension, through .trans (dO, Q
  // for dV, dK; K for dQ): kernel.cuh's V pattern.
  const uint32_t bk_lane_row = (lane % 8 + ((lane / 8) % 2) * 8);
  const SwizzledPairs bk_cols(lane / 16, lane % 8);

  // (kWarpKeys keys, columns kv_col0 + 8·kKvDTiles) fp32
  float dk[kKeyMTiles][kKvDTiles][4], dv[kKeyMTiles][kKvDTiles][4];
#pragma unroll
  for (int mt = 0; mt < kKeyMTiles; ++mt) zero_accumulators(dk[mt], dv[mt]);

  const float scale_log2 = p.scale * kLog2e;
  constexpr int kDqWarpMTiles = Cfg::kDqWarpMTiles;
  const int dq_mtile0 = (warp % Cfg::kDqRowGroups) * kDqWarpMTiles;
  const int dq_col0 = (warp / Cfg::kDqRowGroups) * Cfg::kDqDTiles * 8;
  // Column offsets that depend on the warp (a run-time value): computed once here, as
  // SwizzledPairs' table indexed at run time would live in local memory.
  auto swizzled_chunk = [&](int chunk) {
    return static_cast<uint32_t>(((chunk & ~7) + ((chunk & 7) ^ (lane % 8))) * 16);
  };
  uint32_t ds_cols[kDqWarpMTiles];  // dSᵀ's row chunks of each of this warp's dQ m-tiles
#pragma unroll
  for (int mt = 0; mt < kDqWarpMTiles; ++mt)
    ds_cols[mt] = swizzled_chunk(2 * (dq_mtile0 + mt) + (lane / 8) % 2);
  uint32_t dq_k_cols[Cfg::kDqDTiles / 2];
#pragma unroll
  for (int dp = 0; dp < Cfg::kDqDTiles / 2; ++dp)
    dq_k_cols[dp] = swizzled_chunk(dq_col0 / 8 + 2 * dp + lane / 16);
  // dO's and Q's column pairs of this warp's dV, dK with Pᵀ in shared memory (half the
  // columns; with all of them the constant-indexed bk_cols serves).
  uint32_t kv_cols[kPtInShared ? kKvDTiles / 2 : 1];
#pragma unroll
  for (int dp = 0; dp < (kPtInShared ? kKvDTiles / 2 : 0); ++dp)
    kv_cols[dp] = swizzled_chunk(kv_col0 / 8 + 2 * dp + lane / 16);
  // Stores a 16 x 16 fragment (A layout: rows g, g+8 of keys key_row.., row chunks
  // 2·q_step, 2·q_step+1) into the (keys, rows) tile at byte offset `tile`. Conflict-free:
  // each quad writes one 16-byte chunk, the 8 rows 8 distinct bank groups.
  auto store_transposed = [&](uint32_t tile, int key_row, int q_step, const uint32_t (&a)[4]) {
    unsigned char* bytes = smem + tile;
    *reinterpret_cast<uint32_t*>(bytes + swizzle<DsTile<Cfg>>(key_row, 2 * q_step) + 4 * t) = a[0];
    *reinterpret_cast<uint32_t*>(bytes + swizzle<DsTile<Cfg>>(key_row + 8, 2 * q_step) + 4 * t) = a[1];
    *reinterpret_cast<uint32_t*>(bytes + swizzle<DsTile<Cfg>>(key_row, 2 * q_step + 1) + 4 * t) = a[2];
    *reinterpret_cast<uint32_t*>(bytes + swizzle<DsTile<Cfg>>(key_row + 8, 2 * q_step + 1) + 4 * t) = a[3];
  };

  // dV += Pᵀ·dO and dK += dSᵀ·Q over k-step q_step (16 query rows) of the step's tiles:
  // A fragments pa, dsa (this warp's key m-tiles), B from dO and Q through .trans.
  auto accumulate_dv_dk = [&](uint32_t smem_q, uint32_t smem_do, int q_step,
                              const uint32_t (&pa)[kKeyMTiles][4],
                              const uint32_t (&dsa)[kKeyMTiles][4]) {
#pragma unroll
    for (int dp = 0; dp < kKvDTiles / 2; ++dp) {
      const uint32_t off =
          (bk_lane_row + q_step * 16) * kRowBytes + (kPtInShared ? kv_cols[dp] : bk_cols(dp));
      uint32_t dob[4], qb[4];
      ptx::ldmatrix_x4_trans(dob, smem_do + off);
      ptx::ldmatrix_x4_trans(qb, smem_q + off);
#pragma unroll
      for (int mt = 0; mt < kKeyMTiles; ++mt) {
        ptx::mma_m16n8k16<T>(dv[mt][2 * dp], pa[mt], dob[0], dob[1]);
        ptx::mma_m16n8k16<T>(dv[mt][2 * dp + 1], pa[mt], dob[2], dob[3]);
        ptx::mma_m16n8k16<T>(dk[mt][2 * dp], dsa[mt], qb[0], qb[1]);
        ptx::mma_m16n8k16<T>(dk[mt][2 * dp + 1], dsa[mt], qb[2], qb[3]);
      }
    }
  };

  for (int s = 0; s < steps; ++s) {
    // Pᵀ in registers: one barrier per step, after dSᵀ is written. Pᵀ in shared memory: a
    // second one, after Pᵀ and dSᵀ are written (they feed other warps' dV, dK and dQ), the
    // first closing the step. Either way stage (s+1) % 2 is free here: its last reads (step
    // s-1's products and row stats) came before step s-1's last barrier.
    float next_lse_log2, next_d;
    issue_step(s + 1, next_lse_log2, next_d);
    ptx::cp_async_commit();

    const int64_t h = head_of(s);
    const int m_block = block_of(s);
    const int row0 = m_block * kBlockM;
    const int stage = s % 2;
    const uint32_t smem_q = smem_base + Cfg::kQOffset + stage * Cfg::kRowTileBytes;
    const uint32_t smem_do = smem_base + Cfg::kDoOffset + stage * Cfg::kRowTileBytes;
    // This step's dSᵀ buffer. Two buffers (Pᵀ in registers): the other one may still be read
    // by a slower warp's dQ of step s-1; this one was last read in step s-2, before step
    // s-1's barrier. One buffer: step s-1's reads ended before its closing barrier.
    const uint32_t ds_at = Cfg::kDsOffset + (kPtInShared ? 0 : stage * Cfg::kDsBytes);
    const LogitsTransform<float> logits = logits_transform<float>(p, b, h);

    const float* lse_row = smem_lse + stage * kBlockM;
    const float* d_row = smem_d + stage * kBlockM;
    const bool masked = partial_keys || blocks.needs_mask(m_block);
    // The query block in chunks of kChunkRows rows (kWarpRows of them this warp's): each
    // warp holds Sᵀ and dPᵀ of one chunk at a time, at the price of reading its K and V
    // fragments once per chunk.
#pragma unroll
    for (int chunk = 0; chunk < Cfg::kChunks; ++chunk) {
      const int chunk_row0 = chunk * kChunkRows + warp_row0;  // this warp's first row
      // Sᵀ = K·Qᵀ and dPᵀ − D = V·dOᵀ − D: (kWarpKeys keys, kWarpRows rows) per warp, raw
      // scores. The dPᵀ accumulator starts at −D_i of its column's row, so dS needs no D.
      float st[kKeyMTiles][kRowTiles][4], dpt[kKeyMTiles][kRowTiles][4];
      zero_accumulator(st);
#pragma unroll
      for (int nt = 0; nt < kRowTiles; ++nt) {
        const float2 dd = *reinterpret_cast<const float2*>(d_row + chunk_row0 + nt * 8 + 2 * t);
#pragma unroll
        for (int mt = 0; mt < kKeyMTiles; ++mt) {
          dpt[mt][nt][0] = dpt[mt][nt][2] = -dd.x;
          dpt[mt][nt][1] = dpt[mt][nt][3] = -dd.y;
        }
      }
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        uint32_t ak[kKeyMTiles][4], av[kKeyMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kKeyMTiles; ++mt) {
          ptx::ldmatrix_x4(ak[mt], smem_k + a_lane + mt * 16 * kRowBytes + a_cols(ks));
          ptx::ldmatrix_x4(av[mt], smem_v + a_lane + mt * 16 * kRowBytes + a_cols(ks));
        }
#pragma unroll
        for (int np = 0; np < kRowTiles / 2; ++np) {
          const uint32_t row_off = (bn_lane_row + chunk_row0 + np * 16) * kRowBytes + bn_cols(ks);
          uint32_t qb[4], dob[4];
          ptx::ldmatrix_x4(qb, smem_q + row_off);
          ptx::ldmatrix_x4(dob, smem_do + row_off);
#pragma unroll
          for (int mt = 0; mt < kKeyMTiles; ++mt) {
            ptx::mma_m16n8k16<T>(st[mt][2 * np], ak[mt], qb[0], qb[1]);
            ptx::mma_m16n8k16<T>(st[mt][2 * np + 1], ak[mt], qb[2], qb[3]);
            ptx::mma_m16n8k16<T>(dpt[mt][2 * np], av[mt], dob[0], dob[1]);
            ptx::mma_m16n8k16<T>(dpt[mt][2 * np + 1], av[mt], dob[2], dob[3]);
          }
        }
      }

      // Pᵀ and dSᵀ in place of Sᵀ and dPᵀ. Element (mt, nt, 2·half + e) is key
      // key0 + warp_key0 + 16·mt + g + 8·half and query row row0 + chunk_row0 + nt·8 + 2t + e.
      // Two copies behind one uniform branch: in the unmasked one (every step off the
      // mask's edges) the exp2 of the chunk are one basic block that ptxas can overlap;
      // a test per element would cut it into a block per element.
      auto probabilities_and_ds = [&](auto masked_tag) {
        constexpr bool kMasked = decltype(masked_tag)::value;
#pragma unroll
        for (int nt = 0; nt < kRowTiles; ++nt) {
          const float2 lse2 = *reinterpret_cast<const float2*>(lse_row + chunk_row0 + nt * 8 + 2 * t);
#pragma unroll
          for (int mt = 0; mt < kKeyMTiles; ++mt)
#pragma unroll
            for (int half = 0; half < 2; ++half)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int key = key0 + warp_key0 + 16 * mt + g + 8 * half;
                const int row = row0 + chunk_row0 + nt * 8 + 2 * t + e;
                // dpt holds dP − D.
                probability_and_ds<Logits, kMasked>(logits, mask, scale_log2,
                                                    e == 0 ? lse2.x : lse2.y, row, key,
                                                    st[mt][nt][2 * half + e],
                                                    dpt[mt][nt][2 * half + e]);
              }
        }
      };
      if (masked)
        probabilities_and_ds(std::true_type{});
      else
        probabilities_and_ds(std::false_type{});

      // dSᵀ (and Pᵀ, when it crosses warps) to shared memory as 16-bit (keys, rows) tiles;
      // the A fragment of k-step kk is n-tiles 2kk, 2kk+1 of the accumulators (as the
      // forward's P·V). Pᵀ in registers: dV and dK take this chunk's rows right here.
#pragma unroll
      for (int mt = 0; mt < kKeyMTiles; ++mt)
#pragma unroll
        for (int kk = 0; kk < kRowTiles / 2; ++kk) {
          const int q_step = chunk_row0 / 16 + kk;  // k-step in the whole block
          uint32_t pa[1][4], dsa[1][4];
          ptx::accumulators_to_a<T>(st[mt][2 * kk], st[mt][2 * kk + 1], pa[0]);
          ptx::accumulators_to_a<T>(dpt[mt][2 * kk], dpt[mt][2 * kk + 1], dsa[0]);
          const int key_row = warp_key0 + 16 * mt + g;
          if constexpr (kPtInShared) store_transposed(Cfg::kPOffset, key_row, q_step, pa[0]);
          store_transposed(ds_at, key_row, q_step, dsa[0]);
          if constexpr (!kPtInShared) accumulate_dv_dk(smem_q, smem_do, q_step, pa, dsa);
        }
    }
    stage_row_stats(s + 1, next_lse_log2, next_d);
    if constexpr (kPtInShared) {
      __syncthreads();  // Pᵀ and dSᵀ are whole
      // dV, dK over the block's rows, A from Pᵀ and dSᵀ (other warps' rows among them).
      const uint32_t pt_lane = (warp_key0 + lane % 16) * kDsRowBytes;
#pragma unroll
      for (int q_step = 0; q_step < kBlockM / 16; ++q_step) {
        uint32_t pa[kKeyMTiles][4], dsa[kKeyMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kKeyMTiles; ++mt) {
          const uint32_t at = pt_lane + mt * 16 * kDsRowBytes + a_cols(q_step);
          ptx::ldmatrix_x4(pa[mt], smem_base + Cfg::kPOffset + at);
          ptx::ldmatrix_x4(dsa[mt], smem_base + ds_at + at);
        }
        accumulate_dv_dk(smem_q, smem_do, q_step, pa, dsa);
      }
    } else {
      ptx::cp_async_wait<0>();  // step s+1's tiles have landed for this thread ...
      __syncthreads();          // ... and for every thread; dSᵀ is whole
    }

    // dQ_i += dS·K: this warp's m-tiles and columns, (16·kDqWarpMTiles rows, 8·kDqDTiles
    // columns); A from dSᵀ through .trans, B from K, each fragment read once a k-step.
    float dq[kDqWarpMTiles][Cfg::kDqDTiles][4];
    zero_accumulator(dq);
#pragma unroll
    for (int ks = 0; ks < Cfg::kKeySteps; ++ks) {
      uint32_t a[kDqWarpMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kDqWarpMTiles; ++mt)
        ptx::ldmatrix_x4_trans(
            a[mt], smem_base + ds_at + (bn_lane_row + ks * 16) * kDsRowBytes + ds_cols[mt]);
#pragma unroll
      for (int dp = 0; dp < Cfg::kDqDTiles / 2; ++dp) {
        uint32_t kb[4];
        ptx::ldmatrix_x4_trans(kb, smem_k + (bk_lane_row + ks * 16) * kRowBytes + dq_k_cols[dp]);
#pragma unroll
        for (int mt = 0; mt < kDqWarpMTiles; ++mt) {
          ptx::mma_m16n8k16<T>(dq[mt][2 * dp], a[mt], kb[0], kb[1]);
          ptx::mma_m16n8k16<T>(dq[mt][2 * dp + 1], a[mt], kb[2], kb[3]);
        }
      }
    }
    int* const counter =
        wait_for_dq_turn(bp, ws, seq, mask, b, h, m_block, kBlockM, kBlockN);  // or null
    // Each lane adds its two column pairs of every 8-column tile (rows g and g+8, columns
    // 2t, 2t+1) with one 8-byte reduction each: twice the requests of 16-byte ones, but no
    // shuffles to gather four columns (aligned: the accumulator starts 256-byte aligned, its
    // rows and heads are multiples of kHeadDim floats, the columns even).
#pragma unroll
    for (int mt = 0; mt < kDqWarpMTiles; ++mt) {
      const int dq_row_lo = row0 + (dq_mtile0 + mt) * 16 + g, dq_row_hi = dq_row_lo + 8;
      float* const dq_lo = dq_row_lo < seq.seqlen_q
                               ? ws.dq + seq.row_offset_q(ws.dq_strides, b, dq_row_lo, h) +
                                     dq_col0 + 2 * t
                               : nullptr;
      float* const dq_hi = dq_row_hi < seq.seqlen_q
                               ? ws.dq + seq.row_offset_q(ws.dq_strides, b, dq_row_hi, h) +
                                     dq_col0 + 2 * t
                               : nullptr;
#pragma unroll
      for (int dt = 0; dt < Cfg::kDqDTiles; ++dt) {
        if (dq_lo != nullptr)
          atomic_add_pair(dq_lo + dt * 8, make_float2(dq[mt][dt][0], dq[mt][dt][1]));
        if (dq_hi != nullptr)
          atomic_add_pair(dq_hi + dt * 8, make_float2(dq[mt][dt][2], dq[mt][dt][3]));
      }
    }
    pass_dq_turn(bp, counter);
    if constexpr (kPtInShared) {
      ptx::cp_async_wait<0>();  // step s+1's tiles have landed for this thread ...
      __syncthreads();          // ... and for every thread, who are all done with step s
    }
  }

  // Epilogue: dK and dV (this warp's keys by kv_col0 + 8·kKvDTiles columns) through shared
  // memory (K and V's tiles, free once every warp is past the loop) to 16-byte (or the
  // narrow path's) stores, each warp 16 whole rows.
  if constexpr (!kPtInShared) {
    ptx::cp_async_wait<0>();
    __syncthreads();
  }  // (else the loop's closing barrier, or the prologue's, serves)
#pragma unroll
  for (int mt = 0; mt < kKeyMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int local_key = warp_key0 + 16 * mt + g + 8 * half;
#pragma unroll
      for (int dt = 0; dt < kKvDTiles; ++dt) {
        // (The address after the value, as written: the 16-key path's PTX as before.)
        const int chunk = kv_col0 / 8 + dt;
        *reinterpret_cast<uint32_t*>(smem + swizzle<Cfg>(local_key, chunk) + 4 * t) =
            ptx::pack2<T>(dk[mt][dt][2 * half], dk[mt][dt][2 * half + 1]);
        *reinterpret_cast<uint32_t*>(smem + Cfg::kVOffset + swizzle<Cfg>(local_key, chunk) + 4 * t) =
            ptx::pack2<T>(dv[mt][dt][2 * half], dv[mt][dt][2 * half + 1]);
      }
    }
  // The rows a warp copies out are its own only with one column group.
  if constexpr (kPtInShared)
    __syncthreads();
  else
    __syncwarp();
  const int out_key0 = warp * 16;
  constexpr int kLanesPerRow = Cfg::kRowChunks < 32 ? Cfg::kRowChunks : 32;
  constexpr int kRowsPerStep = 32 / kLanesPerRow;
  int dk_granule = 8, dv_granule = 8;
  if constexpr (!kAligned) {
    dk_granule = access_granule(bp.dk, bp.dk_strides.batch, bp.dk_strides.row, bp.dk_strides.head);
    dv_granule = access_granule(bp.dv, bp.dv_strides.batch, bp.dv_strides.row, bp.dv_strides.head);
  }
  const int out_chunks = (head_dim + 7) / 8;
  for (int r = lane / kLanesPerRow; r < 16; r += kRowsPerStep) {
    const int local_key = out_key0 + r;
    const int key = key0 + local_key;
    if (key >= seq.seqlen_k) break;
    T* dk_row = static_cast<T*>(bp.dk) + seq.row_offset_k(bp.dk_strides, b, key, hk);
    T* dv_row = static_cast<T*>(bp.dv) + seq.row_offset_k(bp.dv_strides, b, key, hk);
    for (int chunk = lane % kLanesPerRow; chunk < out_chunks; chunk += kLanesPerRow) {
      const uint4 k_value = *reinterpret_cast<const uint4*>(smem + swizzle<Cfg>(local_key, chunk));
      const uint4 v_value =
          *reinterpret_cast<const uint4*>(smem + Cfg::kVOffset + swizzle<Cfg>(local_key, chunk));
      if constexpr (kAligned) {
        *reinterpret_cast<uint4*>(dk_row + chunk * 8) = k_value;
        *reinterpret_cast<uint4*>(dv_row + chunk * 8) = v_value;
      } else {
        const int valid = chunk_elements(chunk, head_dim);
        store_chunk_narrow(reinterpret_cast<uint16_t*>(dk_row + chunk * 8), k_value, valid,
                           dk_granule);
        store_chunk_narrow(reinterpret_cast<uint16_t*>(dv_row + chunk * 8), v_value, valid,
                           dv_granule);
      }
    }
  }
}

template <class T, class Cfg, class Logits, bool kAligned>
void launch_mma_backward_main(const BackwardParams& bp, const BackwardScratch& ws,
                              cudaStream_t stream) {
  launch_backward_main<Cfg>(&mma_backward_kernel<T, Cfg, Logits, kAligned>, "mma_backward_kernel",
                            bp, ws, stream);
}

// The whole backward for one head-dim configuration, the workspace at `workspace`.
template <class T, class Cfg>
void run_mma_backward_passes(const BackwardParams& bp, void* workspace, cudaStream_t stream) {
  run_backward_passes<T>(bp, workspace, stream, Cfg::kHeadDim, Cfg::kBlockM,
                         [&](const BackwardScratch& ws) {
                           if (backward_rows_aligned_16(bp)) {
                             with_logits_flags(bp.fwd, [&](auto logits) {
                               launch_mma_backward_main<T, Cfg, decltype(logits), true>(bp, ws, stream);
                             });
                           } else {
                             launch_mma_backward_main<T, Cfg, RuntimeLogits, false>(bp, ws, stream);
                           }
                         });
}

}  // namespace flashtile::detail::mma
