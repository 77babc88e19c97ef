// 2^x on the FMA pipe, for scores whose exponential would otherwise queue behind the
// special-function unit (FlashAttention-4's idea for its exp): a kernel that already spends
// one MUFU op per score elsewhere (the softcap's tanh) moves part of its exp2s here.
//
// x = j + f with j = round(x) and f in [-1/2, 1/2]; 2^f is a degree-3 polynomial (fitted for
// relative error over [-1/2, 1/2], max 1.0e-4: a fifth of fp16's half-ulp, a twentieth of
// bf16's) and 2^j is built in the exponent bits. About nine FP32/ALU instructions instead
// of one MUFU.EX2 (8.5 a score in the SASS at d=128).
//
// Domain: the softmax's x <= 0 (x - max). x < -126.5 (and -inf) gives exactly +0 (j = -127),
// as a masked score must; -126.5 <= x < -126 gives a denormal where ex2.approx.ftz gives +0,
// both far below any visible score's weight; NaN stays NaN (the clamp propagates it, and 2^j
// multiplies rather than adds).
#pragma once

#include <cstdint>

namespace flashtile::detail::ptx {

// max(x, y) that returns NaN when either is NaN (fmaxf drops it).
__device__ __forceinline__ float max_nan(float x, float y) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(x), "f"(y));
  return r;
}

__device__ __forceinline__ float exp2_fma(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5·2^23: x + kRound rounds x to an integer
  constexpr float kC1 = 0.6932829f, kC2 = 0.24221037f, kC3 = 0.05500858f;
  const float clamped = max_nan(x, -127.0f);
  const float shifted = clamped + kRound;  // its low mantissa bits hold j (two's complement)
  const float j = shifted - kRound;        // exact
  const float f = clamped - j;             // exact, in [-1/2, 1/2]
  const float p = fmaf(fmaf(fmaf(kC3, f, kC2), f, kC1), f, 1.0f);  // 2^f
  // 2^j as a float: (j + 127) << 23; j = -127 gives +0. The shift drops kRound's bits.
  const uint32_t pow2_j = (__float_as_uint(shifted) << 23) + 0x3F800000u;
  return p * __uint_as_float(pow2_j);
}

}  // namespace flashtile::detail::ptx
