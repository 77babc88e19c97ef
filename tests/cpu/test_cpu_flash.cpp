// cpu_flash beyond the generic f32 grid of test_cpu_backends.cpp: every attention variant
// (windows, softcap, ALiBi, sinks, all together) and packed varlen batches against the oracle,
// f16/bf16 under the FlashAttention rule, every head dim from 1 to 256, every SIMD target
// this CPU can run, NaN propagation, thread-count independence, the no-N×N workspace, and
// its vectorised exp and online-softmax step against the scalar definitions.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <random>
#include <tuple>

#include "api/params.hpp"
#include "attn/softmax_state.hpp"
#include "support/variants.hpp"
#include "support/backend_grid.hpp"
#include "support/nonfinite_cases.hpp"
#include "support/oracle_check.hpp"
#include "testing/attention_case.hpp"

#if FLASHTILE_WITH_HWY
#include "cpu/flash.hpp"
#endif

namespace flashtile {
namespace {

using testing::AttentionCase;
using testing::HostTensor;
using testing::Shape;
using testing::Variant;
using testing::with_variant;

#define SKIP_WITHOUT_CPU_FLASH()                                                          \
  do {                                                                                    \
    if (!backend_available(Backend::cpu_flash))                                           \
      GTEST_SKIP() << "cpu_flash unavailable: "                                           \
                   << backend_unavailable_reason(Backend::cpu_flash);                     \
  } while (0)

// Runs cpu_flash on c (dense or varlen) with c's variant.
void run_flash(AttentionCase& c) {
  testing::run_forward(c.q.view, c.k.view, c.v.view, c.out.view, c.options(Backend::cpu_flash),
                       c.varlen());
}

void expect_passes(const Shape& shape, uint32_t seed = 1234) {
  AttentionCase c(shape, seed);
  run_flash(c);
  EXPECT_TRUE(testing::matches_oracle(c));
}

// Runs cpu_flash and returns the output bytes and LSE.
std::pair<std::vector<unsigned char>, std::vector<float>> run_bytes(const Shape& shape) {
  AttentionCase c(shape);
  run_flash(c);
  return {std::vector<unsigned char>(c.out.bytes.begin(), c.out.bytes.end()), c.lse};
}

// Every feature alone and in combination. The windows are narrower than the longer test
// sequences, so they cut key blocks on both sides; softcaps of 0.3 saturate tanh on the
// random scores, 8 barely bends them.
const std::vector<Variant>& variants() {
  static const std::vector<Variant> all = {
      {"window left", {37, -1}},
      {"window right", {-1, 23}},
      {"window both", {45, 12}},
      {"window left + causal", {30, -1}, true},
      {"window (0, 0)", {0, 0}},
      {"window wide left, right 70", {200, 70}},
      {"softcap 0.3", {}, false, 0.3f},
      {"softcap 8 + causal", {}, true, 8.0f},
      {"alibi (heads)", {}, false, 0.0f, true},
      {"alibi (batch, heads) + causal", {}, true, 0.0f, true, true},
      {"sinks", {}, false, 0.0f, false, false, true},
      {"sinks + causal", {}, true, 0.0f, false, false, true},
      {"all: window, softcap, alibi (b, h), sinks", {50, 7}, false, 2.0f, true, true, true},
      {"all + causal", {64, -1}, true, 1.0f, true, false, true},
  };
  return all;
}

// The backend grid's lengths and layouts (MHA/GQA/MQA, strided), with every variant.
std::vector<Shape> variant_grid(const std::vector<int64_t>& head_dims, DType dtype) {
  std::vector<Shape> grid;
  for (const Shape& base : testing::backend_grid(head_dims, dtype, /*large=*/false)) {
    if (base.causal) continue;  // the variants set their own causal flag
    for (const Variant& v : variants()) grid.push_back(with_variant(base, v));
  }
  return grid;
}

class CpuFlashVariants : public ::testing::TestWithParam<DType> {};

TEST_P(CpuFlashVariants, EveryVariantOnTheGrid) {
  SKIP_WITHOUT_CPU_FLASH();
  // One head dim for the 16-bit dtypes: the oracle's low-precision pass is the slow part.
  const DType dtype = GetParam();
  for (const Shape& s : variant_grid(dtype == DType::f32 ? std::vector<int64_t>{40, 64}
                                                         : std::vector<int64_t>{40},
                                     dtype))
    expect_passes(s);
}

TEST_P(CpuFlashVariants, LongSequencesWithWindows) {
  SKIP_WITHOUT_CPU_FLASH();
  // Several query and key blocks with masked blocks on both edges of the window, and the
  // whole blocks between them.
  Shape s;
  s.heads_q = 2;
  s.heads_kv = 1;
  s.dtype = GetParam();
  const Variant long_variants[] = {
      {"window (300, 0)", {300, -1}, true},
      {"window (129, 200) + softcap + alibi + sinks", {129, 200}, false, 1.5f, true, false, true},
  };
  for (auto [sq, sk] : {std::pair{1023, 1025}, std::pair{1025, 1023}})
    for (const Variant& v : long_variants) {
      s.seqlen_q = sq;
      s.seqlen_k = sk;
      expect_passes(with_variant(s, v));
    }
}

// ---- varlen ------------------------------------------------------------------------------
// Packed batches with empty and length-1 sequences (no queries, no keys, both), sequences
// longer than one query and one key block, and seqused_k.
std::vector<Shape> varlen_shapes(DType dtype) {
  Shape base;
  base.heads_q = 4;
  base.heads_kv = 2;
  base.head_dim = 40;
  base.dtype = dtype;
  std::vector<Shape> shapes;
  auto add = [&](std::vector<int64_t> q, std::vector<int64_t> k, std::vector<int64_t> used = {}) {
    Shape s = base;
    s.varlen_q = std::move(q);
    s.varlen_k = std::move(k);
    s.seqused_k = std::move(used);
    shapes.push_back(s);
  };
  add({1, 0, 17, 1, 250, 0}, {1, 5, 0, 300, 240, 0});
  add({213, 1, 64}, {1, 213, 65});
  add({70, 0, 200}, {90, 10, 400}, {33, 0, 400});
  // Every variant on every batch in f32; the 16-bit dtypes rotate the variants over them.
  std::vector<Shape> out;
  for (size_t i = 0; i < shapes.size(); ++i)
    for (size_t v = 0; v < variants().size(); ++v)
      if (dtype == DType::f32 || v % shapes.size() == i)
        out.push_back(with_variant(shapes[i], variants()[v]));
  for (Shape s : shapes) {  // plain full and causal attention
    out.push_back(s);
    s.causal = true;
    out.push_back(s);
  }
  return out;
}

TEST_P(CpuFlashVariants, VarlenWithEmptyAndLengthOneSequences) {
  SKIP_WITHOUT_CPU_FLASH();
  for (const Shape& s : varlen_shapes(GetParam())) expect_passes(s);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuFlashVariants,
                         ::testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CpuFlash, VarlenStridedViews) {
  SKIP_WITHOUT_CPU_FLASH();
  Shape s;
  s.heads_q = 3;
  s.heads_kv = 1;
  s.head_dim = 24;
  s.strided = true;
  s.varlen_q = {5, 200, 0, 1};
  s.varlen_k = {300, 190, 3, 1};
  for (const Variant& v : variants()) expect_passes(with_variant(s, v));
}

TEST(CpuFlash, PlanPicksCpuFlashForEveryVariant) {
  SKIP_WITHOUT_CPU_FLASH();
  std::vector<Shape> shapes;
  Shape dense;
  dense.seqlen_q = 50;
  dense.seqlen_k = 70;
  dense.heads_q = 2;
  for (const Variant& v : variants()) shapes.push_back(with_variant(dense, v));
  shapes.push_back(varlen_shapes(DType::f32).front());
  for (const Shape& s : shapes) {
    AttentionCase c(s);
    Options o = c.options(Backend::automatic);
    EXPECT_EQ(testing::plan_call(c.q.view, c.k.view, c.v.view, c.out.view, o, c.varlen()).backend,
              Backend::cpu_flash)
        << s.describe();
  }
}

// ---- NaN and empty rows --------------------------------------------------------------------
// A NaN in what a row reads (its query, a key or a value it sees) makes that row NaN, output
// and LSE (values: output only); rows that do not see it stay finite and match the oracle.
TEST(CpuFlash, NanInputsReachExactlyTheRowsThatReadThem) {
  SKIP_WITHOUT_CPU_FLASH();
  Shape s;
  s.seqlen_q = 300;
  s.seqlen_k = 300;
  s.head_dim = 32;
  s.window = {40, 0};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  enum Where { kQuery, kKey, kValue };
  for (Where where : {kQuery, kKey, kValue}) {
    SCOPED_TRACE(where == kQuery ? "query" : where == kKey ? "key" : "value");
    AttentionCase c(s);
    // Query row 150 (its scores against every key), or key/value 100, seen by rows 100..140
    // (inside masked blocks: both edges of the window cross it).
    const int64_t row = 150, key = 100;
    if (where == kQuery) static_cast<float*>(c.q.view.data)[c.q.index(0, row, 0, 5)] = nan;
    if (where == kKey) static_cast<float*>(c.k.view.data)[c.k.index(0, key, 0, 5)] = nan;
    if (where == kValue) static_cast<float*>(c.v.view.data)[c.v.index(0, key, 0, 5)] = nan;
    const ReferenceResult oracle = c.reference();
    run_flash(c);
    const float* out = static_cast<const float*>(c.out.view.data);
    for (int64_t i = 0; i < s.seqlen_q; ++i) {
      const bool reads_nan = where == kQuery ? i == row : (i >= key && i <= key + 40);
      for (int64_t ch = 0; ch < s.head_dim; ++ch) {
        const float x = out[c.out.index(0, i, 0, ch)];
        // A NaN value reaches only its own channel.
        const bool expect_nan = reads_nan && (where != kValue || ch == 5);
        ASSERT_EQ(std::isnan(x), expect_nan) << "row " << i << " channel " << ch;
        if (!expect_nan) {
          const double ref = oracle.out[i * s.head_dim + ch];
          ASSERT_NEAR(x, ref, 1e-5 * (1.0 + std::fabs(ref))) << "row " << i << " channel " << ch;
        }
      }
      EXPECT_EQ(std::isnan(c.lse[i]), reads_nan && where != kValue) << "row " << i;
    }
  }
}

TEST(CpuFlash, NanScoreInAnOtherwiseMaskedBlockStillPropagates) {
  SKIP_WITHOUT_CPU_FLASH();
  // Row 0 of a causal call sees key 0 only: its whole block max is that one NaN score.
  Shape s;
  s.seqlen_q = s.seqlen_k = 70;
  s.head_dim = 16;
  s.causal = true;
  AttentionCase c(s);
  static_cast<float*>(c.k.view.data)[c.k.index(0, 0, 0, 3)] = std::numeric_limits<float>::quiet_NaN();
  run_flash(c);
  const float* out = static_cast<const float*>(c.out.view.data);
  for (int64_t i = 0; i < s.seqlen_q; ++i) {  // every row sees key 0
    EXPECT_TRUE(std::isnan(c.lse[i])) << "row " << i;
    EXPECT_TRUE(std::isnan(out[c.out.index(0, i, 0, 0)])) << "row " << i;
  }
}

TEST(CpuFlash, RowsThatSeeNoKeyGiveZeroAndMinusInfOrTheSink) {
  SKIP_WITHOUT_CPU_FLASH();
  // seqlen_q 300 > seqlen_k 100 under causal: the first 200 rows see nothing; with a window
  // (10, -1) and right = 0 the same rows, and each later row sees at most 11 keys.
  for (bool sinks : {false, true}) {
    Shape s;
    s.seqlen_q = 300;
    s.seqlen_k = 100;
    s.head_dim = 24;
    s.causal = true;
    s.window = {10, -1};
    s.sinks = sinks;
    AttentionCase c(s);
    run_flash(c);
    EXPECT_TRUE(testing::matches_oracle(c));
    const float* out = static_cast<const float*>(c.out.view.data);
    for (int64_t i = 0; i < 200; ++i) {
      EXPECT_EQ(c.lse[i], sinks ? c.sinks[0] : -std::numeric_limits<float>::infinity());
      for (int64_t ch = 0; ch < s.head_dim; ++ch) EXPECT_EQ(out[c.out.index(0, i, 0, ch)], 0.0f);
    }
  }
}

// ---- head dims, dtypes, layouts ------------------------------------------------------------
// The write-up's one head of 1024 rows has 6 query blocks, too few for the cores: its keys
// are split (split-KV, attn/split_kv.hpp) and the partials combined. The combine applies
// the NaN rule to the whole row: a row whose -inf scores all fall in the first splits but
// that has finite scores in a later one stays finite; a row with only -inf scores is NaN.
TEST(CpuFlash, SplitKvAppliesTheNonFiniteRuleToWholeRows) {
  SKIP_WITHOUT_CPU_FLASH();
  const int saved = omp_get_max_threads();
  omp_set_num_threads(24);  // more threads than tiles on any machine: the keys are split
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool sinks : {false, true}) {
      Shape s;
      s.seqlen_q = s.seqlen_k = 1024;
      s.head_dim = 64;
      s.causal = true;
      s.sinks = sinks;
      s.dtype = dtype;
      AttentionCase c(s);
      for (int64_t j = 0; j < 512; ++j) testing::nonfinite_detail::set(c.k, j, 0, 0, INFINITY);
      for (int64_t i = 0; i < 1024; ++i) testing::nonfinite_detail::set(c.q, i, 0, 0, -1.0f);
      forward(c.q.view, c.k.view, c.v.view, c.out.view, c.options(Backend::cpu_flash));
      EXPECT_TRUE(testing::matches_nonfinite_oracle(c, testing::nonfinite_tolerance(dtype), true))
          << s.describe();
      EXPECT_TRUE(std::isnan(c.lse[100]) && std::isfinite(c.lse[900])) << s.describe();
    }
  omp_set_num_threads(saved);
}

// Split-KV on every variant: one head (few tiles) with 24 threads, against the oracle; and
// a fixed thread count gives bitwise the same result run after run.
TEST_P(CpuFlashVariants, SplitKvMatchesTheOracle) {
  SKIP_WITHOUT_CPU_FLASH();
  const int saved = omp_get_max_threads();
  omp_set_num_threads(24);
  for (const Variant& v : variants()) {
    Shape s;
    s.seqlen_q = 1025;
    s.seqlen_k = 1023;
    s.head_dim = 64;
    s.dtype = GetParam();
    s = with_variant(s, v);
    expect_passes(s);
    EXPECT_EQ(run_bytes(s), run_bytes(s)) << s.describe();
  }
  omp_set_num_threads(saved);
}

TEST(CpuFlash, EveryHeadDimFrom1To256) {
  SKIP_WITHOUT_CPU_FLASH();
  for (int64_t d = 1; d <= 256; ++d) {
    Shape s;
    s.seqlen_q = 37;
    s.seqlen_k = 101;
    s.heads_q = 2;
    s.heads_kv = 1;
    s.head_dim = d;
    s.strided = d % 3 == 0;
    expect_passes(with_variant(s, variants()[d % variants().size()]));
  }
}

TEST(CpuFlash, HeadDimTailsInEveryDtype) {
  SKIP_WITHOUT_CPU_FLASH();
  int rotation = 0;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (int64_t d : {1, 3, 8, 13, 80, 112, 160, 192, 200, 256}) {
      Shape s;
      s.batch = 2;
      s.seqlen_q = 130;
      s.seqlen_k = 97;
      s.heads_q = 4;
      s.heads_kv = 2;
      s.head_dim = d;
      s.dtype = dtype;
      s.strided = true;
      for (bool causal : {false, true}) {
        s.causal = causal;
        expect_passes(s);
      }
      expect_passes(with_variant(s, variants()[rotation++ % variants().size()]));
    }
}

class CpuFlashLowPrecision : public ::testing::TestWithParam<DType> {};

TEST_P(CpuFlashLowPrecision, Grid) {
  SKIP_WITHOUT_CPU_FLASH();
  for (const Shape& s : testing::backend_grid({8, 40, 64, 136}, GetParam(), /*large=*/false))
    expect_passes(s);
}

TEST_P(CpuFlashLowPrecision, LongSequences) {
  SKIP_WITHOUT_CPU_FLASH();
  Shape s;
  s.heads_q = 2;
  s.heads_kv = 1;
  s.dtype = GetParam();
  for (auto [sq, sk, causal] : {std::tuple{1023, 1025, true}, std::tuple{1025, 1023, false}}) {
    s.seqlen_q = sq;
    s.seqlen_k = sk;
    s.causal = causal;
    expect_passes(s);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuFlashLowPrecision,
                         ::testing::Values(DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CpuFlash, RefusesHeadDimsAbove256AndAutoFallsBack) {
  SKIP_WITHOUT_CPU_FLASH();
  for (int64_t d : {257, 264, 512}) {
    Shape s;
    s.seqlen_q = s.seqlen_k = 5;
    s.head_dim = d;
    AttentionCase c(s);
    const testing::HostBytes before = c.out.bytes;
    try {
      forward(c.q.view, c.k.view, c.v.view, c.out.view, c.options(Backend::cpu_flash));
      ADD_FAILURE() << "head_dim " << d << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::unsupported);
      EXPECT_NE(std::string(e.what()).find("head_dim must be at most 256, got " + std::to_string(d)),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(c.out.bytes, before) << "nothing is written on error";
    const Plan plan = flashtile::plan(c.q.view, c.k.view, c.v.view, c.out.view, Options{});
    EXPECT_EQ(plan.backend, Backend::cpu_standard);
  }
}

TEST(CpuFlash, IsTheAutomaticCpuChoice) {
  SKIP_WITHOUT_CPU_FLASH();
  Shape s;
  s.seqlen_q = s.seqlen_k = 64;
  AttentionCase c(s);
  EXPECT_EQ(flashtile::plan(c.q.view, c.k.view, c.v.view, c.out.view, Options{}).backend,
            Backend::cpu_flash);
}

#if FLASHTILE_WITH_HWY  // reads cpu_flash's block size
TEST(CpuFlash, WorkspaceDoesNotGrowWithSequenceLength) {
  SKIP_WITHOUT_CPU_FLASH();
  // Per-thread O(block · d) scratch and the schedule (one small entry per query block): no
  // N×N buffer, no per-sequence copies.
  auto workspace = [](int64_t seqlen) {
    HostTensor q(DType::f32, {1, seqlen, 64, 64}, false), o(DType::f32, {1, seqlen, 64, 64}, false);
    return flashtile::plan(q.view, q.view, q.view, o.view, Options{}).workspace_bytes;
  };
  const int64_t block_m = detail::cpu_flash::geometry(64).block_m;
  const int64_t small = workspace(256), large = workspace(4096);  // 64 heads: more tasks than threads
  EXPECT_GT(small, 0);
  const int64_t blocks_small = (256 + block_m - 1) / block_m, blocks_large = (4096 + block_m - 1) / block_m;
  EXPECT_LE(large - small, (blocks_large - blocks_small) * 32) << "at most 32 bytes per query block";
  EXPECT_LT(small, int64_t(omp_get_max_threads()) * 256 * 1024);  // well under 256 KiB a thread
}
#endif

// ---- determinism ------------------------------------------------------------------------------
TEST(CpuFlash, ThreadCountDoesNotChangeOneBit) {
  SKIP_WITHOUT_CPU_FLASH();
  std::vector<Shape> shapes;
  for (int which : {0, 1, 2}) {
    Shape s;
    s.batch = 2;
    s.seqlen_q = 301;
    s.seqlen_k = 389;
    s.heads_q = 6;
    s.heads_kv = 2;
    s.head_dim = 72;
    s.dtype = which == 1 ? DType::bf16 : DType::f32;
    if (which == 1) s.causal = true;
    if (which == 2) s = with_variant(s, variants()[12]);  // every feature at once
    shapes.push_back(s);
  }
  Shape varlen = with_variant(varlen_shapes(DType::f32).front(), variants()[13]);
  shapes.push_back(varlen);
  // A sliding window over many query blocks: the packed K/V cache (flash.hpp) hits on one
  // thread and partly on several; a hit must give bitwise what a repack gives.
  Shape window;
  window.seqlen_q = window.seqlen_k = 2000;
  window.heads_q = 4;
  window.heads_kv = 2;
  window.head_dim = 64;
  window.causal = true;
  window.window = {300, -1};
  window.dtype = DType::bf16;
  shapes.push_back(window);
  const int saved = omp_get_max_threads();
  for (const Shape& s : shapes) {
    omp_set_num_threads(1);
    const auto one = run_bytes(s);
    for (int threads : {2, 3, 7}) {
      omp_set_num_threads(threads);
      const auto many = run_bytes(s);
      EXPECT_EQ(many.first, one.first) << threads << " threads, " << s.describe();
      EXPECT_EQ(many.second, one.second) << threads << " threads, " << s.describe();
    }
  }
  omp_set_num_threads(saved);
}

TEST(CpuFlash, DeterministicOver100Runs) {
  SKIP_WITHOUT_CPU_FLASH();
  Shape s;
  s.seqlen_q = 200;
  s.seqlen_k = 333;
  s.heads_q = 4;
  s.heads_kv = 1;
  s.causal = true;
  s.window = {100, -1};
  s.softcap = 3.0f;
  s.alibi = true;
  s.sinks = true;
  const auto first = run_bytes(s);
  for (int run = 0; run < 100; ++run) {
    const auto again = run_bytes(s);
    ASSERT_EQ(again.first, first.first) << "run " << run;
    ASSERT_EQ(again.second, first.second) << "run " << run;
  }
}

#if FLASHTILE_WITH_HWY

// Restores the best SIMD target when a test that forced another one ends.
struct TargetGuard {
  ~TargetGuard() { detail::cpu_flash::force_target(""); }
};

TEST(CpuFlash, EverySimdTargetThisCpuRuns) {
  SKIP_WITHOUT_CPU_FLASH();
  const std::vector<std::string> targets = detail::cpu_flash::available_targets();
  ASSERT_FALSE(targets.empty());
  std::string names;
  for (const std::string& t : targets) names += " " + t;
  std::cout << "cpu_flash SIMD targets on this CPU, best first:" << names << "\n";
  TargetGuard guard;
  for (const std::string& target : targets) {
    SCOPED_TRACE(target);
    ASSERT_TRUE(detail::cpu_flash::force_target(target));
    EXPECT_EQ(std::string(detail::cpu_flash::geometry(64).target), target);
    for (const Shape& s : testing::backend_grid({13}, DType::f32, /*large=*/false))
      expect_passes(s);
    // Several query and key blocks, the causal diagonal crossing them both ways, and every
    // variant on them (alternating which length is longer).
    for (size_t i = 0; i < variants().size() + 1; ++i) {
      Shape s;
      s.seqlen_q = i % 2 ? 400 : 333;
      s.seqlen_k = i % 2 ? 333 : 400;
      s.head_dim = 24;
      s.causal = true;
      expect_passes(i < variants().size() ? with_variant(s, variants()[i]) : s);
    }
    for (const Shape& s : varlen_shapes(DType::f32))
      if (s.window.bounded() || s.softcap != 0.0f) expect_passes(s);
    Shape s;
    s.seqlen_q = 150;
    s.seqlen_k = 211;
    s.heads_q = 2;
    s.heads_kv = 1;
    s.head_dim = 136;
    s.strided = true;
    for (DType dtype : {DType::f16, DType::bf16})
      for (const Variant& v : {variants()[3], variants()[12]}) {
        s.dtype = dtype;
        expect_passes(with_variant(s, v));
      }
  }
  EXPECT_FALSE(detail::cpu_flash::force_target("NO_SUCH_TARGET"));
}

TEST(CpuFlash, VectorExpIsWithinTwoUlp) {
  SKIP_WITHOUT_CPU_FLASH();
  std::vector<float> x;
  for (float v = -87.0f; v <= 88.0f; v += 0.0037f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 0.5f * 0.693147f, -0.5f * 0.693147f})
    x.push_back(v);
  const size_t n = x.size();
  std::vector<float> y(n);
  detail::cpu_flash::vector_exp(x.data(), y.data(), n);
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const double exact = std::exp(double(x[i]));
    worst = std::max(worst, std::fabs(y[i] - exact) / exact);
  }
  EXPECT_LT(worst, 2.5e-7);  // about 2 ulp of float
  // Masked scores (-inf) and anything below the normal range give exactly 0; NaN stays NaN.
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float edge[] = {neg_inf, -1e30f, -100.0f, -88.0f, -87.9f, -87.34f};
  float out[6];
  detail::cpu_flash::vector_exp(edge, out, 6);
  for (float v : out) EXPECT_EQ(v, 0.0f);
  const float nan_in[] = {std::numeric_limits<float>::quiet_NaN(), 0.0f};
  float nan_out[2];
  detail::cpu_flash::vector_exp(nan_in, nan_out, 2);
  EXPECT_TRUE(std::isnan(nan_out[0]));
  EXPECT_EQ(nan_out[1], 1.0f);
}

TEST(CpuFlash, VectorTanhIsWithinSevenUlpOnEveryTarget) {
  SKIP_WITHOUT_CPU_FLASH();
  std::vector<float> x;
  for (float v = -12.0f; v <= 12.0f; v += 0.00037f) x.push_back(v);
  for (float v = 1e-30f; v < 1.0f; v *= 1.7f) x.insert(x.end(), {v, -v});
  for (float v : {0.0f, 8.999999f, 9.0f, 1e20f, -1e20f, std::numeric_limits<float>::max()})
    x.push_back(v);
  const size_t n = x.size();
  std::vector<float> y(n);
  TargetGuard guard;
  for (const std::string& target : detail::cpu_flash::available_targets()) {
    SCOPED_TRACE(target);
    ASSERT_TRUE(detail::cpu_flash::force_target(target));
    detail::cpu_flash::vector_tanh(x.data(), y.data(), n);
    double worst_ulp = 0;
    for (size_t i = 0; i < n; ++i) {
      const double exact = std::tanh(double(x[i]));
      const double ulp = std::nextafter(std::fabs(float(exact)), 2.0f) - std::fabs(float(exact));
      worst_ulp = std::max(worst_ulp, std::fabs(y[i] - exact) / ulp);
    }
    std::cout << target << ": tanh within " << worst_ulp << " ulp\n";
    EXPECT_LT(worst_ulp, 7.0);  // 5.2 from the fit in float, ~1 more from a 12-bit estimate
    const float inf = std::numeric_limits<float>::infinity();
    const float edge[] = {inf, -inf, std::numeric_limits<float>::quiet_NaN(), -0.0f};
    float out[4];
    detail::cpu_flash::vector_tanh(edge, out, 4);
    EXPECT_EQ(out[0], 1.0f);
    EXPECT_EQ(out[1], -1.0f);
    EXPECT_TRUE(std::isnan(out[2]));
    EXPECT_EQ(out[3], 0.0f);
  }
}

TEST(CpuFlash, LaneWiseOnlineSoftmaxMatchesTheSharedScalarUpdate) {
  SKIP_WITHOUT_CPU_FLASH();
  const int64_t lanes = detail::cpu_flash::geometry(64).lanes;
  const int64_t rows = 3 * lanes, keys = 23;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-6.0f, 6.0f);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<detail::SoftmaxState<float>> scalar(rows);
  std::vector<float> m(rows, neg_inf), l(rows, 0.0f), alpha(rows);
  for (int block = 0; block < 5; ++block) {
    std::vector<float> scores(keys * rows);
    for (int64_t j = 0; j < keys; ++j)
      for (int64_t r = 0; r < rows; ++r) {
        // Row 0 stays fully masked; row 1 is masked in the first block only; the rest
        // see a few masked keys.
        const bool masked = r == 0 || (r == 1 && block == 0) || (j + r + block) % 7 == 0;
        scores[j * rows + r] = masked ? neg_inf : dist(rng) + 3.0f * block;
      }
    std::vector<float> probs = scores;
    detail::cpu_flash::online_softmax_lanes(probs.data(), keys, rows, m.data(), l.data(),
                                            alpha.data());
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> row(keys);
      for (int64_t j = 0; j < keys; ++j) row[j] = scores[j * rows + r];
      const float expected_alpha = detail::online_softmax_block(scalar[r], row.data(), keys);
      EXPECT_EQ(m[r], scalar[r].m) << "row " << r << " block " << block;
      EXPECT_NEAR(alpha[r], expected_alpha, 3e-7f * expected_alpha) << "row " << r;
      EXPECT_NEAR(l[r], scalar[r].l, 1e-6f * scalar[r].l) << "row " << r;
      for (int64_t j = 0; j < keys; ++j)
        EXPECT_NEAR(probs[j * rows + r], row[j], 3e-7f * row[j]) << "row " << r << " key " << j;
    }
  }
  EXPECT_EQ(detail::log_sum_exp(detail::SoftmaxState<float>{m[0], l[0]}), neg_inf);
  EXPECT_EQ(detail::output_scale(detail::SoftmaxState<float>{m[0], l[0]}), 0.0f);
}

#endif  // FLASHTILE_WITH_HWY

}  // namespace
}  // namespace flashtile
