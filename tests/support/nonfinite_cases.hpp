// The NaN/Inf rule (docs/VARIANTS.md, "Non-finite values") as cases every backend runs: a
// NaN or an Inf planted in q, k or v, a row whose scores are all -inf, and scores beyond
// fp32's range. The oracle follows the same rule, so each case's expectation is the
// oracle's: a backend must reproduce its NaN pattern exactly (output and LSE), and its
// finite values within a loose bound (the point here is which values are finite).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flashtile/reference.hpp"
#include "testing/attention_case.hpp"

namespace flashtile::testing {

struct NonFiniteCase {
  std::string name;
  Shape shape;
  // Plants the non-finite values (or the huge ones) into the case's inputs.
  void (*plant)(AttentionCase&);
  bool expect_nan = true;  // some output is NaN (false: the rule keeps every row finite)
  // The planted v channel may also turn NaN in rows that do not see its key: a tile kernel
  // multiplies whole V tiles by probabilities, masked ones 0, and 0·NaN is NaN.
  int64_t spreading_v_channel = -1;
};

namespace nonfinite_detail {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

inline void set(HostTensor& t, int64_t s, int64_t h, int64_t c, float x) {
  detail::store_from_float(t.view.data, t.view.dtype, t.index(0, s, h, c), x);
}

// q rows all positive, and k rows 0 and 1 huge negative, row 20 huge positive, the rest
// ordinary: every product of a huge row has one sign, so its dot product overflows fp32 in
// any summation order and whether or not q was scaled first (|scale·q·k| > 4e38 at the
// default scale), while the ordinary rows give ordinary scores. Under the causal mask
// rows 0..1 then see only -inf scores (NaN), rows 2..19 ordinary ones (the huge negative
// keys drop out), rows 20.. a +inf score (NaN).
inline void plant_overflowing_keys(AttentionCase& c) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(0.5f, 1.0f);
  const Shape& s = c.shape;
  for (int64_t i = 0; i < s.seqlen_q; ++i)
    for (int64_t h = 0; h < s.heads_q; ++h)
      for (int64_t ch = 0; ch < s.head_dim; ++ch) set(c.q, i, h, ch, unit(rng));
  for (int64_t j : {0, 1, 20})
    for (int64_t h = 0; h < s.heads_kv; ++h)
      for (int64_t ch = 0; ch < s.head_dim; ++ch)
        set(c.k, j, h, ch, (j == 20 ? 3e38f : -3e38f) * unit(rng));
}

}  // namespace nonfinite_detail

// The cases for one dtype. `variants`: the backend serves softcap (the journey steps don't).
inline std::vector<NonFiniteCase> nonfinite_cases(DType dtype, bool variants) {
  using namespace nonfinite_detail;
  Shape base;
  base.dtype = dtype;
  base.seqlen_q = base.seqlen_k = 37;
  base.heads_q = 2;
  base.heads_kv = 1;  // GQA: a planted k or v value reaches both query heads
  base.head_dim = 32;
  base.causal = true;  // rows before a planted key must stay untouched
  std::vector<NonFiniteCase> cases = {
      {"nan_in_q", base, [](AttentionCase& c) { set(c.q, 5, 0, 3, kNaN); }},
      {"nan_in_k", base, [](AttentionCase& c) { set(c.k, 9, 0, 7, kNaN); }},
      {"nan_in_v", base, [](AttentionCase& c) { set(c.v, 9, 0, 7, kNaN); }, true, 7},
      // +inf in one k channel: rows whose q channel is positive score +inf (NaN), the
      // others -inf (that key drops out).
      {"inf_in_k", base, [](AttentionCase& c) { set(c.k, 12, 0, 0, kInf); }},
      // k channel 0 +inf in every key: q row 20 (channel 0 negative) scores -inf on every
      // key it sees, which is NaN, not an empty row.
      {"every_score_minus_inf",
       base,
       [](AttentionCase& c) {
         for (int64_t j = 0; j < c.shape.seqlen_k; ++j) set(c.k, j, 0, 0, kInf);
         set(c.q, 20, 0, 0, -1.0f);
         set(c.q, 21, 0, 0, 1.0f);
       }},
  };
  // fp16 cannot hold the huge values; fp32 and bf16 can.
  if (dtype != DType::f16) {
    cases.push_back({"scores_beyond_fp32", base, plant_overflowing_keys});
    if (variants) {
      Shape capped = base;
      capped.softcap = 30.0f;  // +-inf scores cap to +-30: every row finite
      cases.push_back({"scores_beyond_fp32_softcapped", capped, plant_overflowing_keys, false});
      Shape with_sink = base;
      with_sink.sinks = true;  // a sink does not make an all -inf row empty
      cases.push_back({"scores_beyond_fp32_with_sinks", with_sink, plant_overflowing_keys});
    }
  }
  return cases;
}

// c.out and c.lse against the oracle for c's inputs: NaN exactly where the oracle has NaN,
// finite elsewhere and within `tolerance`·(1 + |oracle|), except that output channel
// `spreading_v_channel` may be NaN where the oracle's is finite. Also fails when the oracle
// has no NaN at all while `expect_nan` (the case would then test nothing).
inline ::testing::AssertionResult matches_nonfinite_oracle(const AttentionCase& c, double tolerance,
                                                           bool expect_nan,
                                                           int64_t spreading_v_channel = -1) {
  const ReferenceResult ref = c.reference();
  const Shape& s = c.shape;
  int64_t nan_values = 0;
  for (int64_t i = 0; i < s.seqlen_q; ++i)
    for (int64_t h = 0; h < s.heads_q; ++h) {
      const int64_t row = i * s.heads_q + h;  // the oracle's output: q's shape, contiguous
      auto mismatch = [&](const char* what, double got, double want) {
        const bool ok = std::isnan(want) ? std::isnan(got)
                        : std::isinf(want) ? got == want
                                           : std::isfinite(got) &&
                                                 std::fabs(got - want) <= tolerance * (1 + std::fabs(want));
        if (ok) return ::testing::AssertionSuccess();
        return ::testing::AssertionFailure() << what << " of row " << i << " head " << h << ": got "
                                             << got << ", oracle " << want;
      };
      const size_t lse_at = static_cast<size_t>(h * s.seqlen_q + i);  // (batch 1, heads, seqlen_q)
      if (auto r = mismatch("lse", c.lse[lse_at], ref.lse[lse_at]); !r) return r;
      nan_values += std::isnan(ref.lse[lse_at]);
      for (int64_t ch = 0; ch < s.head_dim; ++ch) {
        const double got = detail::load_as_float(c.out.view.data, c.out.view.dtype, c.out.index(0, i, h, ch));
        const double want = ref.out[static_cast<size_t>(row * s.head_dim + ch)];
        nan_values += std::isnan(want);
        if (ch == spreading_v_channel && std::isnan(got)) continue;
        if (auto r = mismatch("out", got, want); !r) return r << " (channel " << ch << ")";
      }
    }
  if (expect_nan && nan_values == 0)
    return ::testing::AssertionFailure() << "the oracle has no NaN: the case tests nothing";
  return ::testing::AssertionSuccess();
}

// The loose bound for finite values: the rule is about which values are finite.
inline double nonfinite_tolerance(DType dtype) { return dtype == DType::f32 ? 1e-4 : 3e-2; }

}  // namespace flashtile::testing
