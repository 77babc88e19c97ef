// A variant of attention as one test row: the window, causal, softcap, ALiBi and sinks that
// with_variant() sets on a Shape. Most suites keep their own list of them; the forward
// tensor-core suites (cuda_mma, cuda_tf32x3) share theirs, and the lengths they run them at.
#pragma once

#include <cstdint>
#include <vector>

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

// One feature at a time, then every combination.
inline const std::vector<Variant>& forward_variants() {
  static const std::vector<Variant> all = {
      {"sliding window, causal-like", {16, 0}},
      {"the diagonal only", {0, 0}},
      {"both sides bounded", {5, 7}},
      {"right side only", {-1, 3}},
      {"left side only (first rows heaviest)", {40, -1}},
      {"causal + left window", {70, 0}, true},
      {"softcap", {}, false, 5.0f},
      {"causal + softcap", {}, true, 30.0f},
      {"ALiBi (heads)", {}, false, 0, true},
      {"causal + ALiBi (batch, heads)", {}, true, 0, true, true},
      {"sinks", {}, false, 0, false, false, true},
      {"causal + sinks (empty rows when sq > sk)", {}, true, 0, false, false, true},
      {"softcap + ALiBi", {}, false, 20.0f, true},
      {"window + ALiBi + sinks", {33, 9}, false, 0, true, false, true},
      {"causal + softcap + sinks", {}, true, 8.0f, false, false, true},
      {"everything", {64, 0}, false, 12.0f, true, true, true},
  };
  return all;
}

// The variants of the forward suites' packed varlen batches (ALiBi slopes per (sequence,
// head)).
inline const std::vector<Variant>& varlen_variants() {
  static const std::vector<Variant> all = {
      {"full", {}},
      {"causal", {}, true},
      {"window + sinks", {20, 3}, false, 0, false, false, true},
      {"causal + softcap + ALiBi + sinks", {}, true, 15.0f, true, true, true},
  };
  return all;
}

// Query and key lengths that put the window edges, the diagonal and the end of K inside
// tiles, sq != sk both ways; `large` adds a longer pair.
struct Lengths {
  int64_t q, k;
};
inline std::vector<Lengths> variant_lengths(bool large) {
  std::vector<Lengths> lengths = {{1, 1}, {17, 200}, {200, 17}, {129, 129}, {100, 300}};
  if (large) lengths.push_back({700, 513});
  return lengths;
}

}  // namespace flashtile::testing
