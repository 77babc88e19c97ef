// cpu_flash beyond the generic f32 grid of test_cpu_backends.cpp: f16/bf16 under the
// FlashAttention rule, every head dim it accepts, every SIMD target this CPU can run,
// thread-count independence, the no-N×N workspace, and its vectorised exp and
// online-softmax step against the scalar definitions.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <random>
#include <tuple>

#include "support/oracle_check.hpp"
#include "api/params.hpp"
#include "attn/softmax_state.hpp"
#include "testing/attention_case.hpp"
#include "support/backend_grid.hpp"

#if FLASHTILE_WITH_HWY
#include "cpu/flash.hpp"
#endif

namespace flashtile {
namespace {

using testing::AttentionCase;
using testing::HostTensor;
using testing::Shape;

#define SKIP_WITHOUT_CPU_FLASH()                                                          \
  do {                                                                                    \
    if (!backend_available(Backend::cpu_flash))                                           \
      GTEST_SKIP() << "cpu_flash unavailable: "                                           \
                   << backend_unavailable_reason(Backend::cpu_flash);                     \
  } while (0)

void expect_passes(const Shape& shape, uint32_t seed = 1234) {
  AttentionCase c(shape, seed);
  forward(c.q.view, c.k.view, c.v.view, c.out.view, c.options(Backend::cpu_flash));
  EXPECT_TRUE(testing::matches_oracle(c));
}

// Runs cpu_flash and returns the output bytes and LSE.
std::pair<std::vector<unsigned char>, std::vector<float>> run_bytes(const Shape& shape) {
  AttentionCase c(shape);
  forward(c.q.view, c.k.view, c.v.view, c.out.view, c.options(Backend::cpu_flash));
  return {std::vector<unsigned char>(c.out.bytes.begin(), c.out.bytes.end()), c.lse};
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

TEST(CpuFlash, EveryHeadDimUpTo256) {
  SKIP_WITHOUT_CPU_FLASH();
  for (int64_t d = 8; d <= 256; d += 8) {
    Shape s;
    s.seqlen_q = 37;
    s.seqlen_k = 101;
    s.heads_q = 2;
    s.heads_kv = 1;
    s.head_dim = d;
    s.causal = (d / 8) % 2 == 0;
    s.strided = (d / 8) % 3 == 0;
    expect_passes(s);
  }
}

TEST(CpuFlash, HeadDimTailsInEveryDtype) {
  SKIP_WITHOUT_CPU_FLASH();
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (int64_t d : {40, 72, 136, 256}) {
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
    }
}

TEST(CpuFlash, RefusesOtherHeadDimsAndAutoFallsBack) {
  SKIP_WITHOUT_CPU_FLASH();
  for (int64_t d : {4, 12, 100, 264}) {
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
      EXPECT_NE(std::string(e.what()).find("got " + std::to_string(d)), std::string::npos)
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

TEST(CpuFlash, WorkspaceDoesNotGrowWithSequenceLength) {
  SKIP_WITHOUT_CPU_FLASH();
  // Per-thread O(block · d) scratch only: no N×N buffer, no per-sequence copies.
  auto workspace = [](int64_t seqlen) {
    Shape s;
    s.seqlen_q = s.seqlen_k = seqlen;
    s.heads_q = s.heads_kv = 64;  // more tasks than threads for every length below
    s.head_dim = 64;
    HostTensor q(s.dtype, {1, seqlen, 64, 64}, false), o(s.dtype, {1, seqlen, 64, 64}, false);
    return flashtile::plan(q.view, q.view, q.view, o.view, Options{}).workspace_bytes;
  };
  const int64_t small = workspace(256);
  EXPECT_GT(small, 0);
  EXPECT_EQ(workspace(4096), small);
  EXPECT_LT(small, int64_t(omp_get_max_threads()) * 256 * 1024);  // well under 256 KiB a thread
}

TEST(CpuFlash, ThreadCountDoesNotChangeOneBit) {
  SKIP_WITHOUT_CPU_FLASH();
  for (bool causal : {false, true})
    for (DType dtype : {DType::f32, DType::bf16}) {
      Shape s;
      s.batch = 2;
      s.seqlen_q = 301;
      s.seqlen_k = 389;
      s.heads_q = 6;
      s.heads_kv = 2;
      s.head_dim = 72;
      s.causal = causal;
      s.dtype = dtype;
      const int saved = omp_get_max_threads();
      omp_set_num_threads(1);
      const auto one = run_bytes(s);
      for (int threads : {2, 3, 7}) {
        omp_set_num_threads(threads);
        const auto many = run_bytes(s);
        EXPECT_EQ(many.first, one.first) << threads << " threads, " << s.describe();
        EXPECT_EQ(many.second, one.second) << threads << " threads, " << s.describe();
      }
      omp_set_num_threads(saved);
    }
}

TEST(CpuFlash, DeterministicOver100Runs) {
  SKIP_WITHOUT_CPU_FLASH();
  Shape s;
  s.seqlen_q = 200;
  s.seqlen_k = 333;
  s.heads_q = 4;
  s.heads_kv = 1;
  s.causal = true;
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
    for (const Shape& s : testing::backend_grid({8, 72}, DType::f32, /*large=*/false))
      expect_passes(s);
    // Several query and key blocks, the causal diagonal crossing them both ways.
    for (auto [sq, sk] : {std::pair{400, 333}, std::pair{333, 400}}) {
      Shape s;
      s.seqlen_q = sq;
      s.seqlen_k = sk;
      s.causal = true;
      expect_passes(s);
    }
    Shape s;
    s.seqlen_q = 150;
    s.seqlen_k = 211;
    s.heads_q = 2;
    s.heads_kv = 1;
    s.head_dim = 136;
    s.strided = true;
    for (DType dtype : {DType::f16, DType::bf16})
      for (bool causal : {false, true}) {
        s.dtype = dtype;
        s.causal = causal;
        expect_passes(s);
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
  const float edge[] = {-std::numeric_limits<float>::infinity(), -100.0f, -88.0f, -87.9f};
  float out[4];
  detail::cpu_flash::vector_exp(edge, out, 4);
  for (float v : out) EXPECT_EQ(v, 0.0f);
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
