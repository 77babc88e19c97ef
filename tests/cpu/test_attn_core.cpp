// The shared pieces of src/attn/ on their own: the mask against the visibility rule written
// out, the key-block ranges against brute force, and the softmax-state merge and sink
// against three-pass softmax in double precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/block_range.hpp"
#include "attn/mask.hpp"
#include "attn/softmax_state.hpp"
#include "attn/variant.hpp"

namespace flashtile::detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The rule of docs/VARIANTS.md, written independently of Mask.
bool rule_visible(int64_t i, int64_t j, int64_t sq, int64_t sk, int64_t left, int64_t right) {
  const int64_t d = j - (i + sk - sq);
  return j >= 0 && j < sk && (left < 0 || d >= -left) && (right < 0 || d <= right);
}

struct RandomMask {
  int64_t sq, sk, left, right;
};

std::vector<RandomMask> random_masks(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<RandomMask> masks;
  for (int t = 0; t < n; ++t) {
    const int64_t sq = pick(1, 60), sk = pick(1, 60);
    // -1 (unbounded) a third of the time, else a width that may exceed the lengths.
    const int64_t left = pick(0, 2) == 0 ? -1 : pick(0, 70);
    const int64_t right = pick(0, 2) == 0 ? -1 : pick(0, 70);
    masks.push_back({sq, sk, left, right});
  }
  return masks;
}

TEST(Mask, MatchesTheVisibilityRule) {
  for (const RandomMask& r : random_masks(400, 11)) {
    const Mask<int64_t> mask(r.left, r.right, r.sq, r.sk);
    for (int64_t i = 0; i < r.sq; ++i) {
      int64_t count = 0;
      for (int64_t j = 0; j < r.sk; ++j) {
        const bool expected = rule_visible(i, j, r.sq, r.sk, r.left, r.right);
        ASSERT_EQ(mask.visible(i, j), expected)
            << "sq " << r.sq << " sk " << r.sk << " window (" << r.left << ", " << r.right
            << ") i " << i << " j " << j;
        count += expected;
      }
      EXPECT_EQ(mask.visible_keys(i), count);
    }
  }
}

TEST(Mask, CausalIsRightZeroBottomRight) {
  const Mask<int> mask(-1, 0, 3, 5);  // sq 3, sk 5: row 0 sees keys 0..2
  EXPECT_EQ(mask.key_end(0), 3);
  EXPECT_EQ(mask.key_end(2), 5);
  const Mask<int> more_queries(-1, 0, 5, 3);  // rows 0 and 1 see nothing
  EXPECT_EQ(more_queries.visible_keys(0), 0);
  EXPECT_EQ(more_queries.visible_keys(1), 0);
  EXPECT_EQ(more_queries.visible_keys(2), 1);
}

TEST(Mask, AlibiDistanceIsFromTheDiagonal) {
  const Mask<int> mask(-1, -1, 4, 6);  // offset 2
  EXPECT_EQ(mask.diagonal(0), 2);
  EXPECT_EQ(mask.diagonal(3), 5);
  LogitsTransform<double> logits;
  logits.slope = 1.0;  // the bias is then minus the distance |i + sk - sq - j|
  EXPECT_EQ(logits.alibi_bias(mask, 0, 2), 0.0);
  EXPECT_EQ(logits.alibi_bias(mask, 0, 5), -3.0);
  EXPECT_EQ(logits.alibi_bias(mask, 3, 0), -5.0);
}

TEST(KeyBlocks, CoverWhatRowsSeeAndMarkWholeBlocksExactly) {
  std::mt19937 rng(5);
  for (const RandomMask& r : random_masks(300, 23)) {
    const Mask<int64_t> mask(r.left, r.right, r.sq, r.sk);
    const int64_t block_m = std::uniform_int_distribution<int64_t>(1, 17)(rng);
    const int64_t block_n = std::uniform_int_distribution<int64_t>(1, 17)(rng);
    for (int64_t r0 = 0; r0 < r.sq; r0 += block_m) {
      const int64_t r1 = std::min(r0 + block_m, r.sq);
      const KeyBlocks<int64_t> blocks = key_blocks(mask, r0, r1, block_n);
      const int64_t n_blocks = (r.sk + block_n - 1) / block_n;
      bool any_at_all = false;
      for (int64_t n = 0; n < n_blocks; ++n) {
        bool any = false, all = true;
        for (int64_t i = r0; i < r1; ++i)
          for (int64_t j = n * block_n; j < (n + 1) * block_n; ++j) {
            const bool seen = rule_visible(i, j, r.sq, r.sk, r.left, r.right);
            any |= seen;
            all &= seen;
          }
        any_at_all |= any;
        const std::string where = "sq " + std::to_string(r.sq) + " sk " + std::to_string(r.sk) +
                                  " window (" + std::to_string(r.left) + ", " +
                                  std::to_string(r.right) + ") rows [" + std::to_string(r0) +
                                  ", " + std::to_string(r1) + ") block " + std::to_string(n) +
                                  " of " + std::to_string(block_n);
        if (any) {
          EXPECT_TRUE(n >= blocks.begin && n < blocks.end) << where << ": visible block skipped";
        }
        const bool in_range = n >= blocks.begin && n < blocks.end;
        if (in_range) {
          EXPECT_EQ(!blocks.needs_mask(n), all) << where << ": whole-block flag";
          // Tight: the backward's ordered dQ adds wait for every block of the range.
          EXPECT_TRUE(any) << where << ": a block in the range sees nothing";
        }
      }
      EXPECT_EQ(blocks.empty(), !any_at_all) << "rows [" << r0 << ", " << r1 << ")";
    }
  }
}

TEST(Mask, FirstQueryAndQueryEndInvertTheRule) {
  for (const RandomMask& r : random_masks(400, 23)) {
    const Mask<int64_t> mask(r.left, r.right, r.sq, r.sk);
    EXPECT_EQ(mask.seqlen_q(), r.sq);
    for (int64_t j = 0; j < r.sk; ++j) {
      int64_t first = -1, end = -1;  // the visible rows, which the rule makes contiguous
      for (int64_t i = 0; i < r.sq; ++i)
        if (rule_visible(i, j, r.sq, r.sk, r.left, r.right)) {
          if (first < 0) first = i;
          end = i + 1;
        }
      const std::string where = "sq " + std::to_string(r.sq) + " sk " + std::to_string(r.sk) +
                                " window (" + std::to_string(r.left) + ", " +
                                std::to_string(r.right) + ") key " + std::to_string(j);
      if (first < 0) {
        EXPECT_GE(mask.first_query(j), mask.query_end(j)) << where << ": no row sees it";
      } else {
        EXPECT_EQ(mask.first_query(j), first) << where;
        EXPECT_EQ(mask.query_end(j), end) << where;
      }
    }
  }
}

TEST(QueryBlocks, CoverTheRowsThatSeeAKeyRangeAndMarkWholeBlocksExactly) {
  std::mt19937 rng(29);
  for (const RandomMask& r : random_masks(300, 31)) {
    const Mask<int64_t> mask(r.left, r.right, r.sq, r.sk);
    const int64_t block_n = std::uniform_int_distribution<int64_t>(1, 17)(rng);
    const int64_t block_m = std::uniform_int_distribution<int64_t>(1, 17)(rng);
    for (int64_t k0 = 0; k0 < r.sk; k0 += block_n) {
      const int64_t k1 = std::min(k0 + block_n, r.sk);
      const QueryBlocks<int64_t> blocks = query_blocks(mask, k0, k1, block_m);
      const int64_t m_blocks = (r.sq + block_m - 1) / block_m;
      bool any_at_all = false;
      for (int64_t m = 0; m < m_blocks; ++m) {
        bool any = false, all = true;
        // Rows past seqlen_q (a partial last block) see nothing.
        for (int64_t i = m * block_m; i < (m + 1) * block_m; ++i)
          for (int64_t j = k0; j < k1; ++j) {
            const bool seen = i < r.sq && rule_visible(i, j, r.sq, r.sk, r.left, r.right);
            any |= seen;
            all &= seen;
          }
        any_at_all |= any;
        const std::string where = "sq " + std::to_string(r.sq) + " sk " + std::to_string(r.sk) +
                                  " window (" + std::to_string(r.left) + ", " +
                                  std::to_string(r.right) + ") keys [" + std::to_string(k0) +
                                  ", " + std::to_string(k1) + ") block " + std::to_string(m) +
                                  " of " + std::to_string(block_m);
        const bool in_range = m >= blocks.begin && m < blocks.end;
        if (any) EXPECT_TRUE(in_range) << where << ": a block that sees a key is skipped";
        if (in_range) {
          EXPECT_EQ(!blocks.needs_mask(m), all) << where << ": whole-block flag";
          EXPECT_TRUE(any) << where << ": a block in the range sees no key";
        }
      }
      EXPECT_EQ(blocks.empty(), !any_at_all) << "keys [" << k0 << ", " << k1 << ")";
      if (!blocks.empty()) {
        EXPECT_GE(blocks.begin, 0);
        EXPECT_LE(blocks.end, m_blocks);
      }
    }
  }
}

TEST(QueryBlocks, CausalKeyBlockVisitsOnlyTheRowsBelowTheDiagonal) {
  // 4096 x 4096 causal, keys [1024, 1088), 64-row blocks: rows 1024.. see them, the block
  // holding the diagonal (16) needs the mask, every block after it is whole.
  const Mask<int> mask(-1, 0, 4096, 4096);
  const QueryBlocks<int> blocks = query_blocks(mask, 1024, 1088, 64);
  EXPECT_EQ(blocks.begin, 16);
  EXPECT_EQ(blocks.end, 64);
  EXPECT_TRUE(blocks.needs_mask(16));
  EXPECT_FALSE(blocks.needs_mask(17));
  EXPECT_FALSE(blocks.needs_mask(63));
}

TEST(KeyBlocks, SlidingWindowVisitsOnlyTheWindow) {
  // 16k keys, window (1024, 0), 128-row query blocks of 64-key tiles: each block visits
  // about (1024 + 128) / 64 tiles, not the ~128 a causal block near the end visits.
  const Mask<int> mask(1024, 0, 16384, 16384);
  const KeyBlocks<int> blocks = key_blocks(mask, 8192, 8192 + 128, 64);
  EXPECT_EQ(blocks.begin, (8192 - 1024) / 64);
  EXPECT_EQ(blocks.end, (8192 + 128) / 64);
  EXPECT_LE(blocks.count(), 19);
  // Edges are masked: the first (window's left edge) and the last two (the diagonal).
  EXPECT_TRUE(blocks.needs_mask(blocks.begin));
  EXPECT_FALSE(blocks.needs_mask(blocks.begin + 2));
  EXPECT_TRUE(blocks.needs_mask(blocks.end - 1));
}

// --- softmax state -------------------------------------------------------------------

struct Folded {
  SoftmaxState<double> state;
  double acc = 0;
};

Folded fold(const std::vector<double>& s, const std::vector<double>& v, size_t from, size_t to) {
  Folded f;
  for (size_t j = from; j < to; ++j) {
    std::vector<double> one = {s[j]};
    f.acc *= online_softmax_block(f.state, one.data(), 1);
    f.acc += one[0] * v[j];
  }
  return f;
}

TEST(SoftmaxState, MergeOfTwoRangesEqualsOneFold) {
  std::mt19937 rng(3);
  std::normal_distribution<double> dist(0.0, 3.0);
  for (int n : {2, 5, 40}) {
    std::vector<double> s(n), v(n);
    for (int j = 0; j < n; ++j) s[j] = dist(rng), v[j] = dist(rng);
    const Folded whole = fold(s, v, 0, n);
    for (int split = 0; split <= n; ++split) {
      Folded a = fold(s, v, 0, split);
      const Folded b = fold(s, v, split, n);
      const MergeFactors<double> f = merge_states(a.state, b.state);
      const double acc = a.acc * f.self + b.acc * f.other;
      EXPECT_NEAR(acc * output_scale(a.state), whole.acc * output_scale(whole.state), 1e-12);
      EXPECT_NEAR(log_sum_exp(a.state), log_sum_exp(whole.state), 1e-12);
    }
  }
}

TEST(SoftmaxState, MergeWithEmptyChangesNothing) {
  SoftmaxState<double> state{1.5, 2.0};
  const MergeFactors<double> f = merge_states(state, SoftmaxState<double>{});
  EXPECT_EQ(f.self, 1.0);
  EXPECT_EQ(f.other, 0.0);
  EXPECT_EQ(state.m, 1.5);
  EXPECT_EQ(state.l, 2.0);
  SoftmaxState<double> empty;
  merge_states(empty, SoftmaxState<double>{});
  EXPECT_EQ(output_scale(empty), 0.0);
  EXPECT_EQ(log_sum_exp(empty), -kInf);
}

TEST(SoftmaxState, LseStateMergesLikeTheScores) {
  // A finished partial (normalised output o, lse) merges as its scores would.
  std::vector<double> s = {0.3, -1.2, 2.5, 0.7}, v = {1.0, -2.0, 0.5, 3.0};
  const Folded whole = fold(s, v, 0, 4), a = fold(s, v, 0, 2), b = fold(s, v, 2, 4);
  SoftmaxState<double> merged = state_from_lse(log_sum_exp(a.state));
  const MergeFactors<double> f = merge_states(merged, state_from_lse(log_sum_exp(b.state)));
  const double out = (a.acc * output_scale(a.state) * f.self +
                      b.acc * output_scale(b.state) * f.other) * output_scale(merged);
  EXPECT_NEAR(out, whole.acc * output_scale(whole.state), 1e-12);
  EXPECT_NEAR(log_sum_exp(merged), log_sum_exp(whole.state), 1e-12);
}

TEST(SoftmaxState, SinkJoinsTheDenominatorWithNoValue) {
  std::vector<double> s = {0.5, 1.5, -0.25}, v = {2.0, -1.0, 4.0};
  const double sink = 1.25;
  Folded f = fold(s, v, 0, 3);
  f.acc *= add_sink(f.state, sink);
  double denominator = std::exp(sink), numerator = 0;
  for (int j = 0; j < 3; ++j) denominator += std::exp(s[j]), numerator += std::exp(s[j]) * v[j];
  EXPECT_NEAR(f.acc * output_scale(f.state), numerator / denominator, 1e-12);
  EXPECT_NEAR(log_sum_exp(f.state), std::log(denominator), 1e-12);
}

TEST(SoftmaxState, SinkOnAnEmptyRowGivesZeroAndTheSinkAsLse) {
  SoftmaxState<double> state;
  double acc = 0;
  acc *= add_sink(state, -0.5);
  EXPECT_EQ(acc * output_scale(state), 0.0);
  EXPECT_DOUBLE_EQ(log_sum_exp(state), -0.5);
  SoftmaxState<double> no_sink;
  add_sink(no_sink, -kInf);  // "no sink" changes nothing
  EXPECT_EQ(log_sum_exp(no_sink), -kInf);
}

TEST(SoftmaxState, NanScoreMakesTheRowNanNotMasked) {
  std::vector<double> s = {0.5, std::nan(""), 1.0}, v = {1.0, 1.0, 1.0};
  const Folded f = fold(s, v, 0, 3);
  EXPECT_TRUE(std::isnan(f.acc * output_scale(f.state)));
  EXPECT_TRUE(std::isnan(log_sum_exp(f.state)));
}

}  // namespace
}  // namespace flashtile::detail
