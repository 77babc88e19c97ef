// The variants' and varlen's arguments are checked on the host like every other argument:
// a clear message, the right ErrorKind, and out and lse untouched. Normalisations that the
// semantics define (causal over a window's right side) are applied, not refused.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>

#include "testing/attention_case.hpp"

namespace flashtile {
namespace {

using testing::AttentionCase;
using testing::Shape;

Shape small_variant_shape() {
  Shape s;
  s.batch = 2, s.seqlen_q = 5, s.seqlen_k = 7, s.heads_q = 4, s.heads_kv = 2, s.head_dim = 8;
  s.alibi = true;
  s.sinks = true;
  return s;
}

Shape small_varlen_shape() {
  Shape s;
  s.varlen_q = {3, 0, 4};
  s.varlen_k = {2, 5, 4};
  s.heads_q = 2, s.heads_kv = 1, s.head_dim = 8;
  return s;
}

// Runs `mutate` on a valid call and expects the refusal `message` with out and lse unwritten.
void expect_refused(const Shape& shape,
                    const std::function<void(AttentionCase&, Options&, std::optional<Varlen>&)>& mutate,
                    const std::string& message, ErrorKind kind = ErrorKind::invalid_argument) {
  AttentionCase c(shape);
  Options o = c.options(Backend::cpu_reference);
  std::optional<Varlen> varlen = c.varlen();
  mutate(c, o, varlen);
  const testing::HostBytes out_before = c.out.bytes;
  const std::vector<float> lse_before = c.lse;
  for (Backend backend : {Backend::cpu_reference, Backend::automatic}) {
    o.backend = backend;
    try {
      testing::run_forward(c.q.view, c.k.view, c.v.view, c.out.view, o, varlen);
      ADD_FAILURE() << "accepted, expected: " << message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
      EXPECT_EQ(e.kind(), kind) << e.what();
    }
    EXPECT_EQ(c.out.bytes, out_before) << message << ": out was written";
    EXPECT_EQ(0, std::memcmp(c.lse.data(), lse_before.data(), lse_before.size() * 4))
        << message << ": lse was written";
  }
}

TEST(VariantValidation, WindowSidesBelowMinusOneAreRefused) {
  expect_refused(small_variant_shape(), [](auto&, Options& o, auto&) { o.window = {-2, 3}; },
                 "window.left must be -1 (unbounded) or >= 0, got -2");
  expect_refused(small_variant_shape(), [](auto&, Options& o, auto&) { o.window = {3, -7}; },
                 "window.right must be -1 (unbounded) or >= 0, got -7");
}

TEST(VariantValidation, CausalOverridesANegativeRightSide) {
  // right < 0 under causal is normalised to 0 (FlashAttention's rule), not refused: the
  // output is bitwise that of window (2, 0).
  AttentionCase c(small_variant_shape());
  Options normalised = c.options(Backend::cpu_reference);
  normalised.causal = true;
  normalised.window = {2, 0};
  forward(c.q.view, c.k.view, c.v.view, c.out.view, normalised);
  const testing::HostBytes expected = c.out.bytes;
  c.poison();
  Options negative_right = normalised;
  negative_right.window = {2, -5};
  forward(c.q.view, c.k.view, c.v.view, c.out.view, negative_right);
  EXPECT_EQ(c.out.bytes, expected);
}

TEST(VariantValidation, SoftcapMustBeZeroOrPositiveFinite) {
  for (float bad : {-1.0f, std::numeric_limits<float>::infinity(), std::nanf("")})
    expect_refused(small_variant_shape(), [bad](auto&, Options& o, auto&) { o.softcap = bad; },
                   "softcap must be 0 (off) or a positive finite number");
}

TEST(VariantValidation, AlibiSlopesOfTheWrongShapeAreRefused) {
  const Shape s = small_variant_shape();  // batch 2, heads_q 4
  expect_refused(s, [](AttentionCase& c, Options& o, auto&) {
    o.alibi_slopes = ParamView::vector(c.alibi_slopes.data(), Device::cpu(), 3);
  }, "alibi_slopes must be shaped (heads_q) or (batch, heads_q) = (4,) or (2, 4), got (3,)");
  expect_refused(s, [](AttentionCase& c, Options& o, auto&) {
    o.alibi_slopes = ParamView::matrix(c.alibi_slopes.data(), Device::cpu(), 1, 4);
  }, "alibi_slopes must be shaped (heads_q) or (batch, heads_q) = (4,) or (2, 4), got (1, 4)");
  expect_refused(s, [](AttentionCase& c, Options& o, auto&) {
    o.alibi_slopes = ParamView::vector(c.alibi_slopes.data(), Device::cpu(), 4);
    o.alibi_slopes.ndim = 3;
  }, "got 3-D");
  expect_refused(s, [](AttentionCase& c, Options& o, auto&) {
    o.alibi_slopes = ParamView::vector(c.alibi_slopes.data(), Device::cuda(0), 4);
  }, "alibi_slopes.device must match q.device (expected cpu, got cuda:0)");
}

TEST(VariantValidation, SinksOfTheWrongShapeAreRefused) {
  const Shape s = small_variant_shape();
  expect_refused(s, [](AttentionCase& c, Options& o, auto&) {
    o.sinks = ParamView::matrix(c.sinks.data(), Device::cpu(), 2, 2);
  }, "sinks must be shaped (heads_q)");
  expect_refused(s, [](AttentionCase& c, Options& o, auto&) {
    o.sinks = ParamView::vector(c.sinks.data(), Device::cpu(), 5);
  }, "sinks must be shaped (heads_q)");
}

TEST(VariantValidation, OutMustNotOverlapTheVariantsParameters) {
  // An output view placed over the slopes' memory.
  Shape s = small_variant_shape();
  AttentionCase c(s);
  std::vector<float> shared(static_cast<size_t>(c.out.view.numel()) + 8, 0.0f);
  TensorView out = TensorView::contiguous(shared.data(), DType::f32, Device::cpu(),
                                          c.out.view.shape);
  Options o = c.options(Backend::cpu_reference);
  o.alibi_slopes = ParamView::vector(shared.data() + 4, Device::cpu(), s.heads_q);
  EXPECT_THROW(
      {
        try {
          forward(c.q.view, c.k.view, c.v.view, out, o);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("out must not overlap alibi_slopes"),
                    std::string::npos) << e.what();
          throw;
        }
      },
      Error);
}

TEST(VariantValidation, JourneyBackendsRefuseVariantsAndAutoPicksOneThatServes) {
  Shape s = small_variant_shape();
  AttentionCase c(s);
  Options o = c.options(Backend::cpu_standard);
  try {
    forward(c.q.view, c.k.view, c.v.view, c.out.view, o);
    FAIL() << "cpu_standard accepted a variant";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported);
    EXPECT_NE(std::string(e.what()).find("journey step"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ALiBi, sinks"), std::string::npos) << e.what();
  }
  o.backend = Backend::automatic;
  EXPECT_NE(plan(c.q.view, c.k.view, c.v.view, c.out.view, o).backend, Backend::cpu_standard);
  forward(c.q.view, c.k.view, c.v.view, c.out.view, o);
  const Verification v =
      verify_forward(c.q.view, c.k.view, c.v.view, c.out.view, c.lse.data(), c.reference_options());
  EXPECT_TRUE(v.pass()) << v.out_error << " > " << v.out_bound;
}

// --- varlen ------------------------------------------------------------------------------

TEST(VarlenValidation, NonMonotoneCuSeqlensAreRefused) {
  expect_refused(small_varlen_shape(), [](AttentionCase& c, auto&, auto&) {
    c.cu_seqlens_k = {0, 4, 2, 11};
  }, "varlen.cu_seqlens_k must be non-decreasing, but cu_seqlens_k[2] = 2 < cu_seqlens_k[1] = 4");
}

TEST(VarlenValidation, CuSeqlensOutOfRangeAreRefused) {
  expect_refused(small_varlen_shape(), [](AttentionCase& c, auto&, auto&) {
    c.cu_seqlens_k.back() = 12;  // k has 11 rows
  }, "varlen.cu_seqlens_k[3] must not exceed the packed rows of k (k.shape[1] = 11), got 12");
  expect_refused(small_varlen_shape(), [](AttentionCase& c, auto&, auto&) {
    c.cu_seqlens_q.back() = 6;  // q has 7 rows: the last would never be written
  }, "varlen.cu_seqlens_q[3] must equal the packed rows of q (q.shape[1] = 7), got 6");
  expect_refused(small_varlen_shape(), [](AttentionCase& c, auto&, auto&) {
    c.cu_seqlens_q[0] = 1;
  }, "varlen.cu_seqlens_q[0] must be 0, got 1");
  expect_refused(small_varlen_shape(), [](AttentionCase& c, auto&, auto&) {
    c.cu_seqlens_k[0] = -1;
  }, "varlen.cu_seqlens_k[0] must be >= 0, got -1");
}

TEST(VarlenValidation, OtherVarlenArgumentsAreChecked) {
  const Shape s = small_varlen_shape();
  expect_refused(s, [](auto&, auto&, std::optional<Varlen>& vl) { vl->cu_seqlens_q = nullptr; },
                 "varlen.cu_seqlens_q is null");
  expect_refused(s, [](auto&, auto&, std::optional<Varlen>& vl) { vl->batch = 0; },
                 "varlen.batch must be positive, got 0");
  expect_refused(s, [](AttentionCase& c, auto&, std::optional<Varlen>& vl) {
    c.seqused_k = {2, 6, 1};  // sequence 1 has 5 keys
    vl->seqused_k = c.seqused_k.data();
  }, "varlen.seqused_k[1] must lie in [0, 5] (the keys of sequence 1), got 6");
  expect_refused(s, [](auto&, auto&, std::optional<Varlen>& vl) { vl->max_seqlen_q = 3; },
                 "varlen.max_seqlen_q (3) is smaller than the longest sequence (4)");
  expect_refused(s, [](AttentionCase& c, auto&, auto&) { c.q.view.shape[0] = 2; },
                 "q.shape[0] must be 1 for a packed varlen batch");
  expect_refused(s, [](AttentionCase& c, Options& o, auto&) {
    c.alibi_slopes.assign(4 * 2, 0.1f);  // (4, heads): the batch is 3 sequences
    o.alibi_slopes = ParamView::matrix(c.alibi_slopes.data(), Device::cpu(), 4, 2);
  }, "alibi_slopes must be shaped (heads_q) or (batch, heads_q) = (2,) or (3, 2), got (4, 2)");
}

TEST(VarlenValidation, EmptySequencesAndUsedKeysRunAndMatchTheOracle) {
  Shape s = small_varlen_shape();
  s.varlen_q = {3, 0, 1, 4};
  s.varlen_k = {2, 5, 0, 4};
  s.seqused_k = {1, 5, 0, 4};
  s.causal = true;
  AttentionCase c(s);
  const std::optional<Varlen> vl = c.varlen();
  forward_varlen(c.q.view, c.k.view, c.v.view, c.out.view, *vl, c.options(Backend::automatic));
  const Verification v = verify_forward(c.q.view, c.k.view, c.v.view, c.out.view, c.lse.data(),
                                        c.reference_options(), &*vl);
  EXPECT_TRUE(v.pass()) << v.out_error << " > " << v.out_bound;
  // Sequence 2 has a query and no key: 0 and LSE -inf (heads_q 2, total_q 8, row 3).
  EXPECT_EQ(c.lse[0 * 8 + 3], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(c.lse[1 * 8 + 3], -std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace flashtile
