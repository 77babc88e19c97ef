// A variant of attention as one test row: the window, causal, softcap, ALiBi and sinks that
// with_variant() sets on a Shape. Each suite keeps its own list of them.
#pragma once

#include "testing/attention_case.hpp"

namespace flashtile::testing {

struct Variant {
  const char* name;
  Window window;
  bool causal = false;
  float softcap = 0.0f;
  bool alibi = false, alibi_per_batch = false, sinks = false;
};

inline Shape with_variant(Shape s, const Variant& v) {
  s.window = v.window;
  s.causal = v.causal;
  s.softcap = v.softcap;
  s.alibi = v.alibi;
  s.alibi_per_batch = v.alibi_per_batch;
  s.sinks = v.sinks;
  return s;
}

}  // namespace flashtile::testing
