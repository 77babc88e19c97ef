// The oracle against docs/VARIANTS.md written out a second time, independently of the
// shared core: per (sequence, head, row), every logit by the formula, the visible keys by
// the rule, the sink in the denominator. Plus identities the semantics imply (window
// (-1, 0) is causal, slope 0 and an infinite cap change nothing, varlen is per-sequence
// dense attention).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "flashtile/reference.hpp"
#include "testing/attention_case.hpp"

namespace flashtile {
namespace {

using testing::AttentionCase;
using testing::Shape;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The spec, for a case with contiguous or strided host tensors.
ReferenceResult spec_attention(const AttentionCase& c, double scale) {
  const Shape& s = c.shape;
  const int64_t heads = s.heads_q, group = s.heads_q / s.heads_kv, d = s.head_dim;
  const int64_t n_seq = s.sequences();
  const int64_t rows = s.q_shape()[0] * s.q_shape()[1];
  ReferenceResult r{std::vector<double>(rows * heads * d), std::vector<double>(rows * heads)};
  auto at = [](const testing::HostTensor& t, int64_t b, int64_t row, int64_t h, int64_t c) {
    return double(detail::load_as_float(t.view.data, t.view.dtype, t.index(b, row, h, c)));
  };
  for (int64_t b = 0; b < n_seq; ++b) {
    // Where sequence b lives: batch entry b (dense), or packed rows of entry 0 (varlen).
    const int64_t entry = s.is_varlen() ? 0 : b;
    const int64_t q0 = s.is_varlen() ? c.cu_seqlens_q[b] : 0;
    const int64_t k0 = s.is_varlen() ? c.cu_seqlens_k[b] : 0;
    const int64_t sq = s.is_varlen() ? s.varlen_q[b] : s.seqlen_q;
    int64_t sk = s.is_varlen() ? s.varlen_k[b] : s.seqlen_k;
    if (!s.seqused_k.empty()) sk = s.seqused_k[b];
    const int64_t left = s.window.left, right = s.causal ? 0 : s.window.right;
    for (int64_t h = 0; h < heads; ++h) {
      const double slope =
          s.alibi ? c.alibi_slopes[(s.alibi_per_batch ? b * heads : 0) + h] : 0.0;
      const double sink = s.sinks ? c.sinks[h] : -kInf;
      for (int64_t i = 0; i < sq; ++i) {
        std::vector<double> logits;
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < sk; ++j) {
          const int64_t diagonal = j - (i + sk - sq);
          if ((left >= 0 && diagonal < -left) || (right >= 0 && diagonal > right)) continue;
          double dot = 0;
          for (int64_t ch = 0; ch < d; ++ch)
            dot += at(c.q, entry, q0 + i, h, ch) * at(c.k, entry, k0 + j, h / group, ch);
          double logit = scale * dot;
          if (s.softcap > 0) logit = s.softcap * std::tanh(logit / s.softcap);
          logit -= slope * std::fabs(double(i + sk - sq - j));
          logits.push_back(logit);
          keys.push_back(j);
        }
        const int64_t row = (s.is_varlen() ? 0 : b * s.seqlen_q) + q0 + i;
        double* out = &r.out[(row * heads + h) * d];
        const int64_t lse_at = (s.is_varlen() ? h * rows : (b * heads + h) * s.seqlen_q) + q0 + i;
        if (keys.empty() && !s.sinks) {
          r.lse[lse_at] = -kInf;
          continue;
        }
        double m = sink;
        for (double x : logits) m = std::max(m, x);
        double denominator = std::exp(sink - m);
        for (double x : logits) denominator += std::exp(x - m);
        for (size_t n = 0; n < keys.size(); ++n) {
          const double p = std::exp(logits[n] - m) / denominator;
          for (int64_t ch = 0; ch < d; ++ch) out[ch] += p * at(c.v, entry, k0 + keys[n], h / group, ch);
        }
        r.lse[lse_at] = m + std::log(denominator);
      }
    }
  }
  return r;
}

void expect_same(const ReferenceResult& got, const ReferenceResult& want, const Shape& s) {
  ASSERT_EQ(got.out.size(), want.out.size());
  ASSERT_EQ(got.lse.size(), want.lse.size());
  for (size_t i = 0; i < want.out.size(); ++i)
    ASSERT_NEAR(got.out[i], want.out[i], 1e-12) << s.describe() << " out[" << i << "]";
  for (size_t i = 0; i < want.lse.size(); ++i) {
    if (std::isinf(want.lse[i]))
      ASSERT_EQ(got.lse[i], want.lse[i]) << s.describe() << " lse[" << i << "]";
    else
      ASSERT_NEAR(got.lse[i], want.lse[i], 1e-12 * (1 + std::fabs(want.lse[i])))
          << s.describe() << " lse[" << i << "]";
  }
}

std::vector<Shape> variant_shapes() {
  std::vector<Shape> shapes;
  std::mt19937 rng(99);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int n = 0; n < 60; ++n) {
    Shape s;
    s.head_dim = pick(1, 3) * 8 - pick(0, 1) * 3;  // 5..24, odd ones included
    s.heads_kv = pick(1, 2);
    s.heads_q = s.heads_kv * pick(1, 3);
    s.strided = n % 3 == 0;
    if (n % 4 == 3) {
      const int sequences = pick(1, 4);
      for (int b = 0; b < sequences; ++b) {
        s.varlen_q.push_back(pick(0, 3) == 0 ? pick(0, 1) : pick(2, 30));  // empty, 1, longer
        s.varlen_k.push_back(pick(0, 3) == 0 ? pick(0, 1) : pick(2, 30));
      }
      if (pick(0, 1) == 0)
        for (int64_t len : s.varlen_k) s.seqused_k.push_back(pick(0, int(len)));
      if (s.total_q() == 0) s.varlen_q[0] = 3;  // the tensors need a row
      if (s.total_k() == 0) s.varlen_k[0] = 2;
      if (!s.seqused_k.empty()) s.seqused_k[0] = std::min<int64_t>(s.seqused_k[0], s.varlen_k[0]);
    } else {
      s.batch = pick(1, 2);
      s.seqlen_q = pick(1, 40);
      s.seqlen_k = pick(1, 40);
    }
    s.causal = pick(0, 2) == 0;
    if (pick(0, 1)) s.window = {pick(-1, 12), pick(-1, 12)};
    if (pick(0, 2) == 0) s.softcap = 0.3f + 0.2f * float(pick(0, 5));
    s.alibi = pick(0, 2) == 0;
    s.alibi_per_batch = s.alibi && pick(0, 1);
    s.sinks = pick(0, 2) == 0;
    shapes.push_back(s);
  }
  return shapes;
}

TEST(OracleVariants, MatchesTheSpecWrittenOut) {
  for (const Shape& s : variant_shapes()) {
    const AttentionCase c(s);
    for (std::optional<float> scale : {std::optional<float>{}, std::optional<float>{-0.7f}}) {
      const Options o = c.reference_options(scale);
      const std::optional<Varlen> vl = c.varlen();
      const ReferenceResult got = vl ? reference_attention_varlen(c.q.view, c.k.view, c.v.view, *vl, o)
                                     : reference_attention(c.q.view, c.k.view, c.v.view, o);
      // The default scale as the validator computes it, in float.
      const float used_scale = scale ? *scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
      expect_same(got, spec_attention(c, double(used_scale)), s);
    }
  }
}

TEST(OracleVariants, WindowLeftUnboundedRightZeroIsCausal) {
  Shape s;
  s.batch = 2, s.seqlen_q = 19, s.seqlen_k = 33, s.heads_q = 2, s.heads_kv = 1, s.head_dim = 16;
  AttentionCase c(s);
  Options causal, window;
  causal.causal = true;
  window.window = {-1, 0};
  const ReferenceResult a = reference_attention(c.q.view, c.k.view, c.v.view, causal);
  const ReferenceResult b = reference_attention(c.q.view, c.k.view, c.v.view, window);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
}

TEST(OracleVariants, NeutralSettingsChangeNothing) {
  Shape s;
  s.seqlen_q = 21, s.seqlen_k = 17, s.heads_q = 3, s.heads_kv = 3, s.head_dim = 8;
  AttentionCase c(s);
  const ReferenceResult plain = reference_attention(c.q.view, c.k.view, c.v.view, {});
  const std::vector<float> zero_slopes(3, 0.0f), no_sinks(3, -std::numeric_limits<float>::infinity());
  Options o;
  o.alibi_slopes = ParamView::vector(zero_slopes.data(), Device::cpu(), 3);
  o.sinks = ParamView::vector(no_sinks.data(), Device::cpu(), 3);
  o.window = {1000, 1000};  // wider than every sequence: normalised to unbounded
  const ReferenceResult neutral = reference_attention(c.q.view, c.k.view, c.v.view, o);
  expect_same(neutral, plain, s);
}

TEST(OracleVariants, VarlenIsDenseAttentionPerSequence) {
  Shape s;
  s.varlen_q = {5, 0, 1, 12};
  s.varlen_k = {7, 3, 0, 12};
  s.heads_q = 4, s.heads_kv = 2, s.head_dim = 8;
  s.causal = true;
  s.window = {4, -1};
  s.alibi = true;
  s.alibi_per_batch = true;
  AttentionCase c(s);
  const ReferenceResult packed = c.reference();
  for (size_t b = 0; b < s.varlen_q.size(); ++b) {
    if (s.varlen_q[b] == 0) continue;
    // Sequence b as its own dense batch of one: views into the packed rows.
    auto slice = [&](const testing::HostTensor& t, int64_t start, int64_t rows) {
      TensorView v = t.view;
      v.data = static_cast<unsigned char*>(t.view.data) + start * t.view.strides[1] * 4;
      v.shape[1] = rows;
      return v;
    };
    const int64_t q0 = c.cu_seqlens_q[b], k0 = c.cu_seqlens_k[b];
    if (s.varlen_k[b] == 0) {  // no keys: every row 0 with LSE -inf
      for (int64_t i = 0; i < s.varlen_q[b]; ++i)
        for (int64_t h = 0; h < s.heads_q; ++h)
          EXPECT_EQ(packed.lse[h * s.total_q() + q0 + i], -kInf);
      continue;
    }
    Options o = c.reference_options();
    o.alibi_slopes = ParamView::vector(c.alibi_slopes.data() + b * s.heads_q, Device::cpu(), s.heads_q);
    const ReferenceResult dense = reference_attention(
        slice(c.q, q0, s.varlen_q[b]), slice(c.k, k0, s.varlen_k[b]), slice(c.v, k0, s.varlen_k[b]), o);
    for (int64_t i = 0; i < s.varlen_q[b]; ++i)
      for (int64_t h = 0; h < s.heads_q; ++h) {
        for (int64_t ch = 0; ch < s.head_dim; ++ch)
          EXPECT_EQ(packed.out[((q0 + i) * s.heads_q + h) * s.head_dim + ch],
                    dense.out[(i * s.heads_q + h) * s.head_dim + ch]);
        EXPECT_EQ(packed.lse[h * s.total_q() + q0 + i], dense.lse[h * s.varlen_q[b] + i]);
      }
  }
}

}  // namespace
}  // namespace flashtile
