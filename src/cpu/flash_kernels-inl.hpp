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
#include "common/numeric.hpp"
#include "attn/softmax_state.hpp"
#include "cpu/flash.hpp"
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
  float* qt;     // (d, kBlockM)        Q^T of the task, pre-multiplied by the scale
  float* st;     // (kBlockN, kBlockM)  S^T, overwritten by P^T
  float* o;      // (kBlockM, dpad)     unnormalised output accumulator
  float* kp;     // (kBlockN, d)        K block as contiguous f32 (zero rows past the end)
  float* vp;     // (kBlockN, dpad)     V block as contiguous f32 (zero channels past d)
  float* m;      // (kBlockM)           running max per query row
  float* l;      // (kBlockM)           running denominator per query row
  float* alpha;  // (kBlockM)           this block's rescale factor per query row
  float* bmax;   // (kBlockM)           this block's max score per query row

  static int64_t padded_dim(int64_t d) { return round_up(d, kLanes); }
  // Where each piece starts, in the order above, and last the total.
  static std::array<int64_t, 10> offsets(int64_t d) {
    const int64_t dp = padded_dim(d), M = Tiles::kBlockM, N = Tiles::kBlockN;
    const int64_t sizes[9] = {d * M, N * M, M * dp, N * d, N * dp, M, M, M, M};
    std::array<int64_t, 10> at{};
    for (int i = 0; i < 9; ++i) at[i + 1] = at[i] + round_up(sizes[i], 16);
    return at;
  }
  static int64_t floats(int64_t d) { return offsets(d)[9]; }
  Scratch(float* base, int64_t d) {
    const std::array<int64_t, 10> at = offsets(d);
    float** pieces[9] = {&qt, &st, &o, &kp, &vp, &m, &l, &alpha, &bmax};
    for (int i = 0; i < 9; ++i) *pieces[i] = base + at[i];
  }
};

// ---- vectorised exp -------------------------------------------------------------------
// exp(x) = 2^n · exp(r) with n = round(x / ln2) and |r| <= ln2/2; exp(r) = 1 + r + r²·q(r)
// with q of degree 4 fitted (weighted least squares on Chebyshev nodes, for relative error)
// to (exp(r) - 1 - r) / r². Max relative error 1.2e-7 (2 ulp) on [-87, 88]; -inf and
// anything below about -87.7 give 0, which is what masked scores need.
// The rounding is the shifter trick: adding 1.5·2^23 leaves n in the low mantissa bits, and
// with 127 folded into the shifter those bits shifted into the exponent field are 2^n.
template <class D>
HWY_INLINE hn::Vec<D> FastExp(D d, hn::Vec<D> x) {
  const hn::RebindToSigned<D> di;
  constexpr float kShifter = 12582912.0f + 127.0f;  // 1.5·2^23 + exponent bias
  x = hn::Min(hn::Max(x, hn::Set(d, -88.0f)), hn::Set(d, 88.0f));
  const auto shifted = hn::MulAdd(x, hn::Set(d, 1.44269504088896341f), hn::Set(d, kShifter));
  const auto n = hn::Sub(shifted, hn::Set(d, kShifter));  // round(x / ln2), exactly
  // ln2 split so that n·kLn2Hi is exact (kLn2Hi has 9 significant bits).
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440054690583e-4f;
  auto r = hn::NegMulAdd(n, hn::Set(d, kLn2Hi), x);
  r = hn::NegMulAdd(n, hn::Set(d, kLn2Lo), r);
  auto q = hn::Set(d, 1.375140739e-03f);
  q = hn::MulAdd(q, r, hn::Set(d, 8.368915878e-03f));
  q = hn::MulAdd(q, r, hn::Set(d, 4.166953266e-02f));
  q = hn::MulAdd(q, r, hn::Set(d, 1.666651815e-01f));
  q = hn::MulAdd(q, r, hn::Set(d, 4.999998808e-01f));
  const auto e_r = hn::MulAdd(hn::Mul(r, r), q, hn::Add(r, hn::Set(d, 1.0f)));
  // (n + 127) << 23: the exponent field of 2^n; n = -127 gives the bit pattern of +0.
  const auto two_n = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, shifted)));
  return hn::Mul(e_r, two_n);
}

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

// Scores of one block, S^T (keys, rows) with row stride `ld`, become P^T in place, for
// rows [r0, r0 + kGroup·L) whose block maxima are in bmax; m, l and alpha are per-row
// arrays. kGroup query vectors at a time so their sum chains interleave.
template <int kGroup>
HWY_INLINE void SoftmaxGroup(float* HWY_RESTRICT st, int64_t ld, int64_t keys, int64_t r0,
                             const float* HWY_RESTRICT bmax, float* HWY_RESTRICT m,
                             float* HWY_RESTRICT l, float* HWY_RESTRICT alpha) {
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
  for (int64_t j = 0; j < keys; ++j)
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

// ---- Q·Kᵀ micro-kernel ----------------------------------------------------------------
// Which scores of a tile are hidden: key row r (< kKeys) of the tile is hidden entirely when
// r >= valid_keys (padding past the block), and for query column q of the tile when
// q < first_visible + r (causal: later keys are seen by later rows only).
struct TileMask {
  int64_t valid_keys;
  int64_t first_visible;
};

// S^T tile (kKeys, kVecs·L) = K rows (kKeys, d) · Q^T (d, kVecs·L): per channel c, kVecs
// loads of Q^T, kKeys broadcasts of K[j][c], kKeys·kVecs FMAs. The epilogue sets hidden
// scores to -inf (only tiles that need it) and folds the tile into the block's per-row
// maximum, so the softmax needs no separate pass for the max.
template <int kKeys, int kVecs>
HWY_INLINE void QkTile(const float* HWY_RESTRICT k, int64_t k_stride,
                       const float* HWY_RESTRICT qt, int64_t d, float* HWY_RESTRICT st,
                       float* HWY_RESTRICT bmax, const TileMask* mask) {
  const DF df;
  constexpr int64_t ld = Tiles::kBlockM;  // row stride of Q^T and S^T
  VF acc[kKeys][kVecs];
  for (int r = 0; r < kKeys; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = hn::Zero(df);
  for (int64_t c = 0; c < d; ++c) {
    VF q[kVecs];
    for (int v = 0; v < kVecs; ++v) q[v] = hn::Load(df, qt + c * ld + v * kLanes);
    for (int r = 0; r < kKeys; ++r) {
      const VF kc = hn::Set(df, k[r * k_stride + c]);
      for (int v = 0; v < kVecs; ++v) acc[r][v] = hn::MulAdd(kc, q[v], acc[r][v]);
    }
  }
  if (mask != nullptr) {
    const VF neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
    const VF iota = hn::Iota(df, 0.0f);
    for (int r = 0; r < kKeys; ++r) {
      const int64_t first = r < mask->valid_keys ? mask->first_visible + r : kVecs * kLanes;
      if (first <= 0) continue;
      const VF first_v = hn::Set(df, static_cast<float>(std::min<int64_t>(first, kVecs * kLanes)));
      for (int v = 0; v < kVecs; ++v) {
        const auto hidden = hn::Lt(hn::Add(iota, hn::Set(df, float(v * kLanes))), first_v);
        acc[r][v] = hn::IfThenElse(hidden, neg_inf, acc[r][v]);
      }
    }
  }
  for (int v = 0; v < kVecs; ++v) {
    VF mx = hn::Load(df, bmax + v * kLanes);
    for (int r = 0; r < kKeys; ++r) mx = hn::Max(mx, acc[r][v]);
    hn::Store(mx, df, bmax + v * kLanes);
  }
  for (int r = 0; r < kKeys; ++r)
    for (int v = 0; v < kVecs; ++v) hn::Store(acc[r][v], df, st + r * ld + v * kLanes);
}

// ---- P·V micro-kernel -----------------------------------------------------------------
// O tile (kRows, kVecs·L) = alpha · O + P (kRows, keys) · V (keys, kVecs·L): per key j,
// kVecs loads of V[j], kRows broadcasts of P[i][j] = P^T[j][i], kRows·kVecs FMAs. The
// online softmax's rescale of O rides along with the accumulator load.
template <int kRows, int kVecs>
HWY_INLINE void PvTile(const float* HWY_RESTRICT pt, int64_t keys, const float* HWY_RESTRICT v,
                       int64_t v_stride, const float* HWY_RESTRICT alpha, float* HWY_RESTRICT o,
                       int64_t o_stride) {
  const DF df;
  VF acc[kRows][kVecs];
  for (int r = 0; r < kRows; ++r) {
    const VF a = hn::Set(df, alpha[r]);
    for (int c = 0; c < kVecs; ++c)
      acc[r][c] = hn::Mul(hn::Load(df, o + r * o_stride + c * kLanes), a);
  }
  for (int64_t j = 0; j < keys; ++j) {
    VF x[kVecs];
    for (int c = 0; c < kVecs; ++c) x[c] = hn::LoadU(df, v + j * v_stride + c * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const VF p = hn::Set(df, pt[j * Tiles::kBlockM + r]);
      for (int c = 0; c < kVecs; ++c) acc[r][c] = hn::MulAdd(p, x[c], acc[r][c]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kVecs; ++c) hn::Store(acc[r][c], df, o + r * o_stride + c * kLanes);
}

// The tile for the last `n` (< kPvChanVecs) channel vectors of a row group.
template <int kVecs = Tiles::kPvChanVecs - 1>
HWY_INLINE void PvTailTile(int n, const float* pt, int64_t keys, const float* v, int64_t v_stride,
                           const float* alpha, float* o, int64_t o_stride) {
  if constexpr (kVecs > 0) {
    if (n == kVecs)
      PvTile<Tiles::kPvRows, kVecs>(pt, keys, v, v_stride, alpha, o, o_stride);
    else
      PvTailTile<kVecs - 1>(n, pt, keys, v, v_stride, alpha, o, o_stride);
  }
}

// O (kBlockM, dpad) = alpha · O + P · V over one key block; row group [i, i + kPvRows)
// takes the keys_for(i + kPvRows) keys it can see (the rest of its P is 0).
template <class KeysFor>
HWY_INLINE void PvBlock(const float* HWY_RESTRICT pt, const KeysFor& keys_for,
                        const float* HWY_RESTRICT v, int64_t v_stride,
                        const float* HWY_RESTRICT alpha, float* HWY_RESTRICT o, int64_t dpad) {
  constexpr int kRows = Tiles::kPvRows, kVecs = Tiles::kPvChanVecs;
  const int64_t nvec = dpad / kLanes;
  for (int64_t i = 0; i < Tiles::kBlockM; i += kRows) {
    const int64_t keys = keys_for(i + kRows);
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

// ---- one key block: S = Q·Kᵀ, mask, online softmax ---------------------------------------
// Turns st into P^T (keys, kBlockM) for one key block and updates m, l, alpha. The query
// group [i, i + G) (G = kQkQueryVecs·L rows) sees the first keys_for(i + G) keys of the
// block (all `keys` without a causal mask); its tiles past those are skipped and its
// P^T rows past them are never read. Query row q of the block sees key j of the block
// when q >= first_visible + j. K holds whole kQkKeys tiles (zero rows past `keys`).
template <class KeysFor>
HWY_INLINE void ScoresAndSoftmax(const float* HWY_RESTRICT k, int64_t d,
                                 const float* HWY_RESTRICT qt, int64_t keys,
                                 const KeysFor& keys_for, int64_t first_visible,
                                 const Scratch& s) {
  constexpr int kKeys = Tiles::kQkKeys, kVecs = Tiles::kQkQueryVecs;
  constexpr int64_t M = Tiles::kBlockM, kGroupRows = kVecs * kLanes;
  std::fill(s.bmax, s.bmax + M, -std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < M; i += kGroupRows) {
    const int64_t group_keys = round_up(keys_for(i + kGroupRows), kKeys);
    for (int64_t j = 0; j < group_keys; j += kKeys) {
      // Masking is needed where a tile reaches past the block's keys or above the diagonal.
      const TileMask mask{keys - j, first_visible + j - i};
      const bool masked = mask.valid_keys < kKeys || mask.first_visible + kKeys - 1 > 0;
      QkTile<kKeys, kVecs>(k + j * d, d, qt + i, d, s.st + j * M + i, s.bmax + i,
                           masked ? &mask : nullptr);
    }
    // The group's scores are still in L1: softmax them now.
    SoftmaxGroup<kVecs>(s.st, M, group_keys, i, s.bmax, s.m, s.l, s.alpha);
  }
}

// ---- one task ---------------------------------------------------------------------------
// Query rows [i0, i0 + rows) of head h, batch b: the whole loop of Algorithm 1 of
// FlashAttention-2 for one query block, with the output written in the input dtype.
template <DType kDType>
void QueryBlock(const AttentionParams& p, int64_t b, int64_t h, int64_t qb, float* scratch_base) {
  const DF df;
  constexpr int64_t M = Tiles::kBlockM, N = Tiles::kBlockN;
  const int64_t d = p.head_dim, dpad = Scratch::padded_dim(d);
  const Scratch s(scratch_base, d);
  const int64_t i0 = qb * M, rows = std::min(M, p.seqlen_q - i0);
  const int64_t hk = h / p.heads_per_kv();
  const int64_t q_off = b * p.q_batch_stride + i0 * p.q_row_stride + h * p.q_head_stride;
  const int64_t k_off = b * p.k_batch_stride + hk * p.k_head_stride;
  const int64_t v_off = b * p.v_batch_stride + hk * p.v_head_stride;

  // Q^T (d, M) = scale · Q[i0 .. i0+rows)ᵀ, zero for rows past the end (their scores are
  // computed and discarded). The rows go through O's scratch first: whole-vector loads keep
  // many cache misses in flight, and the transpose then reads L1.
  PackRows<kDType>(p.q, q_off, p.q_row_stride, rows, M, d, s.o, dpad);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < d; ++c) s.qt[c * M + r] = p.scale * s.o[r * dpad + c];
  std::fill(s.o, s.o + M * dpad, 0.0f);
  std::fill(s.m, s.m + M, -std::numeric_limits<float>::infinity());
  std::fill(s.l, s.l + M, 0.0f);

  // Keys any row of this block can see: causal row i sees j <= i + offset.
  const bool causal = p.is_causal();
  const int64_t offset = p.seqlen_k - p.seqlen_q;
  const int64_t visible =
      causal ? std::clamp<int64_t>(i0 + rows + offset, 0, p.seqlen_k) : p.seqlen_k;

  for (int64_t j0 = 0; j0 < visible; j0 += N) {
    const int64_t keys = std::min(N, visible - j0);

    // K and V blocks converted to f32 and packed contiguously, even when they are f32
    // already: rows of a (seqlen, heads, d) tensor sit heads·d floats apart (2 KiB for 8
    // heads of 64), which maps a block's rows onto a few L1 sets, and P·V re-reads V once
    // per row group. Packed, a block is 16 KiB that stays in L1 (1.13x end to end at
    // B=1 H=8 N=4096 d=64). Software prefetch of the next block's rows, spread over the
    // tiles, measured no gain and is not done.
    PackRows<kDType>(p.k, k_off + j0 * p.k_row_stride, p.k_row_stride, keys,
                     round_up(keys, Tiles::kQkKeys), d, s.kp, d);
    PackRows<kDType>(p.v, v_off + j0 * p.v_row_stride, p.v_row_stride, keys, keys, d, s.vp, dpad);

    // Keys of this block that rows [0, r_end) can see: on the causal diagonal the later
    // rows see more, and the tiles that no row sees are skipped. Row q of the block sees
    // key j of the block when q >= j0 + j - offset - i0.
    const auto keys_for = [&](int64_t r_end) {
      return causal ? std::clamp<int64_t>(i0 + r_end + offset - j0, 0, keys) : keys;
    };
    const int64_t first_visible =
        causal ? j0 - offset - i0 : -std::numeric_limits<int32_t>::max();

    // (keys, M) S^T = K · Q^T, masked; then P^T = exp(S^T - m_new), m, l, alpha updated.
    ScoresAndSoftmax(s.kp, d, s.qt, keys, keys_for, first_visible, s);
    // (M, dpad) O = alpha · O + P · V
    PvBlock(s.st, keys_for, s.vp, dpad, s.alpha, s.o, dpad);
  }

  // O / l in the output dtype, and LSE, through the shared finalisation.
  const int64_t o_off = b * p.o_batch_stride + i0 * p.o_row_stride + h * p.o_head_stride;
  const int64_t vec_end = d / kLanes * kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    const SoftmaxState<float> state{s.m[r], s.l[r]};
    const float inv_l = output_scale(state);
    const float* o_row = s.o + r * dpad;
    const int64_t dst = o_off + r * p.o_row_stride;
    if constexpr (kDType == DType::f32) {
      float* out = static_cast<float*>(p.o) + dst;
      const VF scale = hn::Set(df, inv_l);
      for (int64_t c = 0; c < vec_end; c += kLanes)
        hn::StoreU(hn::Mul(hn::Load(df, o_row + c), scale), df, out + c);
      for (int64_t c = vec_end; c < d; ++c) out[c] = o_row[c] * inv_l;
    } else {
      // Scalar round-to-nearest-even conversion, bit-exact with the rest of flashtile;
      // once per output element, so it does not show next to the O(N) work per element.
      for (int64_t c = 0; c < d; ++c) store_from_float(p.o, kDType, dst + c, o_row[c] * inv_l);
    }
    if (p.lse != nullptr) p.lse[(b * p.heads_q + h) * p.seqlen_q + i0 + r] = log_sum_exp(state);
  }
}

// ---- per-target entry points ------------------------------------------------------------
inline void RunQueryBlock(const AttentionParams& p, int64_t b, int64_t h, int64_t qb,
                          float* scratch) {
  switch (p.dtype) {
    case DType::f32: return QueryBlock<DType::f32>(p, b, h, qb, scratch);
    case DType::f16: return QueryBlock<DType::f16>(p, b, h, qb, scratch);
    case DType::bf16: return QueryBlock<DType::bf16>(p, b, h, qb, scratch);
  }
}

inline Geometry GetGeometry(int64_t head_dim) {
  return {Tiles::kBlockM, Tiles::kBlockN, kLanes, Scratch::floats(head_dim),
          hwy::TargetName(HWY_TARGET)};
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

inline void OnlineSoftmaxLanes(float* scores, int64_t keys, int64_t rows, float* m, float* l,
                               float* alpha) {
  std::vector<float> bmax(rows, -std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t r = 0; r < rows; ++r) bmax[r] = std::max(bmax[r], scores[j * rows + r]);
  for (int64_t r0 = 0; r0 < rows; r0 += kLanes)
    SoftmaxGroup<1>(scores, rows, keys, r0, bmax.data(), m, l, alpha);
}

}  // namespace flashtile::detail::cpu_flash::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
