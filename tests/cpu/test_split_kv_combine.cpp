// The GPU combine's weighing (combine_partials_unrolled, src/attn/split_kv.hpp, compiled here
// for the host) against cpu_flash's combine_partials and against the weights worked out in
// double: random partial LSEs, empty partials, sinks, and the non-finite cases of
// docs/VARIANTS.md, where both must give the same class of value (NaN, ±inf, 0) exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "attn/split_kv.hpp"

namespace flashtile::detail {
namespace {

constexpr int kMax = 16;  // the GPU combine's bound (kMaxSplits in src/cuda/split_kv_combine.cuh)
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Combined {
  float lse;
  std::vector<float> weight;
};

Combined serial(const std::vector<float>& lse, float sink, bool sees_keys) {
  Combined c{0, std::vector<float>(lse.size())};
  c.lse = combine_partials(lse.data(), int(lse.size()), sink, sees_keys, c.weight.data());
  return c;
}

// The unrolled form, with garbage (NaN) past `splits` that it must ignore.
Combined unrolled(const std::vector<float>& lse, float sink, bool sees_keys) {
  float in[kMax], weight[kMax];
  std::fill(in, in + kMax, kNaN);
  std::copy(lse.begin(), lse.end(), in);
  Combined c{0, {}};
  c.lse = combine_partials_unrolled(in, int(lse.size()), sink, sees_keys, weight);
  for (int s = int(lse.size()); s < kMax; ++s) EXPECT_EQ(weight[s], 0.0f) << "padding weight " << s;
  c.weight.assign(weight, weight + lse.size());
  return c;
}

// NaN, +inf, -inf, 0 or finite non-zero: what the non-finite rule decides exactly.
int value_class(float x) {
  if (std::isnan(x)) return 0;
  if (x == kInf) return 1;
  if (x == -kInf) return 2;
  if (x == 0.0f) return 3;
  return 4;
}

void expect_same_classes(const Combined& a, const Combined& b, const char* what) {
  EXPECT_EQ(value_class(a.lse), value_class(b.lse)) << what << ": lse " << a.lse << " vs " << b.lse;
  for (size_t s = 0; s < a.weight.size(); ++s)
    EXPECT_EQ(value_class(a.weight[s]), value_class(b.weight[s]))
        << what << ": weight " << s << " " << a.weight[s] << " vs " << b.weight[s];
}

TEST(SplitKvCombine, UnrolledMatchesCombinePartialsAndDoubleOnRandomPartials) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> lse_value(-40.0f, 40.0f);
  std::uniform_int_distribution<int> pick(0, 5);
  double worst_vs_serial = 0, worst_vs_double = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const int splits = 1 + trial % kMax;
    std::vector<float> lse(splits);
    for (float& x : lse) x = pick(rng) == 0 ? -kInf : lse_value(rng);  // some splits empty
    const float sink = pick(rng) < 2 ? lse_value(rng) : -kInf;
    const Combined a = unrolled(lse, sink, /*sees_keys=*/true), b = serial(lse, sink, true);
    expect_same_classes(a, b, "random");
    // The truth in double: LSE = log(Σ exp(lse_s) + exp(sink)), weight_s = exp(lse_s - LSE).
    double top = sink;
    for (float x : lse) top = std::max<double>(top, x);
    double sum = std::exp(double(sink) - top);
    for (float x : lse) sum += std::exp(double(x) - top);
    const bool empty = top == -std::numeric_limits<double>::infinity();
    if (empty) {
      // Every split empty, no sink, keys seen: the NaN rule; checked by the classes above.
      EXPECT_TRUE(std::isnan(a.lse));
      continue;
    }
    const double lse_true = top + std::log(sum);
    auto rel = [](double x, double ref) { return std::fabs(x - ref) / std::max(1.0, std::fabs(ref)); };
    worst_vs_serial = std::max(worst_vs_serial, rel(a.lse, b.lse));
    worst_vs_double = std::max(worst_vs_double, rel(a.lse, lse_true));
    for (int s = 0; s < splits; ++s) {
      const double w_true = std::exp(double(lse[s]) - lse_true);
      worst_vs_serial = std::max(worst_vs_serial, std::fabs(double(a.weight[s]) - b.weight[s]));
      worst_vs_double = std::max(worst_vs_double, std::fabs(double(a.weight[s]) - w_true));
    }
  }
  // fp32 rounding of a 16-term sum and a few exps and products: a few ulp (6e-8 each).
  EXPECT_LT(worst_vs_serial, 5e-7);
  EXPECT_LT(worst_vs_double, 5e-7);
  char worst[96];
  std::snprintf(worst, sizeof worst, "%.3g vs combine_partials, %.3g vs double", worst_vs_serial,
                worst_vs_double);
  RecordProperty("worst_difference", worst);
}

TEST(SplitKvCombine, OneSplitWithoutSinkIsExact) {
  for (float x : {-3.5f, 0.0f, 17.25f}) {
    const Combined a = unrolled({x}, -kInf, true);
    EXPECT_EQ(a.lse, x);
    EXPECT_EQ(a.weight[0], 1.0f);
  }
}

TEST(SplitKvCombine, NonFiniteRowsFollowTheRuleAsCombinePartialsDoes) {
  struct Case {
    const char* what;
    std::vector<float> lse;
    float sink;
    bool sees_keys;
    int lse_class;  // value_class of the row's LSE
  };
  const Case cases[] = {
      {"masked row", {-kInf, -kInf, -kInf}, -kInf, false, 2},
      {"masked row with a sink", {-kInf, -kInf}, 1.5f, false, 4},
      {"keys seen, every score -inf", {-kInf, -kInf, -kInf, -kInf}, -kInf, true, 0},
      {"keys seen, every score -inf, a sink", {-kInf, -kInf}, 0.5f, true, 0},
      {"a NaN partial", {1.0f, kNaN, 2.0f}, -kInf, true, 0},
      {"a NaN partial first", {kNaN, 1.0f}, 0.25f, true, 0},
      {"every partial NaN", {kNaN, kNaN}, -kInf, true, 0},
      {"a +inf partial", {3.0f, kInf}, -kInf, true, 0},
      {"a NaN sink", {1.0f, 2.0f}, kNaN, true, 0},
      {"some splits empty", {-kInf, 2.0f, -kInf, 1.0f}, -kInf, true, 4},
  };
  for (const Case& c : cases) {
    const Combined a = unrolled(c.lse, c.sink, c.sees_keys), b = serial(c.lse, c.sink, c.sees_keys);
    expect_same_classes(a, b, c.what);
    EXPECT_EQ(value_class(a.lse), c.lse_class) << c.what << ": lse " << a.lse;
    if (c.lse_class == 4) EXPECT_NEAR(a.lse, b.lse, 1e-6f * std::max(1.0f, std::fabs(b.lse))) << c.what;
  }
  // The masked row with a sink: weights 0, LSE the sink.
  const Combined sink_only = unrolled({-kInf, -kInf}, 1.5f, false);
  EXPECT_EQ(sink_only.lse, 1.5f);
  EXPECT_EQ(sink_only.weight[0], 0.0f);
}

}  // namespace
}  // namespace flashtile::detail
