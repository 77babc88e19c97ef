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

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace flashtile::detail::cpu_flash_backward::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// A register tile of kRows × kVecs accumulators (8), kVecs loaded rows of B and one
// broadcast of A: 11 vector registers, within the 16 of AVX2/SSE4.
constexpr int kRows = 4;
constexpr int kVecs = 2;

// c[0..R) × [0..V·L) (+)= a[0..R) × [0..k) · b[0..k) × [0..V·L).
template <int R, int V>
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
      const VF x = hn::Set(df, a[r * lda + p]);
      for (int v = 0; v < V; ++v) sum[r][v] = hn::MulAdd(x, row[v], sum[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) hn::StoreU(sum[r][v], df, c + r * ldc + v * lanes);
}

template <int R>
HWY_INLINE void GemmRows(const float* HWY_RESTRICT a, int64_t lda, const float* HWY_RESTRICT b,
                         int64_t ldb, float* HWY_RESTRICT c, int64_t ldc, int64_t n, int64_t k,
                         bool accumulate) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(DF()));
  int64_t j = 0;
  for (; j + kVecs * lanes <= n; j += kVecs * lanes)
    MicroTile<R, kVecs>(a, lda, b + j, ldb, c + j, ldc, k, accumulate);
  for (; j < n; j += lanes) MicroTile<R, 1>(a, lda, b + j, ldb, c + j, ldc, k, accumulate);
}

// C (m × n, row stride ldc) (+)= A (m × k) · B (k × n), all fp32 row-major; n is a multiple
// of the vector length (the callers pad their tiles so).
HWY_NOINLINE void Gemm(const float* HWY_RESTRICT a, int64_t lda, const float* HWY_RESTRICT b,
                       int64_t ldb, float* HWY_RESTRICT c, int64_t ldc, int64_t m, int64_t n,
                       int64_t k, bool accumulate) {
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows)
    GemmRows<kRows>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, k, accumulate);
  for (; i < m; ++i) GemmRows<1>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, k, accumulate);
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

// exp(x), exactly 0 below ln(2^-126) and for -inf (masked logits), as the oracle's.
HWY_INLINE VF ExpOrZero(DF df, VF x) {
  constexpr float kMinExpArg = -87.33654475f;
  const VF lo = hn::Set(df, kMinExpArg);
  return hn::IfThenZeroElse(hn::Lt(x, lo), hn::Exp(df, hn::Max(x, lo)));
}

// s (logits, -inf where masked) becomes P = exp(s - lse_i) and dp becomes
// dS = P∘(dP - D_i)∘chain, chain being the tile of derivatives (null: the constant `scale`).
HWY_NOINLINE void Probabilities(float* HWY_RESTRICT s, float* HWY_RESTRICT dp,
                                const float* HWY_RESTRICT chain, int64_t ld, int64_t rows,
                                int64_t n, const float* HWY_RESTRICT lse,
                                const float* HWY_RESTRICT row_sums, float scale) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t i = 0; i < rows; ++i) {
    const VF shift = hn::Set(df, lse[i]), d = hn::Set(df, row_sums[i]);
    for (int64_t j = 0; j < n; j += lanes) {
      const VF p = ExpOrZero(df, hn::Sub(hn::LoadU(df, s + i * ld + j), shift));
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
