// Host-side conversions between float and the 16-bit storage types, bit-exact with
// CUDA's __float2half_rn / __float2bfloat16_rn (round to nearest even).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "flashtile/flashtile.hpp"

namespace flashtile::detail {

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t bits = float_to_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1F;
  uint32_t mantissa = h & 0x3FF;
  if (exponent == 0x1F) return bits_to_float(sign | 0x7F800000 | (mantissa << 13));  // inf/NaN
  if (exponent == 0) {
    if (mantissa == 0) return bits_to_float(sign);
    // Subnormal: value = mantissa * 2^-24.
    float value = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -value : value;
  }
  return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t float_to_f16(float f) {
  const uint32_t bits = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const float magnitude = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7E00;
  if (magnitude >= 65520.0f) return sign | 0x7C00;  // rounds to inf
  if (magnitude < 6.103515625e-05f) {
    // Subnormal range: quantise to multiples of 2^-24 with round-to-nearest-even.
    const float scaled = magnitude * 16777216.0f;  // exact (power of two)
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  const uint32_t exponent = ((bits >> 23) & 0xFF) - 112;
  uint32_t mantissa = bits & 0x7FFFFF;
  uint32_t half = (exponent << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;  // may carry into exponent
  return sign | static_cast<uint16_t>(half);
}

// Reads element i of a buffer of `dtype` as float.
inline float load_as_float(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(data)[i];
    case DType::f16: return f16_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

// Writes float `x` as element i of a buffer of `dtype` (rounding to nearest even).
inline void store_from_float(void* data, DType dtype, int64_t i, float x) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(data)[i] = x; break;
    case DType::f16: static_cast<uint16_t*>(data)[i] = float_to_f16(x); break;
    case DType::bf16: static_cast<uint16_t*>(data)[i] = float_to_bf16(x); break;
  }
}

// Rounds x to the precision of `dtype` (identity for f32).
inline float round_to(DType dtype, float x) {
  switch (dtype) {
    case DType::f32: return x;
    case DType::f16: return f16_to_float(float_to_f16(x));
    case DType::bf16: return bf16_to_float(float_to_bf16(x));
  }
  return x;
}

}  // namespace flashtile::detail
