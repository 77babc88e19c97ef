// One assertion for "the outputs left in this case match the oracle", with the errors and
// bounds in the failure message. Used by every backend's suite.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

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

// The oracle on single rows of c's fp32 output (dense, batch 1, non-causal: rows are
// independent), for lengths whose full check would take too long. `what` starts each
// failure message.
inline void expect_rows_match_oracle(const AttentionCase& c, std::initializer_list<int64_t> rows,
                                     const std::string& what = "") {
  for (int64_t row : rows) {
    TensorView q_rows = c.q.view;
    q_rows.data = static_cast<float*>(c.q.view.data) + row * c.q.view.strides[1];
    q_rows.shape[1] = 1;
    TensorView out_rows = c.out.view;
    out_rows.data = static_cast<float*>(c.out.view.data) + row * c.out.view.strides[1];
    out_rows.shape[1] = 1;
    const Verification check =
        verify_forward(q_rows, c.k.view, c.v.view, out_rows, c.lse.data() + row, Options{});
    EXPECT_TRUE(check.pass()) << what << "row " << row << ": " << check.out_error << " > "
                              << check.out_bound;
  }
}

}  // namespace flashtile::testing
