// Runtime features -> template flags, in one place (FlashAttention-2's static_switch.h).
// Masks (causal, window) and varlen stay runtime data: they change trip counts and edge
// tiles, not the inner loop. The logits features change every score, so kernels may
// specialise on them; each kernel family instantiates the combinations its traits list.
#pragma once

#include "api/params.hpp"

namespace flashtile::detail {

template <bool kSoftcap_, bool kAlibi_>
struct LogitsFlags {
  static constexpr bool kSoftcap = kSoftcap_;
  static constexpr bool kAlibi = kAlibi_;
  // Plain scale·q·k: kernels may fold the scale into their exp2.
  static constexpr bool kPlain = !kSoftcap && !kAlibi;
};

// Calls fn(LogitsFlags<softcap on?, alibi on?>{}) for p's features.
template <class Fn>
decltype(auto) with_logits_flags(const AttentionParams& p, Fn&& fn) {
  const bool softcap = p.softcap != 0.0f, alibi = p.alibi_slopes != nullptr;
  if (softcap) return alibi ? fn(LogitsFlags<true, true>{}) : fn(LogitsFlags<true, false>{});
  return alibi ? fn(LogitsFlags<false, true>{}) : fn(LogitsFlags<false, false>{});
}

}  // namespace flashtile::detail
