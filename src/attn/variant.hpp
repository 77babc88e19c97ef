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

template <class T>
struct LogitsTransform {
  T scale = T(1);
  T softcap = T(0), inv_softcap = T(0);  // 0 = off
  T slope = T(0);                        // ALiBi slope of this head; 0 = off

  FT_HOST_DEVICE T capped(T s) const {
#if defined(__CUDA_ARCH__)
    return softcap * tanhf(s * inv_softcap);
#else
    return softcap * std::tanh(s * inv_softcap);
#endif
  }
  template <class Int>
  FT_HOST_DEVICE T alibi_bias(const Mask<Int>& mask, Int i, Int j) const {
    return -slope * T(mask.distance(i, j));
  }

  // The logit of raw dot product qk for query i, key j, with the features fixed at compile
  // time (the kernels' path).
  template <bool kSoftcap, bool kAlibi, class Int>
  FT_HOST_DEVICE T apply(T qk, const Mask<Int>& mask, Int i, Int j) const {
    T s = qk * scale;
    if constexpr (kSoftcap) s = capped(s);
    if constexpr (kAlibi) s += alibi_bias(mask, i, j);
    return s;
  }
  // The same with the features read at run time (the oracle's path).
  template <class Int>
  FT_HOST_DEVICE T operator()(T qk, const Mask<Int>& mask, Int i, Int j) const {
    T s = qk * scale;
    if (softcap != T(0)) s = capped(s);
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
    t.inv_softcap = T(1) / T(p.softcap);
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
