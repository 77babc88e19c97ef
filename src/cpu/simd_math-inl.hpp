// The vectorised exp and tanh that cpu_flash's forward and backward kernels share, compiled
// once per Highway target like the kernel headers that include it (Highway's re-inclusion
// guard, not #pragma once).
#if defined(FLASHTILE_CPU_SIMD_MATH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FLASHTILE_CPU_SIMD_MATH_INL_H_
#undef FLASHTILE_CPU_SIMD_MATH_INL_H_
#else
#define FLASHTILE_CPU_SIMD_MATH_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace flashtile::detail::simd_math::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- vectorised exp -------------------------------------------------------------------
// exp(x) = 2^n · exp(r) with n = round(x / ln2) and |r| <= ln2/2; exp(r) = 1 + r + r²·q(r)
// with q of degree 4 fitted (weighted least squares on Chebyshev nodes, for relative error)
// to (exp(r) - 1 - r) / r². Max relative error 1.2e-7 (2 ulp) on [-87, 88]; -inf and
// anything below kMinExpArg give exactly 0, which is what masked scores need, and NaN stays
// NaN (it flows through the arithmetic): a NaN score must make its row NaN, not vanish as a
// clamp to -88 would make it. The domain ends at 88 (n = 127); the kernels only ever pass
// x <= 0 (a score minus the running max, or the old max minus the new).
// The rounding is the shifter trick: adding 1.5·2^23 leaves n in the low mantissa bits, and
// with 127 folded into the shifter those bits shifted into the exponent field are 2^n.
template <class D>
HWY_INLINE hn::Vec<D> FastExp(D d, hn::Vec<D> x) {
  const hn::RebindToSigned<D> di;
  constexpr float kShifter = 12582912.0f + 127.0f;  // 1.5·2^23 + exponent bias
  // ln(2^-126): below it 2^n would leave the normal range, and the result is flushed to 0.
  constexpr float kMinExpArg = -87.33654475f;
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
  // (n + 127) << 23: the exponent field of 2^n.
  const auto two_n = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, shifted)));
  // A compare is false for NaN, so NaN lanes keep their (NaN) product.
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, kMinExpArg)), hn::Mul(e_r, two_n));
}

// ---- vectorised tanh, for the softcap ----------------------------------------------------
// 1/x from the CPU's reciprocal estimate and Newton steps r <- r·(2 - x·r): the estimate has
// 14 bits on AVX-512 and 12 on AVX2/SSE4 (one step: ~24), 8 on NEON (two steps); the
// portable targets divide. A zmm divide would issue once per 10 cycles, once per score.
template <class D>
HWY_INLINE hn::Vec<D> Reciprocal(D d, hn::Vec<D> x) {
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
  return hn::Div(hn::Set(d, 1.0f), x);
#else
  auto r = hn::ApproximateReciprocal(x);
  constexpr int kSteps = HWY_TARGET == HWY_NEON ? 2 : 1;
  for (int i = 0; i < kSteps; ++i) r = hn::Mul(r, hn::NegMulAdd(x, r, hn::Set(d, 2.0f)));
  return r;
#endif
}

// tanh(x) = x·P(x²) / Q(x²) for |x| < 9, and ±1 beyond (tanh(9) is 1 - 3e-8). P (degree 6)
// and Q (degree 3) were fitted for relative error (Sanathanan–Koerner least squares, then
// Lawson reweighting towards minimax; 6.6e-9 in exact arithmetic) by the script in
// docs/JOURNEY.md ("cpu_flash on the feature core"). Evaluated in float with FMA the error
// is 5.2 ulp with an exact divide, 4.8 with AVX-512's reciprocal, 6.4 with AVX2/SSE4's
// (CpuFlash.VectorTanhIsWithinSevenUlpOnEveryTarget), against Highway's Tanh at 4 ulp, in
// about 20 operations instead of its ~35 (an expm1 and a divide): softcap cost the forward
// 32% at d=64 with that, 13% with this. The compare is false for NaN, so NaN stays NaN.
template <class D>
HWY_INLINE hn::Vec<D> FastTanh(D d, hn::Vec<D> x) {
  const auto x2 = hn::Mul(x, x);
  auto p = hn::Set(d, -8.489075328e-14f);
  p = hn::MulAdd(p, x2, hn::Set(d, 5.278107118e-11f));
  p = hn::MulAdd(p, x2, hn::Set(d, -2.022558832e-08f));
  p = hn::MulAdd(p, x2, hn::Set(d, 1.115440500e-05f));
  p = hn::MulAdd(p, x2, hn::Set(d, 3.103965893e-03f));
  p = hn::MulAdd(p, x2, hn::Set(d, 1.308401823e-01f));
  p = hn::MulAdd(p, x2, hn::Set(d, 1.0f));
  auto q = hn::Set(d, 2.546159085e-04f);
  q = hn::MulAdd(q, x2, hn::Set(d, 2.449521795e-02f));
  q = hn::MulAdd(q, x2, hn::Set(d, 4.641734660e-01f));
  q = hn::MulAdd(q, x2, hn::Set(d, 1.0f));
  const auto ratio = hn::Mul(hn::Mul(x, p), Reciprocal(d, q));
  const auto saturated = hn::Ge(hn::Abs(x), hn::Set(d, 9.0f));  // also x = ±inf, x² = inf
  return hn::IfThenElse(saturated, hn::CopySignToAbs(hn::Set(d, 1.0f), x), ratio);
}

}  // namespace flashtile::detail::simd_math::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FLASHTILE_CPU_SIMD_MATH_INL_H_
