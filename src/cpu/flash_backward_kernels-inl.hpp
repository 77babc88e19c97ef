// cpu_flash backward per-target SIMD code (compiled once per Highway target by
// flash_backward_hwy.cpp): the small fp32 matrix product every block product of the
// backward is, and the element-wise steps between them (the softcap and its chain rule;
// P = exp(S - lse) and dS = P∘(dP - D)∘chain). The schedule, the tiles and the mask are in
// flash_backward.cpp; this file sees only dense fp32 tiles.
#if defined(FLASHTILE_CPU_FLASH_BACKWARD_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FLASHTILE_CPU_FLASH_BACKWARD_KERNELS_INL_H_
#undef FLASHTILE_CPU_FLASH_BACKWARD_KERNELS_INL_H_
#else
#define FLASHTILE_CPU_FLASH_BACKWARD_KERNELS_INL_H_
#endif

#include <cstdint>

#include "cpu/simd_math-inl.hpp"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace flashtile::detail::cpu_flash_backward::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// A register tile of kRows × kVecs accumulators, kVecs loaded vectors of B and one
// broadcast of A: on targets with 32 vector registers (AVX-512, NEON) 6 × 4 (24 + 5 of
// them, 24 FMAs per 10 loads), on those with 16 (AVX2, SSE4) 3 × 4 (12 + 5, 12 FMAs per 7
// loads). 6 × 4 measured 1.3x faster than 4 × 2 on AVX-512 (N=2048 d=64, one thread).
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3) || (HWY_ARCH_ARM_A64 && HWY_TARGET == HWY_NEON)
constexpr int kRows = 6;
#else
constexpr int kRows = 3;
#endif
constexpr int kVecs = 4;

// c[0..R) × [0..V·L) (+)= a[0..R) × [0..k) · b[0..k) × [0..V·L); a is read as stored
// (row r at a + r·lda) or, kTransA, as the transpose of a (k × R) matrix (aᵀ: column r).
template <int R, int V, bool kTransA>
HWY_INLINE void MicroTile(const float* HWY_RESTRICT a, int64_t lda, const float* HWY_RESTRICT b,
                          int64_t ldb, float* HWY_RESTRICT c, int64_t ldc, int64_t k,
                          bool accumulate) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  VF sum[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v)
      sum[r][v] = accumulate ? hn::LoadU(df, c + r * ldc + v * lanes) : hn::Zero(df);
  for (int64_t p = 0; p < k; ++p) {
    VF row[V];
    for (int v = 0; v < V; ++v) row[v] = hn::LoadU(df, b + p * ldb + v * lanes);
    for (int r = 0; r < R; ++r) {
      const VF x = hn::Set(df, kTransA ? a[p * lda + r] : a[r * lda + p]);
      for (int v = 0; v < V; ++v) sum[r][v] = hn::MulAdd(x, row[v], sum[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) hn::StoreU(sum[r][v], df, c + r * ldc + v * lanes);
}

// One column panel (V vectors wide) of C over all m rows: row tiles of kRows, the last rows
// in two tiles of nearly equal height (64 = 9·6 + 5 + 5 on 32-register targets, instead of
// 10·6 + 2 + 2: a 2-row tile has only 8 accumulators for 2 FMA ports of latency 4).
template <int V, bool kTransA>
HWY_INLINE void GemmPanel(const float* HWY_RESTRICT a, int64_t lda, const float* HWY_RESTRICT b,
                          int64_t ldb, float* HWY_RESTRICT c, int64_t ldc, int64_t m, int64_t k,
                          bool accumulate) {
  auto tile = [&](int64_t i, int64_t rows) {
    const float* ai = kTransA ? a + i : a + i * lda;
    float* ci = c + i * ldc;
    switch (rows) {
      case 1: return MicroTile<1, V, kTransA>(ai, lda, b, ldb, ci, ldc, k, accumulate);
      case 2: return MicroTile<2, V, kTransA>(ai, lda, b, ldb, ci, ldc, k, accumulate);
      case 3: return MicroTile<3, V, kTransA>(ai, lda, b, ldb, ci, ldc, k, accumulate);
      default:
        if constexpr (kRows >= 6) {
          if (rows == 4) return MicroTile<4, V, kTransA>(ai, lda, b, ldb, ci, ldc, k, accumulate);
          if (rows == 5) return MicroTile<5, V, kTransA>(ai, lda, b, ldb, ci, ldc, k, accumulate);
          return MicroTile<6, V, kTransA>(ai, lda, b, ldb, ci, ldc, k, accumulate);
        }
    }
  };
  int64_t i = 0;
  // Full tiles while more than a full tile and a half remain; then the rest in one or two.
  for (; m - i >= 2 * kRows; i += kRows) tile(i, kRows);
  const int64_t rest = m - i;
  if (rest > kRows) {
    tile(i, (rest + 1) / 2);
    tile(i + (rest + 1) / 2, rest / 2);
  } else if (rest > 0) {
    tile(i, rest);
  }
}

// Column panels outermost: a panel of B (k × V·L) stays in L1 while every row tile of A
// passes over it (k × n of B would not at d = 128: 32 KiB beside A and C). Each C element
// still sums its k products in order, so the bits are those of any other tile order.
template <bool kTransA>
HWY_INLINE void GemmAll(const float* HWY_RESTRICT a, int64_t lda, const float* HWY_RESTRICT b,
                        int64_t ldb, float* HWY_RESTRICT c, int64_t ldc, int64_t m, int64_t n,
                        int64_t k, bool accumulate) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(DF()));
  int64_t j = 0;
  for (; j + kVecs * lanes <= n; j += kVecs * lanes)
    GemmPanel<kVecs, kTransA>(a, lda, b + j, ldb, c + j, ldc, m, k, accumulate);
  for (; j + 2 * lanes <= n; j += 2 * lanes)
    GemmPanel<2, kTransA>(a, lda, b + j, ldb, c + j, ldc, m, k, accumulate);
  for (; j < n; j += lanes) GemmPanel<1, kTransA>(a, lda, b + j, ldb, c + j, ldc, m, k, accumulate);
}

// C (m × n, row stride ldc) (+)= A (m × k) · B (k × n), all fp32 row-major, or Aᵀ · B when
// trans_a (a then holds the k × m matrix); n is a multiple of the vector length (the callers
// pad their tiles so).
HWY_NOINLINE void Gemm(const float* HWY_RESTRICT a, int64_t lda, const float* HWY_RESTRICT b,
                       int64_t ldb, float* HWY_RESTRICT c, int64_t ldc, int64_t m, int64_t n,
                       int64_t k, bool accumulate, bool trans_a) {
  if (trans_a)
    GemmAll<true>(a, lda, b, ldb, c, ldc, m, n, k, accumulate);
  else
    GemmAll<false>(a, lda, b, ldb, c, ldc, m, n, k, accumulate);
}

// s (rows × n, stride ld) holds q·k: it becomes the softcapped logit c·tanh(q·k·capped_scale)
// and chain the derivative scale·(1 - tanh²) (LogitsTransform's scaled and
// scaled_derivative<true>, lane-wise).
HWY_NOINLINE void Softcap(float* HWY_RESTRICT s, float* HWY_RESTRICT chain, int64_t ld,
                          int64_t rows, int64_t n, float scale, float softcap,
                          float capped_scale) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const VF vcs = hn::Set(df, capped_scale), vc = hn::Set(df, softcap), vs = hn::Set(df, scale);
  const VF one = hn::Set(df, 1.0f);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; j += lanes) {
      const VF t = hn::Tanh(df, hn::Mul(hn::LoadU(df, s + i * ld + j), vcs));
      hn::StoreU(hn::Mul(vc, t), df, s + i * ld + j);
      hn::StoreU(hn::Mul(vs, hn::NegMulAdd(t, t, one)), df, chain + i * ld + j);
    }
}

// exp(x), exactly 0 below ln(2^-126) and for -inf (masked logits): the forward's FastExp
// (2 ulp on [-87, 88]; its derivation is in simd_math-inl.hpp). It replaced Highway's Exp
// (more range reduction and a wider polynomial), which was ~5% of a call at d=128.
using simd_math::HWY_NAMESPACE::FastExp;

// s (logits, -inf where masked) becomes P = exp(s·logit_scale - lse_i) and dp becomes
// dS = P∘(dP - D_i)∘chain, chain being the tile of derivatives (null: the constant `scale`).
HWY_NOINLINE void Probabilities(float* HWY_RESTRICT s, float* HWY_RESTRICT dp,
                                const float* HWY_RESTRICT chain, int64_t ld, int64_t rows,
                                int64_t n, const float* HWY_RESTRICT lse,
                                const float* HWY_RESTRICT row_sums, float logit_scale,
                                float scale) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t i = 0; i < rows; ++i) {
    const VF shift = hn::Set(df, lse[i]), d = hn::Set(df, row_sums[i]);
    const VF ls = hn::Set(df, logit_scale);
    for (int64_t j = 0; j < n; j += lanes) {
      const VF p = FastExp(df, hn::MulSub(hn::LoadU(df, s + i * ld + j), ls, shift));
      hn::StoreU(p, df, s + i * ld + j);
      const VF factor = chain != nullptr ? hn::LoadU(df, chain + i * ld + j) : hn::Set(df, scale);
      const VF ds = hn::Mul(hn::Mul(p, hn::Sub(hn::LoadU(df, dp + i * ld + j), d)), factor);
      hn::StoreU(ds, df, dp + i * ld + j);
    }
  }
}

HWY_NOINLINE int64_t VectorLanes() { return static_cast<int64_t>(hn::Lanes(DF())); }

}  // namespace flashtile::detail::cpu_flash_backward::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
