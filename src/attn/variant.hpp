// The logits of one (batch, head) and its sink: what FlashInfer's variants.cuh calls the
// logits transform, with the mask in attn/mask.hpp. The order is FlashAttention's:
//   S = scale·q·k;  S <- c·tanh(S/c) (softcap c > 0);  S <- S - slope·|i + sk - sq - j| (ALiBi)
// The oracle applies operator() per score; specialised kernels call apply<kSoftcap, kAlibi>
// so that what is off costs nothing (the flags come from attn/features.hpp), and SIMD
// kernels read the same fields.
#pragma once

#include <cmath>
#include <limits>

#include "api/params.hpp"
#include "attn/mask.hpp"

namespace flashtile::detail {

// The softcap's tanh, to full precision (what the oracle and the fp32 kernels use). A
// kernel may pass a faster one to apply() when its error stays under its inputs' rounding.
struct PreciseTanh {
  FT_HOST_DEVICE float operator()(float x) const {
#if defined(__CUDA_ARCH__)
    return tanhf(x);
#else
    return std::tanh(x);
#endif
  }
  FT_HOST_DEVICE double operator()(double x) const { return std::tanh(x); }
};

// |x| as one instruction (an operand modifier on the GPU), not a compare and select.
FT_HOST_DEVICE float magnitude(float x) {
#if defined(__CUDA_ARCH__)
  return fabsf(x);
#else
  return std::fabs(x);
#endif
}
FT_HOST_DEVICE double magnitude(double x) { return std::fabs(x); }

template <class T>
struct LogitsTransform {
  T scale = T(1);
  T softcap = T(0);       // 0 = off
  T capped_scale = T(0);  // scale / softcap: S/c = qk·capped_scale, one multiply
  T slope = T(0);         // ALiBi slope of this head; 0 = off

  // scale·qk, capped when kSoftcap: c·tanh(scale·qk / c).
  template <bool kSoftcap, class Tanh = PreciseTanh>
  FT_HOST_DEVICE T scaled(T qk, Tanh tanh = {}) const {
    if constexpr (kSoftcap) return softcap * capped_in_cap_units(qk, tanh);
    return qk * scale;
  }
  // The softcapped logit in units of the cap, tanh(scale·qk / c): a kernel that keeps its
  // scores in these units folds c into the exp2's multiply (c > 0 keeps the max in place).
  template <class Tanh = PreciseTanh>
  FT_HOST_DEVICE T capped_in_cap_units(T qk, Tanh tanh = {}) const {
    return tanh(qk * capped_scale);
  }
  // d scaled / d qk, the backward pass's chain rule, from the scaled value itself: scale, or
  // scale·(1 - tanh²) = scale·(1 - (capped/c)²) under the softcap. ALiBi adds a constant
  // and contributes nothing here.
  template <bool kSoftcap>
  FT_HOST_DEVICE T scaled_derivative(T scaled_value) const {
    if constexpr (kSoftcap) {
      const T t = scaled_value / softcap;
      return scale * (T(1) - t * t);
    }
    return scale;
  }
  // -slope·|diagonal(i) - j|, the distance taken in T: exact while positions stay below
  // 2^24 in float (2^53 in double), and a tile kernel converts each key column to T once
  // for all its rows instead of once per score.
  template <class Int>
  FT_HOST_DEVICE T alibi_bias(const Mask<Int>& mask, Int i, Int j) const {
    return -slope * magnitude(T(mask.diagonal(i)) - T(j));
  }

  // The logit of raw dot product qk for query i, key j, with the features fixed at compile
  // time (the kernels' path).
  template <bool kSoftcap, bool kAlibi, class Int, class Tanh = PreciseTanh>
  FT_HOST_DEVICE T apply(T qk, const Mask<Int>& mask, Int i, Int j, Tanh tanh = {}) const {
    T s = scaled<kSoftcap>(qk, tanh);
    if constexpr (kAlibi) s += alibi_bias(mask, i, j);
    return s;
  }
  // The same with the features read at run time (the oracle's path).
  template <class Int>
  FT_HOST_DEVICE T operator()(T qk, const Mask<Int>& mask, Int i, Int j) const {
    T s = softcap != T(0) ? scaled<true>(qk) : scaled<false>(qk);
    if (slope != T(0)) s += alibi_bias(mask, i, j);
    return s;
  }
};

// The transform of batch entry b, query head h.
template <class T>
FT_HOST_DEVICE LogitsTransform<T> logits_transform(const AttentionParams& p, int64_t b, int64_t h) {
  LogitsTransform<T> t;
  t.scale = T(p.scale);
  if (p.softcap != 0.0f) {
    t.softcap = T(p.softcap);
    t.capped_scale = T(p.scale) / T(p.softcap);
  }
  if (p.alibi_slopes != nullptr)
    t.slope = T(p.alibi_slopes[b * p.alibi_batch_stride + h * p.alibi_head_stride]);
  return t;
}

// The sink logit of query head h, or -inf without sinks (add_sink then changes nothing).
template <class T>
FT_HOST_DEVICE T sink_logit(const AttentionParams& p, int64_t h) {
  return p.sinks != nullptr ? T(p.sinks[h * p.sinks_stride]) : -std::numeric_limits<T>::infinity();
}

}  // namespace flashtile::detail
