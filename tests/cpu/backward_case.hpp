// The backward case of the suites (src/testing/backward_case.hpp) and its verdict as one
// assertion, errors and bounds in the failure message.
#pragma once

#include <gtest/gtest.h>

#include "testing/backward_case.hpp"

namespace flashtile::testing {

inline ::testing::AssertionResult gradients_match(const BackwardCase& c) {
  const GradientVerification v = c.verify();
  if (v.pass()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << c.fwd.shape.describe() << ": dq err " << v.dq_error << " (bound " << v.dq_bound
         << "), dk err " << v.dk_error << " (bound " << v.dk_bound << "), dv err " << v.dv_error
         << " (bound " << v.dv_bound << "), dsinks err " << v.dsinks_error << " (bound "
         << v.dsinks_bound << ")";
}

}  // namespace flashtile::testing
