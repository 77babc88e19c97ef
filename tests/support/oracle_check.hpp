// One assertion for "the outputs left in this case match the oracle", with the errors and
// bounds in the failure message. Used by every backend's suite.
#pragma once

#include <gtest/gtest.h>

#include <optional>

#include "flashtile/reference.hpp"
#include "testing/attention_case.hpp"

namespace flashtile::testing {

// Checks c.out and c.lse (already copied back to the host for GPU runs) against the oracle
// for c's inputs, variant and `scale` (default 1/sqrt(head_dim)).
inline ::testing::AssertionResult matches_oracle(const AttentionCase& c,
                                                 std::optional<float> scale = std::nullopt) {
  const Options ref = c.reference_options(scale);
  const std::optional<Varlen> varlen = c.varlen();
  const Verification v = verify_forward(c.q.view, c.k.view, c.v.view, c.out.view, c.lse.data(),
                                        ref, varlen ? &*varlen : nullptr);
  if (v.pass()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << c.shape.describe() << ": out err " << v.out_error << " (bound " << v.out_bound
         << "), lse err " << v.lse_error << " (bound " << v.lse_bound << ")";
}

}  // namespace flashtile::testing
