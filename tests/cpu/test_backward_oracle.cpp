// The backward oracle against central finite differences of the forward oracle, for every
// variant: the test that makes reference_attention_backward trustworthy. L = Σ out∘dout
// (+ Σ lse∘dlse with a gradient into the LSE), so ∂L/∂x is what
// reference_attention_backward returns for x in q, k, v and the sinks. Both
// oracles are double throughout; the inputs are fp32, so each step is taken as the fp32
// value x ± h actually holds (the difference quotient uses the exact step).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "backward_case.hpp"
#include "support/backend_grid.hpp"
#include "support/variants.hpp"
#include "common/numeric.hpp"
#include "flashtile/reference.hpp"
#include "testing/attention_case.hpp"

namespace flashtile {
namespace {

using testing::AttentionCase;
using testing::HostTensor;
using testing::Shape;
using testing::shape_of;
using testing::Variant;
using testing::with_variant;

const Variant kVariants[] = {
    {"full", {}},
    {"causal", {}, true},
    {"window (2, 1)", {2, 1}},
    {"window (1, -1) + causal", {1, -1}, true},
    {"softcap 0.5", {}, false, 0.5f},
    {"softcap 2 + causal", {}, true, 2.0f},
    {"alibi (heads)", {}, false, 0.0f, true},
    {"alibi (batch, heads) + causal", {}, true, 0.0f, true, true},
    {"sinks", {}, false, 0.0f, false, false, true},
    {"sinks + window (0, 0)", {0, 0}, false, 0.0f, false, false, true},
    {"all", {3, 2}, false, 1.0f, true, true, true},
};

// Σ out∘dout (+ Σ lse∘dlse when dlse is not empty) of the forward oracle (dout contiguous,
// q's shape; dlse the LSE's). Rows that see nothing (lse -inf, whatever the inputs) are a
// constant and left out.
double loss(const AttentionCase& c, const HostTensor& dout, const std::vector<float>& dlse) {
  const ReferenceResult r = c.reference();
  double sum = 0;
  for (size_t n = 0; n < r.out.size(); ++n)
    sum += r.out[n] * detail::load_as_float(dout.view.data, DType::f32, int64_t(n));
  for (size_t n = 0; n < dlse.size(); ++n)
    if (std::isfinite(r.lse[n])) sum += r.lse[n] * dlse[n];
  return sum;
}

// The central difference of loss at fp32 element *x.
double difference_quotient(float* x, const std::function<double()>& f) {
  constexpr double kStep = 1e-3;
  const float saved = *x;
  *x = static_cast<float>(saved + kStep);
  const double up = *x - double(saved), f_up = f();
  *x = static_cast<float>(saved - kStep);
  const double down = double(saved) - *x, f_down = f();
  *x = saved;
  return (f_up - f_down) / (up + down);
}

// max |fd - analytic| over the elements of one tensor, relative to its largest gradient.
void expect_matches_fd(const char* what, const std::string& name, float* data, size_t n,
                       const std::vector<double>& analytic, const std::function<double()>& f) {
  ASSERT_EQ(analytic.size(), n) << name << " " << what;
  double max_err = 0, max_grad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double fd = difference_quotient(data + i, f);
    max_err = std::max(max_err, std::fabs(fd - analytic[i]));
    max_grad = std::max(max_grad, std::fabs(analytic[i]));
  }
  // The step's truncation error is O(h²·f''') ~ 1e-6 here; a wrong formula is off by O(1).
  EXPECT_LE(max_err, 1e-5 * std::max(1.0, max_grad)) << name << ": " << what << " (max |grad| "
                                                      << max_grad << ")";
  EXPECT_GT(max_grad, 0.0) << name << ": " << what << " is all zeros";
}

void check_case(const Shape& shape, const std::string& name, bool lse_gradient = false) {
  AttentionCase c(shape, 77);
  HostTensor dout(DType::f32, c.shape.q_shape(), false);
  std::mt19937 rng(5);
  dout.fill_random(rng);
  std::vector<float> dlse;
  if (lse_gradient) {
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    dlse.resize(c.lse.size());
    for (float& g : dlse) g = uniform(rng);
  }
  const std::optional<Varlen> vl = c.varlen();
  Options o = c.reference_options();
  o.dlse = dlse.empty() ? nullptr : dlse.data();
  const ReferenceGradients g =
      vl ? reference_attention_backward_varlen(c.q.view, c.k.view, c.v.view, dout.view, *vl, o)
         : reference_attention_backward(c.q.view, c.k.view, c.v.view, dout.view, o);
  auto f = [&] { return loss(c, dout, dlse); };
  auto floats = [](HostTensor& t) { return reinterpret_cast<float*>(t.bytes.data()); };
  auto count = [](const HostTensor& t) { return t.bytes.size() / sizeof(float); };
  expect_matches_fd("dq", name, floats(c.q), count(c.q), g.dq, f);
  expect_matches_fd("dk", name, floats(c.k), count(c.k), g.dk, f);
  expect_matches_fd("dv", name, floats(c.v), count(c.v), g.dv, f);
  if (shape.sinks) expect_matches_fd("dsinks", name, c.sinks.data(), c.sinks.size(), g.dsinks, f);
  else EXPECT_TRUE(g.dsinks.empty());
}

TEST(BackwardOracle, MatchesFiniteDifferencesForEveryVariant) {
  // GQA (2 query heads per kv head), sq != sk both ways, batch 2 (per-batch ALiBi).
  for (auto [sq, sk] : {std::pair{5, 7}, std::pair{6, 3}})
    for (const Variant& v : kVariants) {
      Shape s;
      s.batch = 2;
      s.seqlen_q = sq;
      s.seqlen_k = sk;
      s.heads_q = 4;
      s.heads_kv = 2;
      s.head_dim = 3;
      check_case(with_variant(s, v), std::string(v.name) + " sq" + std::to_string(sq) + " sk" +
                                         std::to_string(sk));
    }
}

// A packed batch with empty and length-1 sequences and seqused_k leaving keys unused (their
// gradient is 0).
Shape small_packed_batch() {
  Shape s;
  s.heads_q = 2;
  s.heads_kv = 1;
  s.head_dim = 3;
  s.varlen_q = {3, 0, 1, 4};
  s.varlen_k = {4, 2, 1, 5};
  s.seqused_k = {4, 2, 0, 3};
  return s;
}

TEST(BackwardOracle, MatchesFiniteDifferencesOnVarlen) {
  for (const Variant& v : kVariants)
    check_case(with_variant(small_packed_batch(), v), std::string("varlen ") + v.name);
}

TEST(BackwardOracle, MatchesFiniteDifferencesWithAGradientIntoTheLse) {
  // The loss uses the LSE too (∂lse/∂s = P): every variant, dense with GQA and sq != sk,
  // and varlen with empty sequences and a row that sees no key (no NaN from it).
  for (const Variant& v : kVariants) {
    check_case(with_variant(shape_of(DType::f32, 2, 6, 4, 4, 2, 3), v),
               std::string("dlse ") + v.name, /*lse_gradient=*/true);
    check_case(with_variant(small_packed_batch(), v), std::string("dlse varlen ") + v.name,
               /*lse_gradient=*/true);
  }
}

TEST(BackwardOracle, LowPrecisionBaselineIsCloseButNotExact) {
  // The 16-bit baseline differs from the oracle by about its dtype's rounding: what the
  // rule's bound is made of. Zero would mean it is not rounding; large, that it is wrong.
  for (DType dtype : {DType::f16, DType::bf16}) {
    Shape s;
    s.seqlen_q = 33;
    s.seqlen_k = 41;
    s.heads_q = 2;
    s.head_dim = 16;
    s.dtype = dtype;
    s.softcap = 2.0f;
    s.sinks = true;
    testing::BackwardCase c(s);
    const Options o = c.fwd.reference_options();
    const ReferenceGradients exact =
        reference_attention_backward(c.fwd.q.view, c.fwd.k.view, c.fwd.v.view, c.dout.view, o);
    const ReferenceGradients low = reference_attention_backward(
        c.fwd.q.view, c.fwd.k.view, c.fwd.v.view, c.dout.view, o, ReferencePrecision::lowprec);
    const double unit = dtype == DType::f16 ? 1.0 / 1024 : 1.0 / 128;
    for (auto [ref, lp] : {std::pair{&exact.dq, &low.dq}, std::pair{&exact.dk, &low.dk},
                           std::pair{&exact.dv, &low.dv}}) {
      double err = 0, mag = 0;
      for (size_t n = 0; n < ref->size(); ++n) {
        err = std::max(err, std::fabs((*ref)[n] - (*lp)[n]));
        mag = std::max(mag, std::fabs((*ref)[n]));
      }
      EXPECT_GT(err, 0.0) << dtype_name(dtype);
      EXPECT_LT(err, 8 * unit * std::max(1.0, mag)) << dtype_name(dtype);
    }
  }
}

TEST(BackwardOracle, CpuReferenceBackendWritesTheOracle) {
  Shape s;
  s.batch = 2;
  s.seqlen_q = 9;
  s.seqlen_k = 13;
  s.heads_q = 3;
  s.heads_kv = 1;
  s.head_dim = 8;
  s.strided = true;
  s.sinks = true;
  s.causal = true;
  testing::BackwardCase c(s);
  c.run(Backend::cpu_reference);
  EXPECT_TRUE(testing::gradients_match(c));
}

}  // namespace
}  // namespace flashtile
