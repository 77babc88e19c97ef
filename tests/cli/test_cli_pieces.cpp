// The CLI's pieces on their own: strict flag parsing, the standard ALiBi slopes, bench's
// FLOP count against a brute-force count of the visibility rule, and the sampled-row error
// (with the oracle on chosen rows) against the full oracle, for every variant.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "flags.hpp"
#include "flashtile/reference.hpp"
#include "workload.hpp"

namespace flashtile::cli {
namespace {

using testing::Shape;

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Flags, WindowTakesTwoIntegersOfAtLeastMinusOne) {
  const Window w = parse_window("128,0");
  EXPECT_EQ(w.left, 128);
  EXPECT_EQ(w.right, 0);
  EXPECT_EQ(parse_window("-1,5").left, -1);
  for (const char* bad : {"5", "a,b", "1,2,3", "", ",", "1,", "-2,0", "0,-3", "1.5,2", " 1,2",
                          "+1,2", "1,2x"}) {
    const std::string message = error_of([&] { parse_window(bad); });
    EXPECT_NE(message.find("--window must be L,R"), std::string::npos) << bad << ": " << message;
    EXPECT_NE(message.find("got '" + std::string(bad) + "'"), std::string::npos) << message;
  }
}

TEST(Flags, SoftcapIsPositiveAndFinite) {
  EXPECT_FLOAT_EQ(parse_softcap("30"), 30.0f);
  EXPECT_FLOAT_EQ(parse_softcap("0.5"), 0.5f);
  for (const char* bad : {"-1", "", "0", "abc", "inf", "nan", "1e99", "3x"})
    EXPECT_NE(error_of([&] { parse_softcap(bad); }).find("--softcap must be a positive finite"),
              std::string::npos)
        << bad;
}

TEST(Flags, SinksAreRandomOrOneNumber) {
  EXPECT_FALSE(parse_sinks("random").value.has_value());
  EXPECT_FLOAT_EQ(*parse_sinks("-1.5").value, -1.5f);
  for (const char* bad : {"", "nan", "rand", "1,2"})
    EXPECT_NE(error_of([&] { parse_sinks(bad); }).find("--sinks must be"), std::string::npos) << bad;
}

TEST(Flags, VarlenListsAndPairs) {
  const VarlenLengths l = parse_varlen("256,0,17/300,1");
  EXPECT_EQ(l.q, (std::vector<int64_t>{256, 0, 17, 1}));
  EXPECT_EQ(l.k, (std::vector<int64_t>{256, 0, 300, 1}));
  for (const char* bad : {"", "3,x", "1/2/3", "-1,4", "0,0", "4,,5", "2147483647,1"})
    EXPECT_NE(error_of([&] { parse_varlen(bad); }).find("--varlen must be"), std::string::npos)
        << bad;
}

TEST(Flags, VarlenRandomFillsTheTotalWithinTheRange) {
  const VarlenLengths l = parse_varlen("random:256-4096:16384");
  int64_t total = 0;
  for (size_t b = 0; b < l.q.size(); ++b) {
    total += l.q[b];
    EXPECT_LE(l.q[b], 4096);
    if (b + 1 < l.q.size()) EXPECT_GE(l.q[b], 256);  // only the last one is cut
  }
  EXPECT_EQ(total, 16384);
  EXPECT_EQ(l.q, l.k);
  EXPECT_GT(l.q.size(), 3u);
  EXPECT_EQ(parse_varlen("random:256-4096:16384").q, l.q);  // fixed seed: repeatable
  for (const char* bad : {"random:", "random:5-2:100", "random:0-4:100", "random:1-4:0",
                          "random:1-4", "random:a-4:10", "random:1-4:10:3"})
    EXPECT_NE(error_of([&] { parse_varlen(bad); }).find("--varlen must be"), std::string::npos)
        << bad;
}

TEST(Alibi, StandardSlopes) {
  const std::vector<float> eight = standard_alibi_slopes(8);
  ASSERT_EQ(eight.size(), 8u);
  for (int h = 0; h < 8; ++h) EXPECT_FLOAT_EQ(eight[h], std::exp2(-float(h + 1)));  // 2^-(h+1)
  // 12 heads: the 8 above, then every other slope of 16 heads, 2^-0.5, 2^-1.5, ...
  const std::vector<float> twelve = standard_alibi_slopes(12);
  ASSERT_EQ(twelve.size(), 12u);
  for (int h = 0; h < 8; ++h) EXPECT_FLOAT_EQ(twelve[h], eight[h]);
  for (int m = 0; m < 4; ++m) EXPECT_FLOAT_EQ(twelve[8 + m], std::exp2(-0.5f - float(m)));
  EXPECT_EQ(standard_alibi_slopes(1), (std::vector<float>{1.0f / 256}));
}

// Visible pairs straight from the rule: query i sees key j when j - (i + sk - sq) lies in
// [-left, right] (-1 unbounded, causal: right = 0), per sequence.
double brute_force_pairs(int64_t sq, int64_t sk, Window w, bool causal) {
  if (causal) w.right = 0;
  double pairs = 0;
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t j = 0; j < sk; ++j) {
      const int64_t rel = j - (i + sk - sq);
      pairs += (w.left < 0 || rel >= -w.left) && (w.right < 0 || rel <= w.right);
    }
  return pairs;
}

TEST(Flops, FieldConventionForFullAndCausal) {
  Shape s;
  s.batch = 2, s.heads_q = 3, s.heads_kv = 1, s.seqlen_q = 40, s.seqlen_k = 70, s.head_dim = 16;
  const double full = 4.0 * 2 * 3 * 40 * 70 * 16;
  EXPECT_DOUBLE_EQ(attention_flops(Workload(s)), full);
  s.causal = true;  // halved, whatever sq and sk (the field's convention)
  EXPECT_DOUBLE_EQ(attention_flops(Workload(s)), full / 2);
  s.window = {1000, -1};  // past every key: normalised away, still causal
  EXPECT_DOUBLE_EQ(attention_flops(Workload(s)), full / 2);
}

TEST(Flops, WindowsAndVarlenCountTheVisiblePairs) {
  Shape s;
  s.batch = 2, s.heads_q = 4, s.heads_kv = 2, s.head_dim = 8;
  const double per_pair = 4.0 * 4 * 8;
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{50, 50}, {30, 77}, {77, 30}})
    for (Window w : {Window{5, 0}, Window{3, 7}, Window{-1, 4}, Window{0, 0}, Window{10, -1}})
      for (bool causal : {false, true}) {
        s.seqlen_q = sq, s.seqlen_k = sk, s.window = w, s.causal = causal;
        if (causal && w.left < 0) continue;  // plain causal: the convention above
        EXPECT_DOUBLE_EQ(attention_flops(Workload(s)),
                         per_pair * 2 * brute_force_pairs(sq, sk, w, causal))
            << s.describe();
      }
  Shape v = s;
  v.window = {6, 2};
  v.causal = false;
  v.varlen_q = {5, 0, 40, 1, 13};
  v.varlen_k = {9, 4, 40, 0, 30};
  v.seqused_k = {9, 0, 33, 0, 12};
  double pairs = 0;
  for (size_t b = 0; b < v.varlen_q.size(); ++b)
    pairs += brute_force_pairs(v.varlen_q[b], v.seqused_k[b], v.window, false);
  EXPECT_DOUBLE_EQ(attention_flops(Workload(v)), per_pair * pairs);
  v.window = {};
  v.causal = true;  // varlen causal: counted too, per sequence
  pairs = 0;
  for (size_t b = 0; b < v.varlen_q.size(); ++b)
    pairs += brute_force_pairs(v.varlen_q[b], v.seqused_k[b], {}, true);
  EXPECT_DOUBLE_EQ(attention_flops(Workload(v)), per_pair * pairs);
}

// Variant cases for the sampled-row checks (small, so that the full oracle runs too).
std::vector<Shape> variant_shapes() {
  std::vector<Shape> shapes;
  Shape s;
  s.batch = 2, s.heads_q = 6, s.heads_kv = 3, s.seqlen_q = 37, s.seqlen_k = 90, s.head_dim = 24;
  s.window = {10, 3}, s.softcap = 1.5f, s.alibi = true, s.sinks = true;
  shapes.push_back(s);
  s.alibi_per_batch = true, s.causal = true, s.strided = true, s.dtype = DType::bf16;
  shapes.push_back(s);
  Shape v = s;  // varlen, empty and length-1 sequences, seqused_k; rows that see nothing
  v.dtype = DType::f16, v.strided = false, v.sinks = false, v.causal = false;
  v.window = {0, 0};
  v.varlen_q = {5, 0, 40, 1, 13, 7};
  v.varlen_k = {9, 4, 40, 0, 30, 2};
  v.seqused_k = {9, 0, 33, 0, 12, 1};
  shapes.push_back(v);
  return shapes;
}

TEST(SampledError, OracleRowsEqualTheFullOracle) {
  for (const Shape& shape : variant_shapes()) {
    const AttentionCase c(shape);
    const ReferenceResult full = c.reference();
    const TensorView& q = c.q.view;
    const std::optional<Varlen> varlen = c.varlen();
    std::vector<QueryRow> rows;
    for (int64_t b = 0; b < q.batch(); ++b)
      for (int64_t r = 0; r < q.seqlen(); ++r)
        for (int64_t h = 0; h < q.heads(); ++h) rows.push_back({b, r, h});
    for (ReferencePrecision precision : {ReferencePrecision::exact, ReferencePrecision::lowprec}) {
      const ReferenceResult full_p = precision == ReferencePrecision::exact ? full : c.reference(precision);
      const ReferenceResult some = reference_attention_rows(
          c.q.view, c.k.view, c.v.view, rows, c.reference_options(), varlen ? &*varlen : nullptr,
          precision);
      ASSERT_EQ(some.out.size(), full_p.out.size());
      int empty_rows = 0;
      for (size_t n = 0; n < rows.size(); ++n) {
        const QueryRow& r = rows[n];
        // The full oracle's LSE is [batch, heads, seqlen_q] ([heads, total_q] varlen).
        const size_t lse_index = size_t((r.batch * q.heads() + r.head) * q.seqlen() + r.row);
        EXPECT_EQ(some.lse[n], full_p.lse[lse_index]) << shape.describe() << " row " << n;
        empty_rows += some.lse[n] == -std::numeric_limits<double>::infinity();
        for (int64_t c2 = 0; c2 < q.head_dim(); ++c2)
          ASSERT_EQ(some.out[n * q.head_dim() + c2], full_p.out[n * q.head_dim() + c2])
              << shape.describe() << " row " << n;
      }
      if (shape.is_varlen()) EXPECT_GT(empty_rows, 0) << "the varlen case has rows that see nothing";
    }
  }
}

TEST(SampledError, RowsOutsideQAreRefused) {
  const AttentionCase c(variant_shapes()[0]);
  const std::string message = error_of([&] {
    reference_attention_rows(c.q.view, c.k.view, c.v.view, {{0, 37, 0}}, c.reference_options());
  });
  EXPECT_NE(message.find("rows[0].row must lie in [0, 37), got 37"), std::string::npos) << message;
}

TEST(SampledError, MatchesTheFullCheckAndSeesAWrongRow) {
  for (const Shape& shape : variant_shapes()) {
    Workload work(shape);
    run_once(work, Backend::cpu_reference);
    const ErrorReport full = measure_error(work);
    const ErrorReport sampled = measure_error(work, /*full_oracle_limit_flops=*/0);
    EXPECT_FALSE(full.sampled);
    EXPECT_TRUE(sampled.sampled);
    // cpu_reference writes the oracle rounded to the dtype: half an ulp at most.
    const double ulp = shape.dtype == DType::f32 ? 1.2e-7 : shape.dtype == DType::f16 ? 1e-3 : 8e-3;
    EXPECT_LE(full.max_abs_err, ulp) << shape.describe();
    EXPECT_LE(sampled.max_abs_err, full.max_abs_err) << shape.describe();
    // Corrupt the last sampled row (the last query row of the last head sampled): seen.
    const TensorView& out = work.host.out.view;
    const int64_t n = kSampledRows - 1;
    const int64_t b = n % out.batch(), row = out.seqlen() - 1, head = (n * 7) % out.heads();
    detail::store_from_float(out.data, out.dtype,
                             b * out.strides[0] + row * out.strides[1] + head * out.strides[2],
                             5.0f);
    EXPECT_GT(measure_error(work, 0).max_abs_err, 3.0) << shape.describe();
  }
}

}  // namespace
}  // namespace flashtile::cli
