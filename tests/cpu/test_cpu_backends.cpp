// Every CPU backend against the double-precision oracle over the shape grid, plus the
// semantics users rely on: bottom-right causal, fully masked rows, GQA mapping, scale.
#include <gtest/gtest.h>

#include <cmath>

#include "support/oracle_check.hpp"
#include "testing/attention_case.hpp"
#include "support/backend_grid.hpp"
#include "support/nonfinite_cases.hpp"

namespace flashtile {
namespace {

using testing::AttentionCase;
using testing::Shape;

std::vector<Backend> cpu_backends() {
  std::vector<Backend> out;
  for (Backend b : all_backends())
    if (backend_device(b) == DeviceType::cpu && backend_available(b)) out.push_back(b);
  return out;
}

// Runs `backend` on a fresh case and checks it against the oracle (and that every output
// element was written: outputs start as NaN).
void expect_matches_oracle(Backend backend, const Shape& shape) {
  AttentionCase c(shape);
  forward(c.q.view, c.k.view, c.v.view, c.out.view, c.options(backend));
  EXPECT_TRUE(testing::matches_oracle(c)) << backend_name(backend);
}

class CpuBackend : public ::testing::TestWithParam<Backend> {};

TEST_P(CpuBackend, MatchesOracleOnGridF32) {
  for (const Shape& s : testing::backend_grid({32, 64}, DType::f32, /*large=*/false))
    expect_matches_oracle(GetParam(), s);
}

TEST_P(CpuBackend, MatchesOracleOnLongSequences) {
  Shape s;
  s.seqlen_q = 1023;
  s.seqlen_k = 1025;
  s.head_dim = 64;
  s.heads_q = 2;
  s.heads_kv = 1;
  for (bool causal : {false, true}) {
    s.causal = causal;
    expect_matches_oracle(GetParam(), s);
  }
}

TEST_P(CpuBackend, HeadDimTails) {
  for (int64_t d : {8, 40, 72, 128}) {
    Shape s;
    s.seqlen_q = 33;
    s.seqlen_k = 65;
    s.head_dim = d;
    s.causal = d % 16 == 8;
    expect_matches_oracle(GetParam(), s);
  }
}

// The NaN/Inf rule (docs/VARIANTS.md): NaN where the oracle has NaN, in every dtype the
// backend serves; cases a backend refuses (variants on a journey step) are skipped.
TEST_P(CpuBackend, NonFiniteValuesFollowTheRule) {
  int ran = 0;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (const testing::NonFiniteCase& nf : testing::nonfinite_cases(dtype, /*variants=*/true)) {
      AttentionCase c(nf.shape);
      nf.plant(c);
      const Options o = c.options(GetParam());
      try {
        plan(c.q.view, c.k.view, c.v.view, c.out.view, o);
      } catch (const Error&) {
        continue;
      }
      forward(c.q.view, c.k.view, c.v.view, c.out.view, o);
      EXPECT_TRUE(testing::matches_nonfinite_oracle(c, testing::nonfinite_tolerance(dtype), nf.expect_nan,
                                                      nf.spreading_v_channel))
          << backend_name(GetParam()) << " " << dtype_name(dtype) << " " << nf.name;
      ++ran;
    }
  EXPECT_GE(ran, 6) << backend_name(GetParam());
}

INSTANTIATE_TEST_SUITE_P(All, CpuBackend, ::testing::ValuesIn(cpu_backends()),
                         [](const auto& info) { return std::string(backend_name(info.param)); });

TEST(Semantics, CausalIsBottomRightAligned) {
  // seqlen_q = 2, seqlen_k = 5: row 0 sees keys 0..3, row 1 sees keys 0..4.
  Shape s;
  s.seqlen_q = 2;
  s.seqlen_k = 5;
  s.head_dim = 8;
  s.causal = true;
  AttentionCase c(s);
  // Make key 4 dominate: if row 0 saw it, its output would be v[4].
  for (int64_t ch = 0; ch < 8; ++ch) {
    static_cast<float*>(c.k.view.data)[c.k.index(0, 4, 0, ch)] = 0.0f;
    static_cast<float*>(c.q.view.data)[c.q.index(0, 0, 0, ch)] = 1.0f;
    static_cast<float*>(c.q.view.data)[c.q.index(0, 1, 0, ch)] = 1.0f;
  }
  static_cast<float*>(c.k.view.data)[c.k.index(0, 4, 0, 0)] = 1000.0f;
  const ReferenceResult r = c.reference();
  const float v4 = static_cast<float*>(c.v.view.data)[c.v.index(0, 4, 0, 0)];
  EXPECT_NEAR(r.out[8 + 0], v4, 1e-9);      // row 1 sees key 4
  EXPECT_GT(std::fabs(r.out[0] - v4), 1e-6);  // row 0 does not
}

TEST(Semantics, FullyMaskedRowsGiveZeroAndMinusInf) {
  // seqlen_q > seqlen_k with causal: the first seqlen_q - seqlen_k rows see no key.
  for (Backend b : cpu_backends()) {
    Shape s;
    s.seqlen_q = 9;
    s.seqlen_k = 4;
    s.head_dim = 16;
    s.causal = true;
    AttentionCase c(s);
    forward(c.q.view, c.k.view, c.v.view, c.out.view, c.options(b));
    for (int64_t i = 0; i < 5; ++i) {
      EXPECT_EQ(c.lse[i], -std::numeric_limits<float>::infinity()) << backend_name(b);
      for (int64_t ch = 0; ch < 16; ++ch)
        EXPECT_EQ(static_cast<float*>(c.out.view.data)[c.out.index(0, i, 0, ch)], 0.0f)
            << backend_name(b);
    }
    EXPECT_TRUE(std::isfinite(c.lse[5]));
  }
}

TEST(Semantics, GqaHeadMapping) {
  // heads_q = 4 over heads_kv = 2: query heads 0,1 read kv head 0; 2,3 read kv head 1.
  Shape s;
  s.seqlen_q = 3;
  s.seqlen_k = 6;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim = 8;
  AttentionCase c(s);
  const ReferenceResult r = c.reference();
  // Query head 3 with kv head 1 must equal an MHA run of that head alone.
  Shape one = s;
  one.heads_q = one.heads_kv = 1;
  AttentionCase single(one);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t ch = 0; ch < 8; ++ch)
      static_cast<float*>(single.q.view.data)[single.q.index(0, i, 0, ch)] =
          static_cast<float*>(c.q.view.data)[c.q.index(0, i, 3, ch)];
  for (int64_t j = 0; j < 6; ++j)
    for (int64_t ch = 0; ch < 8; ++ch) {
      static_cast<float*>(single.k.view.data)[single.k.index(0, j, 0, ch)] =
          static_cast<float*>(c.k.view.data)[c.k.index(0, j, 1, ch)];
      static_cast<float*>(single.v.view.data)[single.v.index(0, j, 0, ch)] =
          static_cast<float*>(c.v.view.data)[c.v.index(0, j, 1, ch)];
    }
  const ReferenceResult rs = single.reference();
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t ch = 0; ch < 8; ++ch)
      EXPECT_DOUBLE_EQ(r.out[(i * 4 + 3) * 8 + ch], rs.out[i * 8 + ch]);
}

TEST(Semantics, DefaultScaleIsInverseSqrtHeadDim) {
  Shape s;
  s.seqlen_q = 4;
  s.seqlen_k = 9;
  s.head_dim = 64;
  AttentionCase c(s);
  Options explicit_scale;
  explicit_scale.scale = 0.125f;
  const ReferenceResult a = c.reference();
  const ReferenceResult b = reference_attention(c.q.view, c.k.view, c.v.view, explicit_scale);
  EXPECT_EQ(a.out, b.out);
  Options other;
  other.scale = 0.5f;
  const ReferenceResult d = reference_attention(c.q.view, c.k.view, c.v.view, other);
  EXPECT_NE(a.out, d.out);
}

TEST(Semantics, OracleMatchesClosedFormForOneKey) {
  // With one key every row's output is that key's value and LSE is the scaled score.
  Shape s;
  s.seqlen_q = 3;
  s.seqlen_k = 1;
  s.head_dim = 4;
  AttentionCase c(s);
  const ReferenceResult r = c.reference();
  for (int64_t i = 0; i < 3; ++i) {
    double dot = 0;
    for (int64_t ch = 0; ch < 4; ++ch) {
      EXPECT_NEAR(r.out[i * 4 + ch], static_cast<float*>(c.v.view.data)[ch], 1e-15);
      dot += double(static_cast<float*>(c.q.view.data)[c.q.index(0, i, 0, ch)]) *
             static_cast<float*>(c.k.view.data)[ch];
    }
    EXPECT_NEAR(r.lse[i], dot * 0.5f, 1e-12);
  }
}

TEST(Semantics, StridedOutputPaddingUntouched) {
  for (Backend b : cpu_backends()) {
    Shape s;
    s.seqlen_q = 5;
    s.seqlen_k = 7;
    s.heads_q = 2;
    s.heads_kv = 1;
    s.head_dim = 8;
    s.strided = true;
    AttentionCase c(s);
    forward(c.q.view, c.k.view, c.v.view, c.out.view, c.options(b));
    // Padding elements (columns 8..15 of each padded row) must still be poison.
    const float* out = static_cast<const float*>(c.out.view.data);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 5; ++i)
        for (int64_t pad = 8; pad < 16; ++pad)
          EXPECT_TRUE(std::isnan(out[c.out.index(0, i, h, 0) + pad])) << backend_name(b);
  }
}

}  // namespace
}  // namespace flashtile
