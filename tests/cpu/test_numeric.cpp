// Host conversions to the 16-bit storage types round to nearest even, as CUDA does.
#include <gtest/gtest.h>

#include <cmath>

#include "common/numeric.hpp"

namespace flashtile::detail {
namespace {

TEST(Numeric, F16RoundTripsExactValues) {
  for (float x : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f})
    EXPECT_EQ(f16_to_float(float_to_f16(x)), x) << x;
}

TEST(Numeric, F16RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1.0).
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  // 1 + 3·2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9: goes to 1 + 2^-9.
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11))),
            1.0f + std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isinf(f16_to_float(float_to_f16(70000.0f))));
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(NAN))));
}

TEST(Numeric, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);  // tie -> even
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))),
            1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(Numeric, AllOnesBytesAreNaNInEveryDtype) {
  EXPECT_TRUE(std::isnan(f16_to_float(0xFFFF)));
  EXPECT_TRUE(std::isnan(bf16_to_float(0xFFFF)));
  EXPECT_TRUE(std::isnan(bits_to_float(0xFFFFFFFFu)));
}

}  // namespace
}  // namespace flashtile::detail
