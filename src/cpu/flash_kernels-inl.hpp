// cpu_flash per-target SIMD code: the vectorised exp, the lane-wise online-softmax step,
// the Q·Kᵀ and P·V register-blocked micro-kernels and one query block's whole loop.
//
// This header is compiled once per Highway target: flash_hwy.cpp (and the micro-benchmarks)
// include it through hwy/foreach_target.h, so it has Highway's re-inclusion guard instead
// of #pragma once. Nothing here is target-specific by hand except the tile shapes.
//
// Layout: every task owns one block of kBlockM query rows and walks the keys in blocks of
// kBlockN. Scores are kept transposed, S^T (kBlockN, kBlockM): a vector holds one key's
// scores for L consecutive query rows. Then
//  - Q·Kᵀ broadcasts K[j][c] and multiplies a vector of Q^T[c][i..i+L) (Q is transposed
//    once per task), so no K block is ever transposed;
//  - the softmax statistics m and l of L rows live in one vector and the row maximum is
//    an element-wise max over keys: no horizontal reduction anywhere;
//  - P·V broadcasts P[i][j] (= P^T[j][i]) and multiplies a vector of V[j][c..c+L), so V is
//    used row-major as stored; O stays row-major like the output.
// K and V blocks are copied to contiguous f32 (converting f16/bf16) before use.
//
// Variants come from the shared core (src/attn/): the key blocks a task visits and which of
// them need the mask from block_range.hpp, per-row bounds inside those from mask.hpp, the
// softcap and ALiBi of variant.hpp applied to each Q·Kᵀ tile (specialised on features.hpp's
// flags), sinks and the finalisation from softmax_state.hpp, and every offset and LSE index
// of a dense or varlen sequence from seqlen.hpp.
#if defined(FLASHTILE_CPU_FLASH_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FLASHTILE_CPU_FLASH_KERNELS_INL_H_
#undef FLASHTILE_CPU_FLASH_KERNELS_INL_H_
#else
#define FLASHTILE_CPU_FLASH_KERNELS_INL_H_
#endif

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "api/params.hpp"
#include "attn/block_range.hpp"
#include "attn/features.hpp"
#include "attn/mask.hpp"
#include "attn/seqlen.hpp"
#include "attn/softmax_state.hpp"
#include "attn/split_kv.hpp"
#include "attn/variant.hpp"
#include "common/numeric.hpp"
#include "cpu/flash.hpp"
#include "cpu/simd_math-inl.hpp"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace flashtile::detail::cpu_flash::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
inline constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(DF()));

// ---- tile shapes ----------------------------------------------------------------------
// A register tile of R×V vectors needs R·V accumulators, V loaded vectors and one
// broadcast: targets with 32 vector registers (AVX-512, NEON) hold 24 accumulators,
// those with 16 (AVX2, SSE4) hold 12. Per step of the reduction the tile issues V + R
// loads for R·V FMAs.
struct Tiles {
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3) || (HWY_ARCH_ARM_A64 && HWY_TARGET == HWY_NEON)
  static constexpr int kQkKeys = 8, kQkQueryVecs = 3;  // S^T tile (8 keys, 3·L queries)
  static constexpr int kPvRows = 6, kPvChanVecs = 4;   // O tile (6 rows, 4·L channels)
  static constexpr int64_t kBlockN = 64;
#elif HWY_TARGET == HWY_SCALAR  // one float per "vector": portable fallback only
  static constexpr int kQkKeys = 4, kQkQueryVecs = 4;
  static constexpr int kPvRows = 4, kPvChanVecs = 4;
  static constexpr int64_t kBlockN = 48;
#else
  static constexpr int kQkKeys = 6, kQkQueryVecs = 2;
  static constexpr int kPvRows = 4, kPvChanVecs = 3;
  static constexpr int64_t kBlockN = 48;
#endif
  // Query rows per task. Each K/V block is packed once per task, so taller blocks pack
  // less per FLOP; 192 rows beat 96 by 1.10x and 384 beat 192 by 1.01x (AVX-512, B=1 H=8
  // N=4096 d=64, one thread), while 192 keeps 22 tasks per head at N=4096 for the threads.
  static constexpr int64_t kBlockM = 192;
};
static_assert(Tiles::kBlockM % (Tiles::kQkQueryVecs * kLanes) == 0,
              "a query block must split into whole Q·Kᵀ tiles");
static_assert(Tiles::kBlockM % Tiles::kPvRows == 0, "a query block must split into P·V tiles");
static_assert(Tiles::kBlockN % Tiles::kQkKeys == 0, "a key block must split into Q·Kᵀ tiles");
static_assert((Tiles::kQkQueryVecs * kLanes) % Tiles::kPvRows == 0,
              "a P·V row group must lie inside one Q·Kᵀ query group: it reads only the keys "
              "that group computed");

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Per-thread scratch, in floats; each piece starts on a 64-byte boundary.
struct Scratch {
  float* qt;      // (d, kBlockM)        Q^T of the task, pre-multiplied by the scale
  float* st;      // (kBlockN, kBlockM)  S^T, overwritten by P^T
  float* o;       // (kBlockM, dpad)     unnormalised output accumulator
  float* kp;      // (kBlockN, d)        K block as contiguous f32 (zero rows past the end)
  float* vp;      // (kBlockN, dpad)     V block as contiguous f32 (zero channels past d)
  float* m;       // (kBlockM)           running max per query row
  float* l;       // (kBlockM)           running denominator per query row
  float* alpha;   // (kBlockM)           this block's rescale factor per query row
  float* bmax;    // (kBlockM)           this block's max score per query row
  float* key_lo;  // (kBlockM)           masked blocks: first key of the block each row sees
  float* key_hi;  // (kBlockM)           masked blocks: one past the last

  static constexpr int kPieces = 11;
  static int64_t padded_dim(int64_t d) { return round_up(d, kLanes); }
  // Where each piece starts, in the order above, and last the total.
  static std::array<int64_t, kPieces + 1> offsets(int64_t d) {
    const int64_t dp = padded_dim(d), M = Tiles::kBlockM, N = Tiles::kBlockN;
    const int64_t sizes[kPieces] = {d * M, N * M, M * dp, N * d, N * dp, M, M, M, M, M, M};
    std::array<int64_t, kPieces + 1> at{};
    for (int i = 0; i < kPieces; ++i) at[i + 1] = at[i] + round_up(sizes[i], 16);
    return at;
  }
  static int64_t floats(int64_t d) { return offsets(d)[kPieces]; }
  Scratch(float* base, int64_t d) {
    const std::array<int64_t, kPieces + 1> at = offsets(d);
    float** pieces[kPieces] = {&qt, &st, &o, &kp, &vp, &m, &l, &alpha, &bmax, &key_lo, &key_hi};
    for (int i = 0; i < kPieces; ++i) *pieces[i] = base + at[i];
  }
};

// One slot of the packed K/V cache (flash.hpp): a K block as in Scratch::kp, then a V block
// as in Scratch::vp, each starting on a 64-byte boundary.
inline int64_t KCacheFloats(int64_t d) { return round_up(Tiles::kBlockN * d, 16); }
inline int64_t CacheSlotFloats(int64_t d) {
  return KCacheFloats(d) + round_up(Tiles::kBlockN * Scratch::padded_dim(d), 16);
}

// FastExp and FastTanh: src/cpu/simd_math-inl.hpp (the backward kernels use them too).
using simd_math::HWY_NAMESPACE::FastExp;
using simd_math::HWY_NAMESPACE::FastTanh;

// ---- the online-softmax step, L rows at a time ----------------------------------------
// Lane-wise online_softmax_rescale (attn/softmax_state.hpp): m_new = max(m, block max);
// lanes that have seen nothing (m_new = -inf) keep alpha = 1, the others get
// alpha = exp(m - m_new) and l *= alpha. tests/cpu/test_cpu_flash.cpp checks this against
// the scalar function lane by lane.
HWY_INLINE VF RescaleLanes(DF df, VF& m, VF& l, VF block_max) {
  const VF m_new = hn::Max(m, block_max);
  const auto seen = hn::Ne(m_new, hn::Set(df, -std::numeric_limits<float>::infinity()));
  const VF alpha = hn::IfThenElse(seen, FastExp(df, hn::Sub(m, m_new)), hn::Set(df, 1.0f));
  l = hn::Mul(l, alpha);
  m = m_new;
  return alpha;
}
// Lane-wise safe_shift: m, or 0 while m is -inf.
HWY_INLINE VF SafeShiftLanes(DF df, VF m) {
  const VF neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
  return hn::IfThenElse(hn::Eq(m, neg_inf), hn::Zero(df), m);
}

// Scores of one block, S^T (keys, rows) with row stride `ld`, become P^T in place for keys
// [key_begin, key_end) and rows [r0, r0 + kGroup·L) whose block maxima are in bmax; m, l and
// alpha are per-row arrays. kGroup query vectors at a time so their sum chains interleave.
template <int kGroup>
HWY_INLINE void SoftmaxGroup(float* HWY_RESTRICT st, int64_t ld, int64_t key_begin,
                             int64_t key_end, int64_t r0, const float* HWY_RESTRICT bmax,
                             float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                             float* HWY_RESTRICT alpha) {
  const DF df;
  VF shift[kGroup], sum[kGroup], mv[kGroup], lv[kGroup];
  for (int g = 0; g < kGroup; ++g) {
    const int64_t r = r0 + g * kLanes;
    mv[g] = hn::LoadU(df, m + r);
    lv[g] = hn::LoadU(df, l + r);
    hn::StoreU(RescaleLanes(df, mv[g], lv[g], hn::LoadU(df, bmax + r)), df, alpha + r);
    shift[g] = SafeShiftLanes(df, mv[g]);
    sum[g] = hn::Zero(df);
  }
  for (int64_t j = key_begin; j < key_end; ++j)
    for (int g = 0; g < kGroup; ++g) {
      float* sp = st + j * ld + r0 + g * kLanes;
      const VF prob = FastExp(df, hn::Sub(hn::LoadU(df, sp), shift[g]));
      hn::StoreU(prob, df, sp);
      sum[g] = hn::Add(sum[g], prob);
    }
  for (int g = 0; g < kGroup; ++g) {
    hn::StoreU(mv[g], df, m + r0 + g * kLanes);
    hn::StoreU(hn::Add(lv[g], sum[g]), df, l + r0 + g * kLanes);
  }
}

// ---- which keys of a block each query row sees ------------------------------------------
struct KeySpan {
  int64_t begin, end;  // keys [begin, end) of the block, end >= begin
  int64_t size() const { return end - begin; }
};

// The visibility of one key block of `keys` keys to the task's kBlockM query rows. A block
// that attn/block_range.hpp says needs no mask is seen whole by every row; in one that does,
// row r sees block keys [lo[r], hi[r]), from Mask (MaskedBlock below). Both bounds grow
// with r (Mask's bounds move with the row), so a run of rows sees, between them, the keys
// from its first row's lo to its last row's hi, and all of them see [lo[last], hi[first]).
struct BlockVisibility {
  int64_t keys;
  const float* lo = nullptr;  // null: every row sees every key
  const float* hi = nullptr;

  bool masked() const { return lo != nullptr; }
  // Keys some row of [r0, r1) sees.
  KeySpan seen_by_any(int64_t r0, int64_t r1) const {
    if (!masked()) return {0, keys};
    const int64_t begin = static_cast<int64_t>(lo[r0]), end = static_cast<int64_t>(hi[r1 - 1]);
    return {begin, std::max(begin, end)};
  }
  // Keys every row of [r0, r1) sees (empty: begin = end).
  KeySpan seen_by_all(int64_t r0, int64_t r1) const {
    if (!masked()) return {0, keys};
    const int64_t begin = static_cast<int64_t>(lo[r1 - 1]), end = static_cast<int64_t>(hi[r0]);
    return {begin, std::max(begin, end)};
  }
  // Whether every row of [r0, r1) sees every key of [j0, j1).
  bool all_see(int64_t r0, int64_t r1, int64_t j0, int64_t j1) const {
    const KeySpan all = seen_by_all(r0, r1);
    return all.begin <= j0 && j1 <= all.end;
  }
};

// The bounds of a masked block (first key j0, `keys` keys) for query rows i0 + r, r < kBlockM,
// written to lo and hi as floats (exact: they lie in [0, kBlockN]) for the tiles' lane-wise
// compare. Rows past the task's `rows` repeat its last row, keeping the bounds monotonic.
HWY_INLINE BlockVisibility MaskedBlock(const Mask<int64_t>& mask, int64_t i0, int64_t rows,
                                       int64_t j0, int64_t keys, float* HWY_RESTRICT lo,
                                       float* HWY_RESTRICT hi) {
  for (int64_t r = 0; r < Tiles::kBlockM; ++r) {
    const int64_t i = i0 + std::min(r, rows - 1);
    lo[r] = static_cast<float>(std::clamp<int64_t>(mask.first_key(i) - j0, 0, keys));
    hi[r] = static_cast<float>(std::clamp<int64_t>(mask.key_end(i) - j0, 0, keys));
  }
  return {keys, lo, hi};
}

// ---- the logits of one tile ---------------------------------------------------------------
// What attn/variant.hpp's LogitsTransform does after S = scale·q·k, on the registers of a
// tile: the softcap (Q^T then carries scale / softcap, so S <- softcap·tanh(acc)) and ALiBi
// (S <- S - slope·|i + offset - j|, LogitsTransform::alibi_bias).
struct BlockLogits {
  float softcap;  // LogitsTransform::softcap (0 when off)
  float slope;    // ALiBi slope of the head (0 when off)
  // i + offset - j for the block's first query row i and first key j: the signed distance
  // whose absolute value Mask::distance gives, at the block's corner.
  int64_t corner_distance;
};

// ---- Q·Kᵀ micro-kernel ----------------------------------------------------------------
// Lane-wise mask of one vector of S^T: key j of the block against the rows whose bounds
// are lo, hi (BlockVisibility).
HWY_INLINE VF MaskLanes(DF df, VF scores, VF lo, VF hi, VF j) {
  const auto seen = hn::And(hn::Le(lo, j), hn::Gt(hi, j));
  return hn::IfThenElse(seen, scores, hn::Set(df, -std::numeric_limits<float>::infinity()));
}

// The softcap and ALiBi of Flags, the mask (when `masked`) and the block max, over a tile
// already stored in S^T: one vector at a time from L1. Folded into the register epilogue of
// QkTile instead, these made GCC keep the accumulators in memory through the whole Q·Kᵀ
// loop (one store per accumulator per channel: 1.7x slower end to end).
template <int kKeys, int kVecs, class Flags>
HWY_NOINLINE void TileLogits(float* HWY_RESTRICT st, float* HWY_RESTRICT bmax, int64_t row,
                             int64_t key, const BlockLogits& logits, const BlockVisibility& vis,
                             bool masked) {
  const DF df;
  constexpr int64_t ld = Tiles::kBlockM;
  const VF cap = hn::Set(df, logits.softcap), slope = hn::Set(df, logits.slope);
  // Lane i of vector v, key r: i + offset - j = tile corner + v·L + i - r (exact in float
  // while sequences stay below 2^24 keys).
  const float corner = static_cast<float>(logits.corner_distance + row - key);
  for (int v = 0; v < kVecs; ++v) {
    const int64_t lane0 = row + v * kLanes;
    VF mx = hn::Load(df, bmax + lane0);
    for (int r = 0; r < kKeys; ++r) {
      float* at = st + (key + r) * ld + lane0;
      VF s = hn::Load(df, at);
      if constexpr (Flags::kSoftcap) s = hn::Mul(FastTanh(df, s), cap);
      if constexpr (Flags::kAlibi)
        s = hn::NegMulAdd(slope, hn::Abs(hn::Iota(df, corner + float(v * kLanes - r))), s);
      if (masked)
        s = MaskLanes(df, s, hn::Load(df, vis.lo + lane0), hn::Load(df, vis.hi + lane0),
                      hn::Set(df, static_cast<float>(key + r)));
      hn::Store(s, df, at);
      mx = hn::Max(mx, s);
    }
    hn::Store(mx, df, bmax + lane0);
  }
}

// S^T tile (kKeys, kVecs·L) = K rows [key, key + kKeys) (kKeys, d) · Q^T columns
// [row, row + kVecs·L) (d, kVecs·L): per channel c, kVecs loads of Q^T, kKeys broadcasts of
// K[j][c], kKeys·kVecs FMAs. The epilogue applies the logits features of Flags
// (attn/features.hpp), sets the scores the rows do not see to -inf (only when `masked`),
// and folds the tile into the block's per-row maximum, so the softmax needs no separate
// pass for the max. Plain logits do this in registers; softcap and ALiBi in TileLogits.
// k and st point at the block's first key, qt and bmax at row 0.
template <int kKeys, int kVecs, class Flags>
HWY_INLINE void QkTile(const float* HWY_RESTRICT k, int64_t d, const float* HWY_RESTRICT qt,
                       float* HWY_RESTRICT st, float* HWY_RESTRICT bmax, int64_t row,
                       int64_t key, const BlockLogits& logits, const BlockVisibility& vis,
                       bool masked) {
  const DF df;
  constexpr int64_t ld = Tiles::kBlockM;  // row stride of Q^T and S^T
  const float* HWY_RESTRICT kt = k + key * d;
  VF acc[kKeys][kVecs];
  for (int r = 0; r < kKeys; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = hn::Zero(df);
  for (int64_t c = 0; c < d; ++c) {
    VF q[kVecs];
    for (int v = 0; v < kVecs; ++v) q[v] = hn::Load(df, qt + c * ld + row + v * kLanes);
    for (int r = 0; r < kKeys; ++r) {
      const VF kc = hn::Set(df, kt[r * d + c]);
      for (int v = 0; v < kVecs; ++v) acc[r][v] = hn::MulAdd(kc, q[v], acc[r][v]);
    }
  }
  if constexpr (!Flags::kPlain) {
    for (int r = 0; r < kKeys; ++r)
      for (int v = 0; v < kVecs; ++v)
        hn::Store(acc[r][v], df, st + (key + r) * ld + row + v * kLanes);
    TileLogits<kKeys, kVecs, Flags>(st, bmax, row, key, logits, vis, masked);
    return;
  }
  if (masked) {
    VF lo[kVecs], hi[kVecs];
    for (int v = 0; v < kVecs; ++v) {
      lo[v] = hn::Load(df, vis.lo + row + v * kLanes);
      hi[v] = hn::Load(df, vis.hi + row + v * kLanes);
    }
    for (int r = 0; r < kKeys; ++r) {
      const VF j = hn::Set(df, static_cast<float>(key + r));
      for (int v = 0; v < kVecs; ++v) acc[r][v] = MaskLanes(df, acc[r][v], lo[v], hi[v], j);
    }
  }
  for (int v = 0; v < kVecs; ++v) {
    VF mx = hn::Load(df, bmax + row + v * kLanes);
    for (int r = 0; r < kKeys; ++r) mx = hn::Max(mx, acc[r][v]);
    hn::Store(mx, df, bmax + row + v * kLanes);
  }
  for (int r = 0; r < kKeys; ++r)
    for (int v = 0; v < kVecs; ++v)
      hn::Store(acc[r][v], df, st + (key + r) * ld + row + v * kLanes);
}

// ---- P·V micro-kernel -----------------------------------------------------------------
// The keys of a block that a group of P·V rows takes: `any` (those some row sees) with
// `all` (those every row sees) inside it. A key of `any` outside `all` reaches row r only
// when lo[r] <= j < hi[r] (BlockVisibility bounds from the group's first row): a row must
// not multiply the value of a key it does not see, since 0 · NaN or 0 · Inf is NaN.
struct PvKeys {
  KeySpan any, all;
  const float* lo = nullptr;  // null when all == any
  const float* hi = nullptr;
};

// acc (kRows, kVecs·L) += P · V over keys [j_begin, j_end); kRagged: row r adds key j only
// when it sees it (PvKeys).
template <bool kRagged, int kRows, int kVecs>
HWY_INLINE void PvAddKeys(VF (&acc)[kRows][kVecs], const float* HWY_RESTRICT pt,
                          int64_t j_begin, int64_t j_end, const float* HWY_RESTRICT v,
                          int64_t v_stride, const PvKeys& keys) {
  const DF df;
  for (int64_t j = j_begin; j < j_end; ++j) {
    VF x[kVecs];
    for (int c = 0; c < kVecs; ++c) x[c] = hn::LoadU(df, v + j * v_stride + c * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const VF p = hn::Set(df, pt[j * Tiles::kBlockM + r]);
      if constexpr (kRagged) {
        const bool seen = keys.lo[r] <= float(j) && float(j) < keys.hi[r];
        const auto keep = hn::FirstN(df, seen ? kLanes : 0);
        for (int c = 0; c < kVecs; ++c)
          acc[r][c] = hn::IfThenElse(keep, hn::MulAdd(p, x[c], acc[r][c]), acc[r][c]);
      } else {
        for (int c = 0; c < kVecs; ++c) acc[r][c] = hn::MulAdd(p, x[c], acc[r][c]);
      }
    }
  }
}

// O tile (kRows, kVecs·L) = alpha · O + P (kRows, keys) · V (keys, kVecs·L): per key j,
// kVecs loads of V[j], kRows broadcasts of P[i][j] = P^T[j][i], kRows·kVecs FMAs. The
// online softmax's rescale of O rides along with the accumulator load. The (at most
// kRows - 1 on each side) keys of keys.any outside keys.all select per row whether to add.
// pt points at the group's first row of the block's P^T, v at key 0 of the block.
template <int kRows, int kVecs>
HWY_INLINE void PvTile(const float* HWY_RESTRICT pt, const PvKeys& keys,
                       const float* HWY_RESTRICT v, int64_t v_stride,
                       const float* HWY_RESTRICT alpha, float* HWY_RESTRICT o, int64_t o_stride) {
  const DF df;
  VF acc[kRows][kVecs];
  for (int r = 0; r < kRows; ++r) {
    const VF a = hn::Set(df, alpha[r]);
    for (int c = 0; c < kVecs; ++c)
      acc[r][c] = hn::Mul(hn::Load(df, o + r * o_stride + c * kLanes), a);
  }
  PvAddKeys<true>(acc, pt, keys.any.begin, keys.all.begin, v, v_stride, keys);
  PvAddKeys<false>(acc, pt, keys.all.begin, keys.all.end, v, v_stride, keys);
  PvAddKeys<true>(acc, pt, keys.all.end, keys.any.end, v, v_stride, keys);
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kVecs; ++c) hn::Store(acc[r][c], df, o + r * o_stride + c * kLanes);
}

// The tile for the last `n` (< kPvChanVecs) channel vectors of a row group.
template <int kVecs = Tiles::kPvChanVecs - 1>
HWY_INLINE void PvTailTile(int n, const float* pt, const PvKeys& keys, const float* v,
                           int64_t v_stride, const float* alpha, float* o, int64_t o_stride) {
  if constexpr (kVecs > 0) {
    if (n == kVecs)
      PvTile<Tiles::kPvRows, kVecs>(pt, keys, v, v_stride, alpha, o, o_stride);
    else
      PvTailTile<kVecs - 1>(n, pt, keys, v, v_stride, alpha, o, o_stride);
  }
}

// O (kBlockM, dpad) = alpha · O + P · V over one key block; row group [i, i + kPvRows)
// takes the keys its rows see (PvKeys: all of them whole, the mask's edge row by row).
HWY_INLINE void PvBlock(const float* HWY_RESTRICT pt, const BlockVisibility& vis,
                        const float* HWY_RESTRICT v, int64_t v_stride,
                        const float* HWY_RESTRICT alpha, float* HWY_RESTRICT o, int64_t dpad) {
  constexpr int kRows = Tiles::kPvRows, kVecs = Tiles::kPvChanVecs;
  const int64_t nvec = dpad / kLanes;
  for (int64_t i = 0; i < Tiles::kBlockM; i += kRows) {
    PvKeys keys{vis.seen_by_any(i, i + kRows), vis.seen_by_any(i, i + kRows)};
    if (vis.masked()) {
      const KeySpan all = vis.seen_by_all(i, i + kRows);
      // Inside `any` (a group whose rows see disjoint keys has an empty `all`).
      keys.all.begin = std::clamp(all.begin, keys.any.begin, keys.any.end);
      keys.all.end = std::clamp(all.end, keys.all.begin, keys.any.end);
      keys.lo = vis.lo + i;
      keys.hi = vis.hi + i;
    }
    int64_t c = 0;
    for (; c + kVecs <= nvec; c += kVecs)
      PvTile<kRows, kVecs>(pt + i, keys, v + c * kLanes, v_stride, alpha + i,
                           o + i * dpad + c * kLanes, dpad);
    if (c < nvec)
      PvTailTile(static_cast<int>(nvec - c), pt + i, keys, v + c * kLanes, v_stride, alpha + i,
                 o + i * dpad + c * kLanes, dpad);
  }
}

// ---- loads with conversion ------------------------------------------------------------
template <class T>
HWY_INLINE VF LoadAsFloat(DF df, const T* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else {
    const hn::Rebind<T, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, p));
  }
}
// Element pointer types as Highway knows them (same bits as the API's uint16 storage).
template <DType kDType>
using Storage = std::conditional_t<kDType == DType::f32, float,
                                   std::conditional_t<kDType == DType::f16, hwy::float16_t,
                                                      hwy::bfloat16_t>>;

// dst (rows_valid rows, width) <- src rows as f32; rows up to rows_total and channels up
// to width are zero. `d` channels are read from each source row.
template <DType kDType>
HWY_INLINE void PackRows(const void* src, int64_t src_offset, int64_t src_stride,
                         int64_t rows_valid, int64_t rows_total, int64_t d, float* dst,
                         int64_t width) {
  using T = Storage<kDType>;
  const DF df;
  const T* base = static_cast<const T*>(src) + src_offset;
  const int64_t vec_end = d / kLanes * kLanes;
  for (int64_t r = 0; r < rows_total; ++r) {
    float* out = dst + r * width;
    if (r >= rows_valid) {
      std::fill(out, out + width, 0.0f);
      continue;
    }
    const T* row = base + r * src_stride;
    for (int64_t c = 0; c < vec_end; c += kLanes) hn::StoreU(LoadAsFloat(df, row + c), df, out + c);
    for (int64_t c = vec_end; c < d; ++c)
      out[c] = load_as_float(src, kDType, src_offset + r * src_stride + c);
    std::fill(out + d, out + width, 0.0f);
  }
}

// ---- one key block: S = Q·Kᵀ, logits, mask, online softmax ----------------------------
// Turns st into P^T (keys, kBlockM) for one key block and updates m, l, alpha. The query
// group [i, i + G) (G = kQkQueryVecs·L rows) computes the whole kQkKeys tiles that hold the
// keys its rows see between them; the other tiles are skipped and their P^T rows are never
// read. Tiles that some row of the group does not see whole are masked. K holds whole
// kQkKeys tiles (zero rows past `keys`).
template <class Flags>
HWY_INLINE void ScoresAndSoftmax(const float* HWY_RESTRICT k, int64_t d,
                                 const float* HWY_RESTRICT qt, const BlockVisibility& vis,
                                 const BlockLogits& logits, const Scratch& s) {
  constexpr int kKeys = Tiles::kQkKeys, kVecs = Tiles::kQkQueryVecs;
  constexpr int64_t M = Tiles::kBlockM, kGroupRows = kVecs * kLanes;
  std::fill(s.bmax, s.bmax + M, -std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < M; i += kGroupRows) {
    const KeySpan span = vis.seen_by_any(i, i + kGroupRows);
    const int64_t tile_begin = span.begin / kKeys * kKeys;
    const int64_t tile_end = span.size() > 0 ? round_up(span.end, kKeys) : tile_begin;
    for (int64_t j = tile_begin; j < tile_end; j += kKeys)
      QkTile<kKeys, kVecs, Flags>(k, d, qt, s.st, s.bmax, i, j, logits, vis,
                                  !vis.all_see(i, i + kGroupRows, j, j + kKeys));
    // The group's scores are still in L1: softmax them now.
    SoftmaxGroup<kVecs>(s.st, M, tile_begin, tile_end, i, s.bmax, s.m, s.l, s.alpha);
  }
}

// ---- one task ---------------------------------------------------------------------------
// Query rows [i0, i0 + rows) of head h of sequence b: the whole loop of Algorithm 1 of
// FlashAttention-2 for one query block, over the key blocks attn/block_range.hpp says the
// rows see, with the output written in the input dtype.
template <DType kDType, class Flags>
void QueryBlock(const AttentionParams& p, int64_t b, int64_t h, int64_t qb, float* scratch_base,
                const KvCache& cache, const TaskSplit& split) {
  const DF df;
  constexpr int64_t M = Tiles::kBlockM, N = Tiles::kBlockN;
  const int64_t d = p.head_dim, dpad = Scratch::padded_dim(d);
  const Scratch s(scratch_base, d);
  const SeqlenInfo<int64_t> seq(p, b);
  const Mask<int64_t> mask = seq.mask(p);
  const LogitsTransform<float> transform = logits_transform<float>(p, b, h);
  const int64_t i0 = qb * M, rows = std::min(M, seq.seqlen_q - i0);
  const int64_t hk = h / p.heads_per_kv();

  // Q^T (d, M) = scale · Q[i0 .. i0+rows)ᵀ (scale / softcap with a softcap), zero for rows
  // past the end (their scores are computed and discarded). The rows go through O's scratch
  // first: whole-vector loads keep many cache misses in flight, and the transpose then
  // reads L1.
  const float q_scale = Flags::kSoftcap ? transform.capped_scale : transform.scale;
  PackRows<kDType>(p.q, seq.q_offset(p, b, i0, h), p.q_row_stride, rows, M, d, s.o, dpad);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < d; ++c) s.qt[c * M + r] = q_scale * s.o[r * dpad + c];
  std::fill(s.o, s.o + M * dpad, 0.0f);
  std::fill(s.m, s.m + M, -std::numeric_limits<float>::infinity());
  std::fill(s.l, s.l + M, 0.0f);

  // Only the key blocks some row sees are visited; only those the mask cuts are masked.
  KeyBlocks<int64_t> blocks = key_blocks(mask, i0, i0 + rows, N);
  if (split.splits > 1) blocks = split_key_blocks(blocks, split.split, split.splits);
  for (int64_t n = blocks.begin; n < blocks.end; ++n) {
    const int64_t j0 = n * N, keys = std::min(N, seq.seqlen_k - j0);

    // K and V blocks converted to f32 and packed contiguously, even when they are f32
    // already: rows of a (seqlen, heads, d) tensor sit heads·d floats apart (2 KiB for 8
    // heads of 64), which maps a block's rows onto a few L1 sets, and P·V re-reads V once
    // per row group. Packed, a block is 16 KiB that stays in L1 (1.13x end to end at
    // B=1 H=8 N=4096 d=64). Software prefetch of the next block's rows, spread over the
    // tiles, measured no gain and is not done.
    // Under a window, the block may still be packed in this thread's cache (flash.hpp).
    float* kp = s.kp;  // (round_up(keys, kQkKeys), d)
    float* vp = s.vp;  // (keys, dpad)
    bool cached = false;
    if (cache.slots > 0) {
      const int64_t slot = n % cache.slots;
      kp = cache.blocks + slot * CacheSlotFloats(d);
      vp = kp + KCacheFloats(d);
      CacheTag& tag = cache.tags[slot];
      cached = tag.batch == b && tag.kv_head == hk && tag.block == n;
      tag = {b, hk, n};
    }
    if (!cached) {
      PackRows<kDType>(p.k, seq.k_offset(p, b, j0, hk), p.k_row_stride, keys,
                       round_up(keys, Tiles::kQkKeys), d, kp, d);
      PackRows<kDType>(p.v, seq.v_offset(p, b, j0, hk), p.v_row_stride, keys, keys, d, vp, dpad);
    }

    const BlockVisibility vis = blocks.needs_mask(n)
                                    ? MaskedBlock(mask, i0, rows, j0, keys, s.key_lo, s.key_hi)
                                    : BlockVisibility{keys};
    const BlockLogits logits{transform.softcap, transform.slope, i0 + mask.offset - j0};
    // (keys, M) S^T = K · Q^T, logits, mask; then P^T = exp(S^T - m_new), m, l, alpha updated.
    ScoresAndSoftmax<Flags>(kp, d, s.qt, vis, logits, s);
    // (M, dpad) O = alpha · O + P · V
    PvBlock(s.st, vis, vp, dpad, s.alpha, s.o, dpad);
  }

  const int64_t vec_end = d / kLanes * kLanes;
  if (split.partial_out != nullptr) {
    // A split's partial: O / l in fp32 and its LSE; the NaN rule and the sink wait for the
    // combine, which sees the whole row.
    for (int64_t r = 0; r < rows; ++r) {
      const SoftmaxState<float> state{s.m[r], s.l[r]};
      const VF scale = hn::Set(df, output_scale(state));
      const float* o_row = s.o + r * dpad;
      float* out = split.partial_out + r * d;
      for (int64_t c = 0; c < vec_end; c += kLanes)
        hn::StoreU(hn::Mul(hn::Load(df, o_row + c), scale), df, out + c);
      for (int64_t c = vec_end; c < d; ++c) out[c] = o_row[c] * output_scale(state);
      split.partial_lse[r] = log_sum_exp(state);
    }
    return;
  }
  // The sink joins each row's denominator; then O / l in the output dtype, and LSE, through
  // the shared finalisation (attn/softmax_state.hpp).
  const float sink = sink_logit<float>(p, h);
  for (int64_t r = 0; r < rows; ++r) {
    SoftmaxState<float> state{s.m[r], s.l[r]};
    nan_if_no_finite_score(state, mask.visible_keys(i0 + r) > 0);
    const float sink_factor = add_sink(state, sink);
    const float to_output = sink_factor * output_scale(state);
    const float* o_row = s.o + r * dpad;
    const int64_t dst = seq.o_offset(p, b, i0 + r, h);
    if constexpr (kDType == DType::f32) {
      float* out = static_cast<float*>(p.o) + dst;
      const VF scale = hn::Set(df, to_output);
      for (int64_t c = 0; c < vec_end; c += kLanes)
        hn::StoreU(hn::Mul(hn::Load(df, o_row + c), scale), df, out + c);
      for (int64_t c = vec_end; c < d; ++c) out[c] = o_row[c] * to_output;
    } else {
      // Scalar round-to-nearest-even conversion, bit-exact with the rest of flashtile;
      // once per output element, so it does not show next to the O(N) work per element.
      for (int64_t c = 0; c < d; ++c) store_from_float(p.o, kDType, dst + c, o_row[c] * to_output);
    }
    if (p.lse != nullptr) p.lse[seq.lse_index(p, b, h, i0 + r)] = log_sum_exp(state);
  }
}

// ---- per-target entry points ------------------------------------------------------------
// One instantiation per dtype and logits feature set (plain, softcap, ALiBi, both); masks,
// sinks and varlen are data.
inline void RunQueryBlock(const AttentionParams& p, int64_t b, int64_t h, int64_t qb,
                          float* scratch, const KvCache& cache, const TaskSplit& split) {
  with_logits_flags(p, [&](auto flags) {
    using Flags = decltype(flags);
    switch (p.dtype) {
      case DType::f32: return QueryBlock<DType::f32, Flags>(p, b, h, qb, scratch, cache, split);
      case DType::f16: return QueryBlock<DType::f16, Flags>(p, b, h, qb, scratch, cache, split);
      case DType::bf16: return QueryBlock<DType::bf16, Flags>(p, b, h, qb, scratch, cache, split);
    }
  });
}

inline Geometry GetGeometry(int64_t head_dim) {
  return {Tiles::kBlockM, Tiles::kBlockN,          kLanes,
          Scratch::floats(head_dim), CacheSlotFloats(head_dim), hwy::TargetName(HWY_TARGET)};
}

inline void VectorExp(const float* x, float* y, size_t n) {
  const DF df;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) hn::StoreU(FastExp(df, hn::LoadU(df, x + i)), df, y + i);
  if (i < n) {  // last partial vector through a padded copy
    HWY_ALIGN float buf[kLanes] = {};
    std::copy(x + i, x + n, buf);
    hn::Store(FastExp(df, hn::Load(df, buf)), df, buf);
    std::copy(buf, buf + (n - i), y + i);
  }
}

inline void VectorTanh(const float* x, float* y, size_t n) {
  const DF df;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) hn::StoreU(FastTanh(df, hn::LoadU(df, x + i)), df, y + i);
  if (i < n) {
    HWY_ALIGN float buf[kLanes] = {};
    std::copy(x + i, x + n, buf);
    hn::Store(FastTanh(df, hn::Load(df, buf)), df, buf);
    std::copy(buf, buf + (n - i), y + i);
  }
}

inline void OnlineSoftmaxLanes(float* scores, int64_t keys, int64_t rows, float* m, float* l,
                               float* alpha) {
  std::vector<float> bmax(rows, -std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t r = 0; r < rows; ++r) bmax[r] = std::max(bmax[r], scores[j * rows + r]);
  for (int64_t r0 = 0; r0 < rows; r0 += kLanes)
    SoftmaxGroup<1>(scores, rows, 0, keys, r0, bmax.data(), m, l, alpha);
}

}  // namespace flashtile::detail::cpu_flash::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
