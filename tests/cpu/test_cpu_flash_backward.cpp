// cpu_flash's backward against the double oracle under the rule (fp32: normwise
// relative <= 1e-5; f16/bf16: max|g - oracle| <= 2·max|g_lowprec - oracle| + 1e-4) on odd
// lengths, sq != sk both ways, MHA/GQA/MQA, strided views, every variant, head dims 1..256,
// varlen with empty and length-1 sequences; and bitwise determinism over runs and threads.
#include <gtest/gtest.h>
#include <omp.h>

#include "backward_case.hpp"
#include "support/backend_grid.hpp"
#include "support/variants.hpp"

namespace flashtile {
namespace {

using testing::BackwardCase;
using testing::Shape;
using testing::Variant;
using testing::with_variant;

#define SKIP_WITHOUT_CPU_FLASH()                                                          \
  do {                                                                                    \
    if (!backend_available(Backend::cpu_flash))                                           \
      GTEST_SKIP() << "cpu_flash unavailable: "                                           \
                   << backend_unavailable_reason(Backend::cpu_flash);                     \
  } while (0)

const std::vector<Variant>& variants() {
  static const std::vector<Variant> all = {
      {"full", {}},
      {"causal", {}, true},
      {"window both", {45, 12}},
      {"window left + causal", {30, -1}, true},
      {"window (0, 0)", {0, 0}},
      {"softcap 0.3", {}, false, 0.3f},
      {"softcap 8 + causal", {}, true, 8.0f},
      {"alibi (heads)", {}, false, 0.0f, true},
      {"alibi (batch, heads) + causal", {}, true, 0.0f, true, true},
      {"sinks", {}, false, 0.0f, false, false, true},
      {"all: window, softcap, alibi (b, h), sinks", {50, 7}, false, 2.0f, true, true, true},
  };
  return all;
}

void expect_passes(const Shape& s) {
  BackwardCase c(s);
  c.run(Backend::cpu_flash);
  EXPECT_TRUE(testing::gradients_match(c));
}

class CpuFlashBackward : public ::testing::TestWithParam<DType> {};

TEST_P(CpuFlashBackward, OddLengthsLayoutsAndEveryVariant) {
  SKIP_WITHOUT_CPU_FLASH();
  const DType dtype = GetParam();
  struct Layout {
    int64_t sq, sk, hq, hkv, d;
    bool strided;
  };
  const Layout layouts[] = {
      {1, 1, 2, 2, 40, false},     {17, 17, 4, 2, 40, true},   {113, 127, 3, 1, 64, false},
      {129, 113, 4, 2, 40, true},  {127, 129, 2, 1, 96, false}, {1, 129, 2, 2, 32, false},
      {129, 1, 2, 1, 32, true},
  };
  size_t n = 0;
  for (const Layout& l : layouts)
    for (const Variant& v : variants()) {
      // Every variant on every layout in f32; the 16-bit dtypes rotate the variants (their
      // low-precision oracle is the slow part).
      if (dtype != DType::f32 && n++ % 3 != 0) continue;
      Shape s;
      s.batch = 2;
      s.seqlen_q = l.sq;
      s.seqlen_k = l.sk;
      s.heads_q = l.hq;
      s.heads_kv = l.hkv;
      s.head_dim = l.d;
      s.strided = l.strided;
      s.dtype = dtype;
      expect_passes(with_variant(s, v));
    }
}

TEST_P(CpuFlashBackward, LongSequences) {
  SKIP_WITHOUT_CPU_FLASH();
  for (auto [sq, sk] : {std::pair{1023, 1025}, std::pair{1025, 1023}}) {
    Shape s;
    s.seqlen_q = sq;
    s.seqlen_k = sk;
    s.heads_q = 2;
    s.heads_kv = 1;
    s.head_dim = 32;
    s.dtype = GetParam();
    expect_passes(with_variant(s, {"causal", {}, true}));
    expect_passes(with_variant(s, {"window + softcap + alibi + sinks", {129, 200}, false, 1.5f,
                                   true, false, true}));
  }
}

TEST_P(CpuFlashBackward, VarlenWithEmptyAndLengthOneSequences) {
  SKIP_WITHOUT_CPU_FLASH();
  Shape base;
  base.heads_q = 4;
  base.heads_kv = 2;
  base.head_dim = 24;
  base.dtype = GetParam();
  struct Batch {
    std::vector<int64_t> q, k, used;
  };
  const Batch batches[] = {
      {{1, 0, 17, 1, 150, 0}, {1, 5, 0, 130, 140, 0}, {}},
      {{70, 0, 100}, {90, 10, 130}, {33, 0, 120}},  // seqused_k leaves keys unused: dk = dv = 0
  };
  size_t n = 0;
  for (const Batch& batch : batches)
    for (const Variant& v : variants()) {
      if (GetParam() != DType::f32 && n++ % 3 != 0) continue;
      Shape s = base;
      s.varlen_q = batch.q;
      s.varlen_k = batch.k;
      s.seqused_k = batch.used;
      s.strided = n % 2 == 1;
      expect_passes(with_variant(s, v));
    }
}

TEST_P(CpuFlashBackward, GradientIntoTheLse) {
  // options.dlse (∂loss/∂lse) on every variant: dense with GQA, sq != sk both ways and
  // strides; varlen with a sequence of queries and no keys (lse -inf, or the sink's logit
  // with sinks: those rows must give no NaN, and with sinks their g reaches dsinks).
  SKIP_WITHOUT_CPU_FLASH();
  size_t n = 0;
  for (const Variant& v : variants()) {
    for (auto [sq, sk] : {std::pair{77, 130}, std::pair{130, 77}}) {
      Shape s = testing::shape_of(GetParam(), 2, sq, sk, 4, 2, 40);
      s.strided = sq > sk;
      BackwardCase c(with_variant(s, v));
      c.draw_lse_gradient(static_cast<uint32_t>(7 + n++));
      c.run(Backend::cpu_flash);
      EXPECT_TRUE(testing::gradients_match(c)) << v.name;
    }
    Shape s;
    s.heads_q = 4;
    s.heads_kv = 2;
    s.head_dim = 24;
    s.dtype = GetParam();
    s.varlen_q = {1, 0, 17, 1, 150};
    s.varlen_k = {1, 5, 0, 130, 140};
    BackwardCase c(with_variant(s, v));
    c.draw_lse_gradient(static_cast<uint32_t>(7 + n++));
    c.run(Backend::cpu_flash);
    EXPECT_TRUE(testing::gradients_match(c)) << "varlen " << v.name;
  }
}

TEST(CpuFlashBackward, ZeroLseGradientLeavesTheGradientsBitwiseUnchanged) {
  // D' = D - g is formed after D's own sum: g = 0 must not change a bit (in particular the
  // exact dP - D = 0 of a row that sees one key).
  SKIP_WITHOUT_CPU_FLASH();
  Shape s;
  s.batch = 2;
  s.seqlen_q = 70;
  s.seqlen_k = 1;
  s.heads_q = 2;
  s.head_dim = 64;
  s.sinks = true;
  BackwardCase c(s);
  c.run(Backend::cpu_flash);
  const std::vector<unsigned char> without = c.bytes();
  c.dlse.assign(c.fwd.lse.size(), 0.0f);
  c.poison();
  c.run(Backend::cpu_flash);
  EXPECT_EQ(c.bytes(), without);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuFlashBackward,
                         ::testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CpuFlashBackward, EveryHeadDim) {
  SKIP_WITHOUT_CPU_FLASH();
  for (int64_t d : {1, 2, 3, 7, 8, 15, 16, 31, 33, 63, 64, 65, 100, 127, 128, 129, 160, 200, 255, 256}) {
    Shape s;
    s.seqlen_q = 70;
    s.seqlen_k = 67;
    s.heads_q = 2;
    s.heads_kv = 1;
    s.head_dim = d;
    s.causal = true;
    s.softcap = 3.0f;
    s.sinks = true;
    expect_passes(s);
  }
}

TEST(CpuFlashBackward, BitwiseDeterministicOverRunsAndThreadCounts) {
  SKIP_WITHOUT_CPU_FLASH();
  // batch·heads_kv = 2: one and two threads take the fused schedule, three the split one
  // (flash_backward.cpp); both must give the same bits.
  Shape s;
  s.batch = 1;
  s.seqlen_q = 257;
  s.seqlen_k = 300;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim = 48;
  s.softcap = 2.0f;
  s.alibi = true;
  s.sinks = true;
  s.window = {100, 20};
  for (DType dtype : {DType::f32, DType::bf16}) {
    s.dtype = dtype;
    BackwardCase c(s);
    c.run(Backend::cpu_flash, /*deterministic=*/true);
    const std::vector<unsigned char> first = c.bytes();
    const int threads = omp_get_max_threads();
    for (int run = 0; run < 20; ++run) {
      omp_set_num_threads(1 + run % 3);  // 1, 2, 3 threads: more than the 2 cores, too
      c.poison();
      c.run(Backend::cpu_flash, /*deterministic=*/run % 2 == 0);
      ASSERT_EQ(c.bytes(), first) << dtype_name(dtype) << " run " << run;
    }
    omp_set_num_threads(threads);
  }
}

TEST(CpuFlashBackward, AutoPicksCpuFlashAndItsWorkspaceIsLinear) {
  SKIP_WITHOUT_CPU_FLASH();
  // The workspace at N and 2N: per-thread buffers (more on a bigger host) plus O(N·d), so
  // doubling N at most doubles it, where an N×N matrix would quadruple it.
  auto workspace_at = [](int64_t n) {
    Shape s;
    s.seqlen_q = s.seqlen_k = n;
    s.heads_q = 2;
    s.head_dim = 64;
    BackwardCase c(s);
    const Options o = c.options(Backend::automatic);
    const Plan p = plan_backward(c.fwd.q.view, c.fwd.k.view, c.fwd.v.view, c.fwd.out.view,
                                 c.dout.view, c.fwd.lse.data(), c.dq.view, c.dk.view, c.dv.view, o);
    EXPECT_EQ(p.backend, Backend::cpu_flash);
    EXPECT_GE(p.workspace_bytes, 2 * n * 4);  // at least D, one float per row and head
    return p.workspace_bytes;
  };
  const int64_t at_1k = workspace_at(1024), at_2k = workspace_at(2048);
  EXPECT_LE(at_2k, 2 * at_1k);
  EXPECT_LT(at_2k, int64_t(2) * 2048 * 2048 * 4);  // below the N×N fp32 scores of both heads
}

}  // namespace
}  // namespace flashtile
