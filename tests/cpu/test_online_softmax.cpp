// The online-softmax update on its own: any split of the scores into blocks must give the
// same m, l, acc as the three-pass softmax, in exact arithmetic terms (double, tight bounds).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attn/softmax_state.hpp"

namespace flashtile::detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Folds scores (with values) through the online softmax in blocks of `block` and returns
// (output, lse).
std::pair<double, double> fold(const std::vector<double>& scores, const std::vector<double>& values,
                               int block) {
  SoftmaxState<double> state;
  double acc = 0;
  for (size_t start = 0; start < scores.size(); start += block) {
    std::vector<double> chunk(scores.begin() + start,
                              scores.begin() + std::min(scores.size(), start + block));
    const double alpha = online_softmax_block(state, chunk.data(), static_cast<int>(chunk.size()));
    acc *= alpha;
    for (size_t j = 0; j < chunk.size(); ++j) acc += chunk[j] * values[start + j];
  }
  return {acc * output_scale(state), log_sum_exp(state)};
}

std::pair<double, double> three_pass(const std::vector<double>& scores,
                                     const std::vector<double>& values) {
  double m = -kInf;
  for (double s : scores) m = std::max(m, s);
  double l = 0, acc = 0;
  for (size_t j = 0; j < scores.size(); ++j) {
    const double p = std::exp(scores[j] - m);
    l += p;
    acc += p * values[j];
  }
  return {acc / l, m + std::log(l)};
}

TEST(OnlineSoftmax, FirstBlockSetsMaxAndDenominator) {
  SoftmaxState<double> state;
  std::vector<double> s = {1.0, 3.0, 2.0};
  const double alpha = online_softmax_block(state, s.data(), 3);
  EXPECT_EQ(alpha, 0.0);  // exp(-inf - 3): the empty accumulator is discarded
  EXPECT_EQ(state.m, 3.0);
  EXPECT_DOUBLE_EQ(state.l, std::exp(-2.0) + 1.0 + std::exp(-1.0));
  EXPECT_DOUBLE_EQ(s[1], 1.0);  // the max maps to probability exp(0)
}

TEST(OnlineSoftmax, LargerMaxRescalesByExactFactor) {
  SoftmaxState<double> state{2.0, 5.0};
  std::vector<double> s = {4.0};
  const double alpha = online_softmax_block(state, s.data(), 1);
  EXPECT_DOUBLE_EQ(alpha, std::exp(-2.0));
  EXPECT_EQ(state.m, 4.0);
  EXPECT_DOUBLE_EQ(state.l, 5.0 * std::exp(-2.0) + 1.0);
}

TEST(OnlineSoftmax, SmallerMaxKeepsState) {
  SoftmaxState<double> state{2.0, 5.0};
  std::vector<double> s = {0.0, 2.0};
  const double alpha = online_softmax_block(state, s.data(), 2);
  EXPECT_EQ(alpha, 1.0);
  EXPECT_EQ(state.m, 2.0);
  EXPECT_DOUBLE_EQ(state.l, 5.0 + std::exp(-2.0) + 1.0);
}

TEST(OnlineSoftmax, AnyBlockingMatchesThreePass) {
  std::mt19937 rng(7);
  std::normal_distribution<double> dist(0.0, 4.0);
  for (int n : {1, 2, 7, 64, 129, 1000}) {
    std::vector<double> scores(n), values(n);
    for (int j = 0; j < n; ++j) {
      scores[j] = dist(rng);
      values[j] = dist(rng);
    }
    const auto expected = three_pass(scores, values);
    for (int block : {1, 3, 16, 64, 1024}) {
      const auto got = fold(scores, values, block);
      EXPECT_NEAR(got.first, expected.first, 1e-12 * (1 + std::fabs(expected.first)))
          << "n=" << n << " block=" << block;
      EXPECT_NEAR(got.second, expected.second, 1e-12 * (1 + std::fabs(expected.second)));
    }
  }
}

TEST(OnlineSoftmax, MaskedScoresContributeNothing) {
  std::vector<double> scores = {0.5, -kInf, 1.5, -kInf}, values = {2.0, 1e9, 4.0, 1e9};
  const auto got = fold(scores, values, 2);
  const auto expected = three_pass({0.5, 1.5}, {2.0, 4.0});
  EXPECT_DOUBLE_EQ(got.first, expected.first);
  EXPECT_DOUBLE_EQ(got.second, expected.second);
}

TEST(OnlineSoftmax, FullyMaskedRowGivesZeroAndMinusInfLse) {
  std::vector<double> scores(5, -kInf), values(5, 3.0);
  for (int block : {1, 2, 5}) {
    const auto got = fold(scores, values, block);
    EXPECT_EQ(got.first, 0.0);
    EXPECT_EQ(got.second, -kInf);
  }
}

TEST(OnlineSoftmax, MaskedBlockBeforeRealScoresIsHarmless) {
  std::vector<double> scores = {-kInf, -kInf, 1.0, 2.0}, values = {1e9, 1e9, 1.0, 3.0};
  const auto got = fold(scores, values, 2);
  const auto expected = three_pass({1.0, 2.0}, {1.0, 3.0});
  EXPECT_DOUBLE_EQ(got.first, expected.first);
  EXPECT_DOUBLE_EQ(got.second, expected.second);
}

TEST(OnlineSoftmax, HugeScoresDoNotOverflow) {
  std::vector<double> scores = {1000.0, 1001.0, 999.0}, values = {1.0, 2.0, 3.0};
  const auto got = fold(scores, values, 1);
  const auto expected = three_pass(scores, values);
  EXPECT_TRUE(std::isfinite(got.first));
  EXPECT_NEAR(got.first, expected.first, 1e-12);
  EXPECT_NEAR(got.second, expected.second, 1e-9);
}

TEST(OnlineSoftmax, FloatStateMatchesDouble) {
  std::vector<float> s = {0.25f, -1.0f, 3.5f};
  SoftmaxState<float> state;
  online_softmax_block(state, s.data(), 3);
  EXPECT_EQ(state.m, 3.5f);
  EXPECT_NEAR(state.l, std::exp(-3.25) + std::exp(-4.5) + 1.0, 1e-6);
}

}  // namespace
}  // namespace flashtile::detail
