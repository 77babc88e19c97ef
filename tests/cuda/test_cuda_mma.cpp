// cuda_mma (tensor cores, fp16/bf16, sm_80+) against the double-precision oracle with
// FlashAttention's error rule: the dense grid, every variant and their combinations
// (windows, softcap, ALiBi, sinks), packed varlen batches, every head dim from 1 to 256,
// rows of any alignment, determinism, > 2^31-element tensors and the remaining refusals.
// Every test skips without a CUDA device (CI).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "support/backend_grid.hpp"
#include "support/device_case.hpp"
#include "support/large_offsets.hpp"
#include "support/oracle_check.hpp"
#include "support/refusal.hpp"
#include "support/scoped_env.hpp"
#include "support/split_kv_cases.hpp"
#include "support/variants.hpp"

namespace flashtile {
namespace {

using testing::AttentionCase;
using testing::DeviceCase;
using testing::OffsetDeviceTensor;
using testing::Shape;
using testing::shape_of;

constexpr Backend kMma = Backend::cuda_mma;

#define SKIP_WITHOUT_MMA_DEVICE() FLASHTILE_SKIP_WITHOUT_BACKEND(kMma)

using testing::small_grid;

// On failure: where the output is off, to tell a wrong row or column from a rounding slip.
void report_worst(const AttentionCase& c, const Verification& verdict,
                  std::optional<float> scale) {
  const Options ref = c.reference_options(scale);
  const std::optional<Varlen> varlen = c.varlen();
  const ReferenceResult exact =
      varlen ? reference_attention_varlen(c.q.view, c.k.view, c.v.view, *varlen, ref)
             : reference_attention(c.q.view, c.k.view, c.v.view, ref);
  const TensorView& out = c.out.view;
  int shown = 0;
  int64_t n = 0;
  for (int64_t b = 0; b < out.batch(); ++b)
    for (int64_t s = 0; s < out.seqlen(); ++s)
      for (int64_t h = 0; h < out.heads(); ++h)
        for (int64_t d = 0; d < out.head_dim(); ++d, ++n) {
          const int64_t i = b * out.strides[0] + s * out.strides[1] + h * out.strides[2] + d;
          const double got = detail::load_as_float(out.data, out.dtype, i);
          if (!(std::fabs(got - exact.out[n]) <= verdict.out_bound) && shown++ < 8) {
            const int64_t row = (b * out.heads() + h) * out.seqlen() + s;
            std::printf("  b%lld s%lld h%lld d%lld: got %.8g oracle %.8g (lse %.8g oracle %.8g)\n",
                        (long long)b, (long long)s, (long long)h, (long long)d, got,
                        exact.out[n], c.lse[row], exact.lse[row]);
          }
        }
}

// The largest error / bound ratio a test saw (how close to FlashAttention's rule it came).
struct Margin {
  const char* what;
  double worst = 0;
  std::string worst_case;
  void add(const AttentionCase& c, const Verification& v) {
    const double ratio = v.out_bound > 0 ? v.out_error / v.out_bound : 0;
    if (ratio > worst) worst = ratio, worst_case = c.shape.describe();
  }
  ~Margin() {
    if (!worst_case.empty())
      std::printf("[margin] %s: worst out err/bound %.3f (%s)\n", what, worst, worst_case.c_str());
  }
};

// Checks a device run of `c` (already done) against the oracle.
void expect_oracle(const AttentionCase& c, std::optional<float> scale = std::nullopt,
                   Margin* margin = nullptr) {
  const Verification verdict = testing::verify_case(c, scale);
  if (margin != nullptr) margin->add(c, verdict);
  const ::testing::AssertionResult matches = testing::matches_oracle(c, verdict);
  EXPECT_TRUE(matches);
  if (!matches) report_worst(c, verdict, scale);
}

void expect_matches_oracle(const Shape& shape, std::optional<float> scale = std::nullopt,
                           Margin* margin = nullptr) {
  AttentionCase c(shape);
  DeviceCase d(c);
  Options o = d.options(c, kMma);
  o.scale = scale;
  d.run(c, o);
  expect_oracle(c, scale, margin);
}

class CudaMmaGrid : public ::testing::TestWithParam<DType> {};

// Seqlens 1, 17, 113, 127, 128, 129, 1023, 1025 with seqlen_q != seqlen_k both ways, causal
// or not, MHA/GQA/MQA, strided views; the four specialised head dims and two that are
// served by the next one up with masked loads and stores.
TEST_P(CudaMmaGrid, MatchesOracle) {
  SKIP_WITHOUT_MMA_DEVICE();
  for (const Shape& s : testing::backend_grid({64, 96, 128, 256, 40, 72}, GetParam(), !small_grid()))
    expect_matches_oracle(s);
}

// One variant feature at a time, then every combination, over lengths that put the window
// edges, the diagonal and the end of K inside tiles (sq != sk both ways), GQA and strides.
TEST_P(CudaMmaGrid, VariantsMatchOracle) {
  SKIP_WITHOUT_MMA_DEVICE();
  const DType dtype = GetParam();
  const std::vector<testing::Lengths> lengths = testing::variant_lengths(!small_grid());
  Margin softcap_margin{"softcap"}, other_margin{"other variants"};
  int rotate = 0;
  for (const testing::Variant& f : testing::forward_variants())
    for (const testing::Lengths& len : lengths) {
      const int64_t head_dims[] = {64, 128, 96, 256};
      Shape s = shape_of(dtype, 2, len.q, len.k, 4, 2, head_dims[rotate % 4]);
      s.strided = rotate % 3 == 1;
      if (rotate % 5 == 2) s.heads_kv = 1;  // MQA
      ++rotate;
      s = testing::with_variant(s, f);
      expect_matches_oracle(s, std::nullopt, f.softcap != 0 ? &softcap_margin : &other_margin);
    }
}

// Packed varlen batches: empty sequences (no queries, no keys), length-1 sequences, sq != sk
// per sequence, seqused_k, with masks and the other features aligned per sequence.
TEST_P(CudaMmaGrid, VarlenMatchesOracle) {
  SKIP_WITHOUT_MMA_DEVICE();
  for (const testing::VarlenBatch& batch : testing::varlen_batches())
    for (const testing::Variant& v : testing::varlen_variants())
      for (int64_t d : {64, 128}) {
        Shape s = testing::with_variant(shape_of(GetParam(), 1, 0, 0, 4, 2, d), v);
        s.varlen_q = batch.q, s.varlen_k = batch.k, s.seqused_k = batch.used;
        s.strided = d == 128;
        expect_matches_oracle(s);
      }
}

// Split-KV (JOURNEY 3i) pinned by FLASHTILE_MMA_SPLITS: never, 3 (uneven shares) and 16
// (many empty ones); unpinned, the small shapes of the other tests split wherever the GPU
// holds more CTAs than they have tiles. Head dims 36 (the narrow kernel, split) and 96, 256
// (the combine's pitches of 96 and 256) among them; a packed varlen batch too.
TEST_P(CudaMmaGrid, SplitKvMatchesOracle) {
  SKIP_WITHOUT_MMA_DEVICE();
  for (const char* splits : {"1", "3", "16"}) {
    SCOPED_TRACE(std::string("splits ") + splits);
    const testing::ScopedEnv pinned("FLASHTILE_MMA_SPLITS", splits);
    for (const Shape& s : testing::split_kv_shapes(GetParam(), {64, 128, 96, 256, 36}, true))
      expect_matches_oracle(s);
    const testing::VarlenBatch& batch = testing::varlen_batches()[1];
    for (const testing::Variant& v : testing::varlen_variants()) {
      Shape s = testing::with_variant(shape_of(GetParam(), 1, 0, 0, 4, 2, 128), v);
      s.varlen_q = batch.q, s.varlen_k = batch.k, s.seqused_k = batch.used;
      expect_matches_oracle(s);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaMmaGrid, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Every head dim is zero-padded to the next specialisation inside the kernel; dims that
// are not multiples of 8 (and strided rows d + 8 long) take the narrow load path.
TEST(CudaMma, EveryHeadDimFrom1To256) {
  SKIP_WITHOUT_MMA_DEVICE();
  std::vector<int64_t> dims = {1, 3, 13, 80, 112, 160, 192, 200, 256, 64, 96, 128, 8, 40, 250};
  if (!small_grid())
    for (int64_t d = 2; d <= 256; d += 9) dims.push_back(d);
  int rotate = 0;
  for (int64_t d : dims) {
    Shape s = shape_of(rotate % 2 ? DType::f16 : DType::bf16, 2, 77, 190, 4, 2, d);
    s.causal = rotate % 3 != 0;
    s.strided = rotate % 4 == 1;
    if (rotate % 5 == 3) s.softcap = 10.0f, s.alibi = true, s.sinks = true;
    ++rotate;
    expect_matches_oracle(s);
  }
}

TEST(CudaMma, ScaleOfAnySign) {
  SKIP_WITHOUT_MMA_DEVICE();
  for (float scale : {-0.37f, 0.0f, 1.5f})
    for (bool causal : {false, true})
      for (bool transformed : {false, true}) {
        Shape s = shape_of(DType::f16, 1, 100, 150, 2, 1, 64);
        s.causal = causal;
        if (transformed) s.softcap = 4.0f, s.alibi = true;  // the scale inside the transform
        expect_matches_oracle(s, scale);
      }
}

// Many tiles in flight through the cp.async ring, with the longest causal blocks, and a
// sliding window that skips most of them.
TEST(CudaMma, LongerSequences) {
  SKIP_WITHOUT_MMA_DEVICE();
  for (int64_t d : {64, 128})
    for (int mask = 0; mask < 3; ++mask) {
      Shape s = shape_of(DType::bf16, 1, 2000, 2100, 2, 2, d);
      s.causal = mask == 1;
      if (mask == 2) s.window = {300, 0};
      expect_matches_oracle(s);
    }
}

// Window edges at many offsets inside warps and 64-key tiles, sq != sk both ways, rows that
// see no key (with and without sinks), with softcap 20..50 (the case for MmaConfig's
// kSoftcapFmaExp2Tiles: a masked score must still weigh exactly 0 when its exp2 runs on the
// FMA pipe).
TEST(CudaMma, WindowEdgesAndEmptyRows) {
  SKIP_WITHOUT_MMA_DEVICE();
  struct Case {
    int64_t q, k;
    Window window;
    bool causal;
    float softcap;
    bool alibi, sinks;
  };
  const Case cases[] = {
      {600, 600, {100, 0}, false, 0, false, false},
      {600, 650, {37, 5}, false, 0, false, false},
      {650, 600, {0, 90}, false, 20.0f, false, false},
      {500, 700, {200, -1}, false, 50.0f, false, true},
      {700, 500, {-1, 17}, false, 0, true, false},
      {640, 640, {1, 1}, false, 30.0f, true, true},
      {300, 1200, {64, 0}, false, 50.0f, false, false},  // sq < sk: the last keys only
      {1200, 300, {64, 0}, false, 50.0f, false, false},  // sq > sk: the first rows see nothing
      {1200, 300, {}, true, 50.0f, false, true},         // ... causal, sink-only rows
      {1000, 1000, {300, 0}, true, 50.0f, false, false},
  };
  Margin softcap_margin{"softcap, window edges"}, other_margin{"window edges"};
  int rotate = 0;
  for (DType dtype : {DType::bf16, DType::f16})
    for (const Case& c : cases) {
      const int64_t head_dims[] = {128, 96, 64};
      Shape s = shape_of(dtype, 1, c.q, c.k, 2, 1, head_dims[rotate % 3]);
      s.strided = rotate % 4 == 1;
      ++rotate;
      s.window = c.window, s.causal = c.causal, s.softcap = c.softcap;
      s.alibi = c.alibi, s.sinks = c.sinks;
      expect_matches_oracle(s, std::nullopt, c.softcap != 0 ? &softcap_margin : &other_margin);
    }
}

// Sliding windows with a bounded left side and plain logits take traits.cuh's
// WindowSchedule (a block-major 1D grid): window sizes below, at and above
// a 64-key tile and a 128-row block, right sides 0, > 0 and unbounded, sq != sk both ways,
// MHA/GQA/MQA, several batch entries and heads (the 1D grid's decoding into head and batch
// entry), head dims 96 and 128 (64 and 256 keep the grid: traits.cuh kWindowScheduleFits)
// and 64, 256 beside them, sinks (still plain logits), strides.
TEST(CudaMma, WindowScheduleMatchesOracle) {
  SKIP_WITHOUT_MMA_DEVICE();
  struct Case {
    int64_t batch, q, k, heads_q, heads_kv, head_dim;
    Window window;
    bool sinks;
  };
  const Case cases[] = {
      {3, 700, 700, 4, 4, 128, {1, 0}, false},      {2, 1000, 1000, 6, 2, 128, {63, 0}, false},
      {2, 1000, 1000, 4, 1, 64, {64, 0}, true},     {1, 1500, 1500, 3, 3, 128, {127, 0}, false},
      {2, 900, 1300, 4, 2, 96, {128, 3}, false},    {2, 1300, 900, 4, 2, 128, {200, 64}, true},
      {1, 2100, 2100, 2, 1, 128, {1024, 0}, false}, {2, 600, 800, 4, 2, 256, {300, -1}, false},
      {1, 513, 257, 8, 4, 128, {0, 0}, false},      {2, 300, 1200, 2, 2, 64, {511, 100}, false},
      {5, 129, 129, 3, 1, 128, {17, 17}, true},     {1, 3000, 3000, 2, 2, 128, {2048, 0}, false},
  };
  int rotate = 0;
  for (DType dtype : {DType::bf16, DType::f16})
    for (const Case& c : cases) {
      if (small_grid() && c.q * c.k > 1'200'000) continue;  // the sanitizers' runs
      Shape s = shape_of(dtype, c.batch, c.q, c.k, c.heads_q, c.heads_kv, c.head_dim);
      s.window = c.window, s.sinks = c.sinks;
      s.strided = rotate++ % 3 == 1;
      expect_matches_oracle(s);
    }
}

// The same schedule on packed varlen batches: blocks past a short sequence's end exit,
// windows cut inside and across sequences, seqused_k.
TEST(CudaMma, WindowScheduleVarlenMatchesOracle) {
  SKIP_WITHOUT_MMA_DEVICE();
  struct Batch {
    std::vector<int64_t> q, k, used;
  };
  const Batch batches[] = {
      {{700, 1, 0, 300, 129}, {700, 5, 64, 300, 129}, {}},
      {{256, 1025, 40}, {512, 1025, 40}, {300, 1000, 40}},
      {{1300, 128, 600}, {900, 128, 700}, {}},
  };
  const Window windows[] = {{100, 0}, {256, 7}, {600, -1}, {1, 1}};
  for (DType dtype : {DType::bf16, DType::f16})
    for (const Batch& batch : batches)
      for (const Window& window : windows) {
        Shape s = shape_of(dtype, 1, 0, 0, 4, 2, 128);
        s.varlen_q = batch.q, s.varlen_k = batch.k, s.seqused_k = batch.used;
        s.window = window;
        s.sinks = window.right == 7;
        expect_matches_oracle(s);
      }
}

// More window shapes through the library's window schedule: windows smaller than a tile and
// larger than a block, right sides 0, > 0 and unbounded, sq != sk both ways, GQA/MQA, several
// batch entries and heads, d 128 and 96 (and 64 beside them, on the grid), sinks, strides;
// varlen batches whose empty and short sequences make blocks that exit at once; and a window
// with softcap, ALiBi and sinks together (the grid kernel). (JOURNEY 3h: these shapes passed
// on the H200 through the persistent schedule that was measured and removed, with its grid
// capped at 1, 3 and 7 CTAs.)
TEST(CudaMma, WindowSizesAndVariantsMatchOracle) {
  SKIP_WITHOUT_MMA_DEVICE();
  struct Case {
    int64_t batch, q, k, heads_q, heads_kv, head_dim;
    Window window;
    bool sinks;
  };
  const Case dense_cases[] = {
      {2, 700, 700, 4, 2, 128, {1, 0}, false},    {3, 520, 520, 3, 1, 128, {17, 0}, true},
      {2, 600, 600, 2, 2, 96, {63, 0}, false},    {1, 900, 900, 4, 4, 128, {100, 0}, false},
      {2, 800, 1100, 4, 2, 128, {37, 5}, false},  {2, 1100, 800, 2, 1, 128, {128, 64}, true},
      {1, 1000, 1000, 3, 3, 96, {200, -1}, false}, {1, 1200, 1200, 2, 1, 128, {1024, 0}, false},
      {4, 257, 129, 2, 2, 128, {0, 0}, false},    {2, 600, 600, 4, 2, 64, {300, 0}, false},
  };
  struct Batch {
    std::vector<int64_t> q, k, used;
  };
  const Batch batches[] = {
      {{300, 0, 1, 129, 700, 0, 2, 256}, {300, 64, 1, 129, 650, 3, 2, 300}, {}},
      {{0, 0, 513, 1, 127, 0}, {5, 0, 600, 9, 127, 40}, {5, 0, 450, 9, 100, 40}},
  };
  const Window varlen_windows[] = {{1, 0}, {100, 0}, {256, 7}};
  int rotate = 0;
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (const Case& c : dense_cases) {
      const int turn = rotate++;
      if (small_grid() && (turn % 3 != 0 || c.q * c.k > 1'000'000)) continue;
      Shape s = shape_of(dtype, c.batch, c.q, c.k, c.heads_q, c.heads_kv, c.head_dim);
      s.window = c.window, s.sinks = c.sinks;
      s.strided = turn % 4 == 1;
      expect_matches_oracle(s);
    }
    for (const Batch& batch : batches)
      for (const Window& window : varlen_windows) {
        Shape s = shape_of(dtype, 1, 0, 0, 4, 2, rotate++ % 2 == 0 ? 128 : 96);
        s.varlen_q = batch.q, s.varlen_k = batch.k, s.seqused_k = batch.used;
        s.window = window;
        s.sinks = window.right == 7;
        expect_matches_oracle(s);
      }
    Shape s = shape_of(dtype, 2, 700, 900, 4, 2, 128);
    s.window = {150, 0}, s.softcap = 30.0f, s.alibi = true, s.sinks = true;
    expect_matches_oracle(s);
  }
}

TEST(CudaMma, AutoPicksMmaForHalfTypesWithVariants) {
  SKIP_WITHOUT_MMA_DEVICE();
  for (DType dtype : {DType::f16, DType::bf16})
    for (bool variant : {false, true}) {
      Shape s = shape_of(dtype, 1, 64, 64, 2, 2, 64);
      if (variant) s.window = {8, 0}, s.softcap = 5.0f, s.alibi = true, s.sinks = true;
      AttentionCase c(s);
      DeviceCase d(c);
      Options o = d.options(c, Backend::automatic);
      EXPECT_EQ(plan(d.q.view, d.k.view, d.v.view, d.out.view, o).backend, kMma) << s.describe();
    }
}

// Bitwise the same over 100 runs, with every feature on.
TEST(CudaMma, DeterministicOver100Runs) {
  SKIP_WITHOUT_MMA_DEVICE();
  Shape s = shape_of(DType::bf16, 2, 257, 300, 4, 2, 128);
  s.window = {100, 20};
  s.softcap = 20.0f;
  s.alibi = true;
  s.sinks = true;
  AttentionCase c(s);
  DeviceCase d(c);
  d.run(c, kMma);
  expect_oracle(c);
  ASSERT_NO_FATAL_FAILURE(testing::assert_runs_repeat_bitwise(c, d, kMma, 100));
}

// The write-up's shape (B=1, H=1, N=1024) cannot fill a large GPU: the backend splits its
// keys by itself (its plan names the partials' workspace), bitwise the same run to run; a
// full batch or FLASHTILE_MMA_SPLITS=1 takes none, and a bad pin is refused.
TEST(CudaMma, SmallCallsSplitTheirKeys) {
  SKIP_WITHOUT_MMA_DEVICE();
  const testing::ScopedEnv unpinned("FLASHTILE_MMA_SPLITS", nullptr);
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  for (int64_t d : {64, 128}) {
    AttentionCase c(shape_of(DType::bf16, 1, 1024, 1024, 1, 1, d));
    DeviceCase dc(c);
    const Plan planned = plan(dc.q.view, dc.k.view, dc.v.view, dc.out.view, dc.options(c, kMma));
    // 8 query blocks of 128 rows against 2 CTAs a SM: split wherever there are 8+ SMs.
    if (sms >= 8) EXPECT_GT(planned.workspace_bytes, 0) << "d=" << d;
    dc.run(c, kMma);
    expect_oracle(c);
    ASSERT_NO_FATAL_FAILURE(testing::assert_runs_repeat_bitwise(c, dc, kMma, small_grid() ? 4 : 20));
    {
      const testing::ScopedEnv never("FLASHTILE_MMA_SPLITS", "1");
      EXPECT_EQ(plan(dc.q.view, dc.k.view, dc.v.view, dc.out.view, dc.options(c, kMma))
                    .workspace_bytes,
                0);
    }
  }
  AttentionCase big(shape_of(DType::bf16, 16, 1024, 1024, 16, 16, 64));
  DeviceCase db(big);
  EXPECT_EQ(plan(db.q.view, db.k.view, db.v.view, db.out.view, db.options(big, kMma))
                .workspace_bytes,
            0);
  testing::expect_bad_split_pins_refused(kMma, "FLASHTILE_MMA_SPLITS");
}

// Split calls on the legacy default stream share one workspace per device (split_kv.cu):
// two host threads calling at once with calls of two sizes each get, every time, what the
// call gives alone, bitwise; a call on a stream of its own still takes the pool.
TEST(CudaMma, SplitCallsFromTwoThreadsShareTheDefaultStreamWorkspace) {
  SKIP_WITHOUT_MMA_DEVICE();
  const testing::ScopedEnv unpinned("FLASHTILE_MMA_SPLITS", nullptr);
  AttentionCase small(shape_of(DType::bf16, 1, 300, 1024, 1, 1, 64));
  AttentionCase large(shape_of(DType::bf16, 1, 1024, 4096, 2, 1, 128));
  DeviceCase ds(small), dl(large);
  const int64_t small_bytes =
      plan(ds.q.view, ds.k.view, ds.v.view, ds.out.view, ds.options(small, kMma)).workspace_bytes;
  const int64_t large_bytes =
      plan(dl.q.view, dl.k.view, dl.v.view, dl.out.view, dl.options(large, kMma)).workspace_bytes;
  if (small_bytes == 0 || large_bytes <= small_bytes)
    GTEST_SKIP() << "this GPU splits neither call, or not into workspaces of two sizes";
  ds.run(small, kMma);
  expect_oracle(small);
  dl.run(large, kMma);
  expect_oracle(large);
  const auto small_out = small.out.bytes, large_out = large.out.bytes;
  const int runs = small_grid() ? 4 : 20;
  int small_mismatches = 0, large_mismatches = 0;
  auto repeat = [&](AttentionCase& c, DeviceCase& d, const decltype(small_out)& expected,
                    int& mismatches) {
    for (int run = 0; run < runs; ++run) {
      d.poison();
      d.run(c, kMma);
      if (c.out.bytes != expected) ++mismatches;
    }
  };
  std::thread first([&] { repeat(small, ds, small_out, small_mismatches); });
  std::thread second([&] { repeat(large, dl, large_out, large_mismatches); });
  first.join();
  second.join();
  EXPECT_EQ(small_mismatches, 0);
  EXPECT_EQ(large_mismatches, 0);
  cudaStream_t own = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), cudaSuccess);
  Options o = dl.options(large, kMma);
  o.stream = own;
  dl.poison();
  forward(dl.q.view, dl.k.view, dl.v.view, dl.out.view, o);
  ASSERT_EQ(cudaStreamSynchronize(own), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(own), cudaSuccess);
  dl.copy_back(large);
  EXPECT_EQ(large.out.bytes, large_out);
}

// Rows that do not start on 16 bytes are served with narrower accesses: pointers offset by
// 2, 4 and 8 bytes (one per tensor in turn), odd strides (odd head dims, padded rows).
TEST(CudaMma, MisalignedPointersAndStridesAreServed) {
  SKIP_WITHOUT_MMA_DEVICE();
  struct Layout {
    int64_t head_dim;
    bool strided;
    size_t q_off, k_off, v_off, o_off;  // bytes
  };
  const Layout layouts[] = {
      {64, false, 2, 0, 0, 0},  {64, false, 0, 4, 0, 0},  {64, true, 0, 0, 8, 0},
      {64, false, 0, 0, 0, 6},  {128, true, 2, 4, 8, 2}, {13, true, 0, 0, 0, 0},
      {13, false, 2, 2, 2, 2},  {36, false, 8, 8, 8, 8}, {250, true, 4, 0, 2, 0},
  };
  for (const Layout& l : layouts)
    for (bool variant : {false, true}) {
      Shape s = shape_of(DType::bf16, 2, 70, 150, 4, 2, l.head_dim);
      s.strided = l.strided;
      s.causal = true;
      if (variant) s.window = {40, 0}, s.softcap = 6.0f, s.alibi = true, s.sinks = true;
      AttentionCase c(s);
      DeviceCase d(c);  // for the slopes, sinks and the LSE buffer
      OffsetDeviceTensor q(c.q, l.q_off), k(c.k, l.k_off), v(c.v, l.v_off), out(c.out, l.o_off);
      out.buffer.fill_bytes(0xFF);
      forward(q.view, k.view, v.view, out.view, d.options(c, kMma));
      cuda_synchronize(0);
      out.copy_back(c.out);
      d.lse.copy_to_host(c.lse.data(), c.lse.size() * sizeof(float));
      SCOPED_TRACE("offsets q/k/v/out " + std::to_string(l.q_off) + "/" + std::to_string(l.k_off) +
                   "/" + std::to_string(l.v_off) + "/" + std::to_string(l.o_off));
      expect_oracle(c);
    }
}

void expect_refused(const TensorView& q, const TensorView& k, const TensorView& v,
                    testing::DeviceTensor& out, const std::string& message_part) {
  for (Backend backend : {kMma, Backend::automatic})
    testing::expect_refused(q, k, v, out, backend, ErrorKind::unsupported, message_part);
}

// What is left to refuse: elements at odd addresses (a 16-bit load cannot be issued there).
TEST(CudaMma, RefusesOddAddressesAndLeavesOutUntouched) {
  SKIP_WITHOUT_MMA_DEVICE();
  Shape s = shape_of(DType::bf16, 1, 17, 17, 1, 1, 64);
  AttentionCase c(s);
  DeviceCase d(c);
  // q starts one byte into its buffer: 16 rows fit behind it.
  TensorView q = d.q.view;
  q.data = static_cast<unsigned char*>(q.data) + 1;
  q.shape[1] = 16;
  testing::DeviceTensor out16(c.out);
  out16.view.shape[1] = 16;
  expect_refused(q, d.k.view, d.v.view, out16, "q.data is at an odd address");
}

TEST(CudaMma, RefusesFloat32AndHeadDimsAbove256) {
  SKIP_WITHOUT_MMA_DEVICE();
  struct Bad {
    DType dtype;
    int64_t head_dim;
    const char* message;
  };
  for (const Bad& bad : {Bad{DType::f32, 64, "float16 and bfloat16; got float32"},
                         Bad{DType::f16, 264, "head_dim 1 to 256; got 264"}}) {
    Shape s;
    s.dtype = bad.dtype;
    s.head_dim = bad.head_dim;
    AttentionCase c(s);
    DeviceCase d(c);
    Options o;
    o.backend = kMma;
    try {
      forward(d.q.view, d.k.view, d.v.view, d.out.view, o);
      ADD_FAILURE() << "accepted " << s.describe();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::unsupported);
      EXPECT_NE(std::string(e.what()).find(bad.message), std::string::npos) << e.what();
    }
  }
}

TEST(CudaMma, OffsetsBeyond2Pow31Elements) {
  SKIP_WITHOUT_MMA_DEVICE();
  testing::expect_offsets_beyond_2pow31_match_oracle(kMma);
}

}  // namespace
}  // namespace flashtile
