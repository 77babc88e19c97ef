// One assertion for "the outputs left in this case match the oracle", with the errors and
// bounds in the failure message. Used by every backend's suite.
#pragma once

#include <gtest/gtest.h>

#include <optional>

#include "flashtile/reference.hpp"
#include "testing/attention_case.hpp"

namespace flashtile::testing {

// A verdict of verify_case as one assertion.
inline ::testing::AssertionResult matches_oracle(const AttentionCase& c, const Verification& v) {
  if (v.pass()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << c.shape.describe() << ": out err " << v.out_error << " (bound " << v.out_bound
         << "), lse err " << v.lse_error << " (bound " << v.lse_bound << ")";
}

// The oracle's verdict on c.out and c.lse (already copied back to the host for GPU runs)
// for c's inputs, variant and `scale` (default 1/sqrt(head_dim)), errors and bounds included.
inline Verification verify_case(const AttentionCase& c, std::optional<float> scale = std::nullopt) {
  const Options ref = c.reference_options(scale);
  const std::optional<Varlen> varlen = c.varlen();
  return verify_forward(c.q.view, c.k.view, c.v.view, c.out.view, c.lse.data(), ref,
                        varlen ? &*varlen : nullptr);
}

// The same as one assertion.
inline ::testing::AssertionResult matches_oracle(const AttentionCase& c,
                                                 std::optional<float> scale = std::nullopt) {
  return matches_oracle(c, verify_case(c, scale));
}

}  // namespace flashtile::testing
