// cuda_sm90 (Hopper wgmma, fp16/bf16, sm_90a) against the double-precision oracle with
// FlashAttention's error rule, in the style and on the grid of test_cuda_mma.cpp: first the
// kernel's own pieces (shared-memory layout, descriptors, fragment maps) through single
// wgmma products of known matrices, then the dense grid, the masks, sinks and varlen
// batches it serves, determinism, > 2^31-element tensors, and the refusals (which `auto`
// answers with cuda_mma). Every test skips without an sm_90 device (CI).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
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
#if FLASHTILE_WITH_SM90
#include "cuda/04_sm90/sm90.hpp"
#endif

namespace flashtile {
namespace {

using testing::AttentionCase;
using testing::DeviceCase;
using testing::Shape;
using testing::shape_of;

constexpr Backend kSm90 = Backend::cuda_sm90;

#define SKIP_WITHOUT_SM90_DEVICE() FLASHTILE_SKIP_WITHOUT_BACKEND(kSm90)

using testing::small_grid;

void expect_oracle(const AttentionCase& c, std::optional<float> scale = std::nullopt) {
  const Verification verdict = testing::verify_case(c, scale);
  EXPECT_TRUE(testing::matches_oracle(c, verdict)) << c.shape.describe();
}

void expect_matches_oracle(const Shape& shape, std::optional<float> scale = std::nullopt) {
  AttentionCase c(shape);
  DeviceCase d(c);
  Options o = d.options(c, kSm90);
  o.scale = scale;
  d.run(c, o);
  expect_oracle(c, scale);
}

// ---- the pieces: one wgmma product of known matrices ------------------------------------

#if FLASHTILE_WITH_SM90
// Row-major matrices of small multiples of 1/4: exact in fp16 and bf16, and every product
// sum below exact in fp32, so the device result must equal the host product bit for bit.
std::vector<float> quarter_matrix(int rows, int cols, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(-8, 8);
  std::vector<float> m(size_t(rows) * cols);
  for (float& x : m) x = 0.25f * static_cast<float>(dist(gen));
  return m;
}

// Reports the first few elements that differ with their (row, col), so a wrong register
// map (rows swapped, columns of one chunk shifted) can be read off the failure.
void expect_equal_matrix(const std::vector<float>& got, const std::vector<double>& want,
                         int cols, const std::string& what) {
  int wrong = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i] && wrong++ < 6)
      ADD_FAILURE() << what << ": (" << i / cols << ", " << i % cols << ") got " << got[i]
                    << ", want " << want[i];
  EXPECT_EQ(wrong, 0) << what << ": " << wrong << " of " << want.size() << " elements differ";
}

constexpr int kRows = 64, kKeys = 128;  // the probes' M and key count (sm90.hpp)

TEST(Sm90Pieces, QKProductMatchesHost) {
  SKIP_WITHOUT_SM90_DEVICE();
  for (bool bf16 : {true, false})
    for (int d : {64, 128, 256}) {
      const std::vector<float> a = quarter_matrix(kRows, d, 1 + d), b = quarter_matrix(kKeys, d, 2 + d);
      std::vector<double> want(size_t(kRows) * kKeys, 0.0);
      for (int i = 0; i < kRows; ++i)
        for (int j = 0; j < kKeys; ++j)
          for (int k = 0; k < d; ++k) want[i * kKeys + j] += double(a[i * d + k]) * b[j * d + k];
      expect_equal_matrix(detail::sm90::probe_qk(bf16, d, a, b), want, kKeys,
                          std::string(bf16 ? "bf16" : "fp16") + " S = A·Bᵀ, d=" + std::to_string(d));
    }
}

TEST(Sm90Pieces, PVProductMatchesHost) {
  SKIP_WITHOUT_SM90_DEVICE();
  for (bool bf16 : {true, false})
    for (int d : {64, 128, 256}) {
      const std::vector<float> p = quarter_matrix(kRows, kKeys, 3 + d), v = quarter_matrix(kKeys, d, 4 + d);
      std::vector<double> want(size_t(kRows) * d, 0.0);
      for (int i = 0; i < kRows; ++i)
        for (int j = 0; j < d; ++j)
          for (int k = 0; k < kKeys; ++k) want[i * d + j] += double(p[i * kKeys + k]) * v[k * d + j];
      expect_equal_matrix(detail::sm90::probe_pv(bf16, d, p, v), want, d,
                          std::string(bf16 ? "bf16" : "fp16") + " O = P·V, d=" + std::to_string(d));
    }
}
#endif

// ---- attention against the oracle --------------------------------------------------------

// Pins the kernel's pipeline for one scope (FLASHTILE_SM90_PIPELINE, read at each call):
// "tma_persistent" (step 4.6; unpinned, d=256 full calls from 4k), "tma_ping_pong" (step 4.5),
// "tma_ws_overlap" (4.4), "tma_ws" (4.3, what most d=64 dense calls take unpinned:
// launch_sm90_forward in kernel.cuh), "tma" (4.2) or "cp_async" (4.1, what varlen calls
// take), or a 192-row one of step 4.7 (d=64 only). A TMA pipeline fails a call whose maps
// cannot be encoded, so a passing test ran on the pipeline it names. The scope restores what was set before it, so a run pinned
// from outside (FLASHTILE_SM90_PIPELINE=tma_persistent flashtile_cuda_sm90_tests) stays
// pinned in the tests that do not pin.
struct ScopedPipeline : testing::ScopedEnv {
  explicit ScopedPipeline(const char* name) : ScopedEnv("FLASHTILE_SM90_PIPELINE", name) {}
};
constexpr const char* kPipelines[] = {"tma_persistent", "tma_ping_pong", "tma_ws_overlap",
                                      "tma_ws", "tma", "cp_async"};
// Step 4.7: three consumer warpgroups (192 query rows a CTA), d=64 only; other head dims
// refuse them when pinned (CudaSm90BlockM192.RefusesOtherHeadDimsAndVarlen).
constexpr const char* kBlockM192Pipelines[] = {"tma_ws_m192", "tma_ws_overlap_m192",
                                               "tma_ping_pong_m192"};
// Every pipeline pinned with the head dims it serves.
struct PinnedPipeline {
  const char* name;
  std::vector<int64_t> head_dims;
};
std::vector<PinnedPipeline> every_pipeline() {
  std::vector<PinnedPipeline> all;
  for (const char* name : kPipelines) all.push_back({name, {64, 128, 256}});
  for (const char* name : kBlockM192Pipelines) all.push_back({name, {64}});
  return all;
}

class CudaSm90Grid : public ::testing::TestWithParam<DType> {};

// Seqlens 1, 17, 113, 127, 128, 129, 1023, 1025 with seqlen_q != seqlen_k both ways, causal
// or not, MHA/GQA/MQA, strided views, at every head dim served: on the pipeline dense calls take,
// then on each pipeline pinned.
TEST_P(CudaSm90Grid, MatchesOracle) {
  SKIP_WITHOUT_SM90_DEVICE();
  for (const Shape& s : testing::backend_grid({64, 128, 256}, GetParam(), !small_grid()))
    expect_matches_oracle(s);
}

TEST_P(CudaSm90Grid, EveryPipelineMatchesOracle) {
  SKIP_WITHOUT_SM90_DEVICE();
  for (const PinnedPipeline& pipeline : every_pipeline()) {
    SCOPED_TRACE(pipeline.name);
    const ScopedPipeline pinned(pipeline.name);
    for (const Shape& s : testing::backend_grid(pipeline.head_dims, GetParam(), !small_grid()))
      expect_matches_oracle(s);
    for (int64_t d : pipeline.head_dims) {  // the pipeline's softcap/ALiBi kernel
      Shape s = shape_of(GetParam(), 2, 129, 300, 4, 2, d);
      s.causal = true, s.softcap = 20.0f, s.alibi = true;
      expect_matches_oracle(s);
    }
  }
}

// Split-KV (step 4.10) pinned by FLASHTILE_SM90_SPLITS: never, 3 (uneven shares), 16 (many
// empty ones), on the pipelines that split (4.3-4.5 and 4.7's 192-row ones) and unpinned,
// where d=256 full from 4k (4.6, persistent) takes 4.4 once split; a pinned pipeline that
// does not split (4.1, 4.2, 4.6) runs the call whole.
TEST_P(CudaSm90Grid, SplitKvMatchesOracle) {
  SKIP_WITHOUT_SM90_DEVICE();
  // "": unpinned; then those that split (4.3-4.5, 4.7) and one that does not (4.2).
  const std::vector<PinnedPipeline> pipelines = {
      {"", {64, 128, 256}},      {"tma_ws", {128}},           {"tma_ws_overlap", {256}},
      {"tma_ping_pong", {64}},   {"tma_ws_m192", {64}},       {"tma_ws_overlap_m192", {64}},
      {"tma_ping_pong_m192", {64}}, {"tma", {128}}};
  for (const char* splits : {"1", "3", "16"})
    for (const PinnedPipeline& pipeline : pipelines) {
      // Unsplit, a pinned pipeline is what EveryPipelineMatchesOracle runs.
      if (*pipeline.name && std::string(splits) == "1") continue;
      SCOPED_TRACE(std::string("splits ") + splits + ", pipeline " +
                   (*pipeline.name ? pipeline.name : "unpinned"));
      const testing::ScopedEnv pinned_splits("FLASHTILE_SM90_SPLITS", splits);
      const testing::ScopedEnv pinned_pipeline("FLASHTILE_SM90_PIPELINE",
                                               *pipeline.name ? pipeline.name : nullptr);
      // The unpinned run takes the variants; each pinned pipeline the dense shapes.
      for (const Shape& s :
           testing::split_kv_shapes(GetParam(), pipeline.head_dims, !*pipeline.name))
        expect_matches_oracle(s);
    }
  const testing::ScopedEnv unpinned("FLASHTILE_SM90_SPLITS", nullptr);
  expect_matches_oracle(shape_of(GetParam(), 1, 4096, 4096, 1, 1, 256));  // 4.6 -> 4.4 split
}

// The write-up's shape (B=1, H=1, N=1024) splits by itself (its plan names the workspace),
// bitwise the same run to run; FLASHTILE_SM90_SPLITS=1 takes none; a bad pin is refused.
TEST(CudaSm90, SmallCallsSplitTheirKeys) {
  SKIP_WITHOUT_SM90_DEVICE();
  const testing::ScopedEnv unpinned("FLASHTILE_SM90_SPLITS", nullptr);
  for (int64_t d : {64, 128, 256}) {
    AttentionCase c(shape_of(DType::bf16, 1, 1024, 1024, 1, 1, d));
    DeviceCase dc(c);
    EXPECT_GT(plan(dc.q.view, dc.k.view, dc.v.view, dc.out.view, dc.options(c, kSm90))
                  .workspace_bytes,
              0)
        << "d=" << d;
    dc.run(c, kSm90);
    expect_oracle(c);
    // 4 repeats under compute-sanitizer (FLASHTILE_SMALL_GRID), where 20 took 2.5 minutes.
    ASSERT_NO_FATAL_FAILURE(testing::assert_runs_repeat_bitwise(c, dc, kSm90, small_grid() ? 4 : 20));
    const testing::ScopedEnv never("FLASHTILE_SM90_SPLITS", "1");
    EXPECT_EQ(plan(dc.q.view, dc.k.view, dc.v.view, dc.out.view, dc.options(c, kSm90))
                  .workspace_bytes,
              0);
  }
  testing::expect_bad_split_pins_refused(kSm90, "FLASHTILE_SM90_SPLITS");
}

// Every variant, over lengths that put window edges, the diagonal and the end of K inside
// tiles (sq != sk both ways), GQA/MQA and strides, at every head dim.
TEST_P(CudaSm90Grid, VariantsMatchOracle) {
  SKIP_WITHOUT_SM90_DEVICE();
  struct Feature {
    Window window;
    bool causal = false;
    float softcap = 0;
    bool alibi = false, alibi_per_batch = false, sinks = false;
  };
  const Feature features[] = {
      {{16, 0}},                  // sliding window, causal-like
      {{0, 0}},                   // the diagonal only
      {{5, 7}},                   // both sides bounded
      {{-1, 3}},                  // right side only
      {{40, -1}},                 // left side only (first rows heaviest)
      {{70, 0}, true},            // causal + left window
      {{}, false, 0, false, false, true},        // sinks
      {{}, true, 0, false, false, true},         // causal + sinks (empty rows when sq > sk)
      {{33, 9}, false, 0, false, false, true},   // window + sinks
      {{}, false, 5.0f},                         // softcap
      {{}, true, 30.0f},                         // causal + softcap
      {{}, false, 0, true},                      // ALiBi (heads)
      {{}, true, 0, true, true},                 // causal + ALiBi (batch, heads)
      {{}, false, 20.0f, true},                  // softcap + ALiBi
      {{33, 9}, false, 0, true, false, true},    // window + ALiBi + sinks
      {{64, 0}, false, 12.0f, true, true, true}, // everything
  };
  const std::vector<testing::Lengths> lengths = testing::variant_lengths(!small_grid());
  int rotate = 0;
  for (const Feature& f : features)
    for (const testing::Lengths& len : lengths) {
      constexpr int64_t kHeadDims[] = {64, 128, 256};
      Shape s = shape_of(GetParam(), 2, len.q, len.k, 4, 2, kHeadDims[rotate % 3]);
      s.strided = rotate % 3 == 1;
      if (rotate % 5 == 2) s.heads_kv = 1;  // MQA
      ++rotate;
      s.window = f.window;
      s.causal = f.causal;
      s.softcap = f.softcap;
      s.alibi = f.alibi;
      s.alibi_per_batch = f.alibi_per_batch;
      s.sinks = f.sinks;
      expect_matches_oracle(s);
    }
}

// Packed varlen batches: empty sequences, length-1 sequences, sq != sk per sequence,
// seqused_k, with masks and sinks aligned per sequence.
TEST_P(CudaSm90Grid, VarlenMatchesOracle) {
  SKIP_WITHOUT_SM90_DEVICE();
  struct Variant {
    bool causal;
    Window window;
    bool sinks;
    float softcap = 0;
    bool alibi = false;
  };
  const Variant variants[] = {{false, {}, false},
                              {true, {}, false},
                              {false, {20, 3}, true},
                              {true, {}, false, 10.0f, true}};  // slopes per (sequence, head)
  for (const testing::VarlenBatch& batch : testing::varlen_batches())
    for (const Variant& v : variants)
      for (int64_t d : {64, 128, 256}) {
        Shape s = shape_of(GetParam(), 1, 0, 0, 4, 2, d);
        s.varlen_q = batch.q, s.varlen_k = batch.k, s.seqused_k = batch.used;
        s.causal = v.causal, s.window = v.window, s.sinks = v.sinks;
        s.softcap = v.softcap, s.alibi = s.alibi_per_batch = v.alibi;
        s.strided = d == 128;
        expect_matches_oracle(s);
      }
}

// Whole query blocks that see no key (sequences with no keys, causal rows above a short
// K): no tile runs, so the epilogue follows Q's copies directly. It stages O over Q's rows,
// and once read Q's copies in place of zeros (a race: 3 of 2000 random draws in `flashtile
// check`), so every run is checked, not only the first.
TEST_P(CudaSm90Grid, BlocksThatSeeNoKeyWriteZerosOnEveryRun) {
  SKIP_WITHOUT_SM90_DEVICE();
  for (int64_t d : {64, 128})
    for (bool causal : {false, true}) {
      Shape s = shape_of(GetParam(), 1, 0, 0, 6, 2, d);
      s.varlen_q = {300, 17, 229, 200}, s.varlen_k = {0, 0, 123, 5};
      s.causal = causal;
      AttentionCase c(s);
      DeviceCase dev(c);
      dev.run(c, kSm90);
      expect_oracle(c);
      testing::assert_runs_repeat_bitwise(c, dev, kSm90, small_grid() ? 3 : 50);  // sanitizers: 3
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaSm90Grid, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CudaSm90, ScaleOfAnySign) {
  SKIP_WITHOUT_SM90_DEVICE();
  for (const PinnedPipeline& pipeline : every_pipeline()) {  // d=64: every pipeline serves it
    SCOPED_TRACE(pipeline.name);
    const ScopedPipeline pinned(pipeline.name);
    for (float scale : {-0.37f, 0.0f, 1.5f})
      for (bool causal : {false, true})
        for (bool transformed : {false, true}) {
          Shape s = shape_of(DType::f16, 1, 100, 150, 2, 1, 64);
          s.causal = causal;
          if (transformed) s.softcap = 4.0f, s.alibi = true;  // the scale inside the transform
          expect_matches_oracle(s, scale);
        }
  }
}

// Many tiles through the ring (every pipeline), the longest causal blocks, and a sliding
// window that skips most of them.
TEST(CudaSm90, LongerSequences) {
  SKIP_WITHOUT_SM90_DEVICE();
  for (const PinnedPipeline& pipeline : every_pipeline()) {
    SCOPED_TRACE(pipeline.name);
    const ScopedPipeline pinned(pipeline.name);
    for (int64_t d : pipeline.head_dims)
      for (int mask = 0; mask < 3; ++mask) {
        Shape s = shape_of(DType::bf16, 1, 2000, 2100, 2, 2, d);
        s.causal = mask == 1;
        if (mask == 2) s.window = {300, 0};
        expect_matches_oracle(s);
      }
  }
}

// Masked dense calls on the warp-specialised pipelines (4.3-4.5) list the grid's blocks in
// groups of heads, heaviest first inside each, at d=128 and 256 (CtaWork::grid_item, JOURNEY
// 4.9; d=64, here 4.3 and the 192-row 4.7, keeps the plain grid, checked on the same
// shapes). 3 batch entries x 5 heads: with 1100 queries (9 blocks of 128) a 132-SM H200
// groups 14 heads, so the 15 (batch, head) pairs end in a partial group (14 + 1); causal with
// sq != sk both ways and a left-only window (first rows heaviest). Every block must be
// computed once, for its own (batch, head). The small grid (sanitizers) keeps 300 queries:
// one group, ranks interleaved across the heads.
TEST(CudaSm90, GroupedMaskedGridComputesEveryBlock) {
  SKIP_WITHOUT_SM90_DEVICE();
  const int64_t sq = small_grid() ? 300 : 1100;
  struct Pin {
    const char* name;
    std::vector<int64_t> head_dims;
  };
  const Pin pins[] = {{"tma_ws", {64, 128}},        {"tma_ws_overlap", {128, 256}},
                      {"tma_ping_pong", {128}},     {"tma_ws_m192", {64}},
                      {"tma_ping_pong_m192", {64}}};
  for (const Pin& pin : pins) {
    const ScopedPipeline pinned(pin.name);
    for (int64_t d : pin.head_dims)
      for (int mask = 0; mask < 3; ++mask) {
        SCOPED_TRACE(std::string(pin.name) + ", d=" + std::to_string(d) + ", mask " +
                     std::to_string(mask));
        Shape s = shape_of(DType::bf16, 3, sq, mask == 1 ? sq + 300 : mask == 2 ? sq - 200 : sq,
                           5, 5, d);
        if (mask == 0) s.window = {200, -1};
        else s.causal = true;
        s.strided = mask == 2;
        expect_matches_oracle(s);
      }
  }
}

// Bitwise the same over 100 runs, with a window and sinks on, on each pipeline (the
// 192-row ones at d=64, the only head dim they serve).
TEST(CudaSm90, DeterministicOver100Runs) {
  SKIP_WITHOUT_SM90_DEVICE();
  for (const PinnedPipeline& pipeline : every_pipeline())
    for (int64_t head_dim : pipeline.head_dims.size() == 1 ? std::vector<int64_t>{64}
                                                           : std::vector<int64_t>{128, 256}) {
      SCOPED_TRACE(std::string(pipeline.name) + ", d=" + std::to_string(head_dim));
      const ScopedPipeline pinned(pipeline.name);
      Shape s = shape_of(DType::bf16, 2, 257, 300, 4, 2, head_dim);
      s.window = {100, 20};
      s.sinks = true;
      AttentionCase c(s);
      DeviceCase d(c);
      d.run(c, kSm90);
      expect_oracle(c);
      ASSERT_NO_FATAL_FAILURE(testing::assert_runs_repeat_bitwise(c, d, kSm90, 100));
    }
}

// ---- step 4.7: three consumer warpgroups, 192 query rows a CTA (d=64) ---------------------

// Query lengths around the 192-row block and key lengths around the 128-key tile (a last
// block or tile partial or one row / key long), sq != sk both ways under the causal mask (the
// diagonal crosses the 192-row block at a 64-key offset), MHA, GQA and MQA, strided views,
// both dtypes, on each 192-row pipeline.
TEST(CudaSm90BlockM192, LengthsAroundTheTilesMatchOracle) {
  SKIP_WITHOUT_SM90_DEVICE();
  struct Heads {
    int64_t q, kv;
  };
  const Heads heads[] = {{2, 2}, {4, 2}, {3, 1}};
  for (const char* pipeline : kBlockM192Pipelines) {
    SCOPED_TRACE(pipeline);
    const ScopedPipeline pinned(pipeline);
    int variant = 0;
    for (int64_t sq : {1, 64, 191, 192, 193, 385, 577})
      for (int64_t sk : {1, 127, 129, 300, 1000}) {
        const Heads& h = heads[variant % 3];
        Shape s = shape_of(variant % 2 ? DType::f16 : DType::bf16, 1 + variant % 2, sq, sk, h.q, h.kv, 64);
        s.causal = variant % 4 < 2;
        s.strided = variant % 5 == 1;
        ++variant;
        expect_matches_oracle(s);
      }
  }
}

// The variants through the 192-row kernels: windows (both sides, the diagonal only), sinks
// with causal rows above a short K (rows with no key), softcap and ALiBi (the transformed
// kernel), everything at once.
TEST(CudaSm90BlockM192, VariantsMatchOracle) {
  SKIP_WITHOUT_SM90_DEVICE();
  for (const char* pipeline : kBlockM192Pipelines) {
    SCOPED_TRACE(pipeline);
    const ScopedPipeline pinned(pipeline);
    for (int v = 0; v < 5; ++v) {
      Shape s = shape_of(v % 2 ? DType::f16 : DType::bf16, 2, 400, v == 1 ? 150 : 530, 4, 2, 64);
      switch (v) {
        case 0: s.window = {33, 9}, s.sinks = true; break;
        case 1: s.causal = true, s.sinks = true; break;  // sq > sk: the first rows see no key
        case 2: s.window = {0, 0}; break;
        case 3: s.causal = true, s.softcap = 30.0f, s.alibi = true, s.alibi_per_batch = true; break;
        case 4: s.window = {64, 0}, s.softcap = 12.0f, s.alibi = true, s.sinks = true, s.strided = true; break;
      }
      expect_matches_oracle(s);
    }
  }
}

// Pinned, the 192-row pipelines refuse the head dims that have no 192-row configuration
// (128, 256) and varlen batches (no TMA maps), by name, with out untouched.
TEST(CudaSm90BlockM192, RefusesOtherHeadDimsAndVarlen) {
  SKIP_WITHOUT_SM90_DEVICE();
  for (const char* pipeline : kBlockM192Pipelines) {
    SCOPED_TRACE(pipeline);
    const ScopedPipeline pinned(pipeline);
    for (int64_t d : {128, 256, 64}) {
      Shape s = shape_of(DType::bf16, 1, 200, 200, 2, 2, d);
      if (d == 64) {  // a packed batch of two sequences
        s.seqlen_q = s.seqlen_k = 0;
        s.varlen_q = {100, 300};
        s.varlen_k = {100, 300};
      }
      const std::string message = d == 64 ? "TMA maps of this call cannot be encoded"
                                          : "serve head_dim 64; got head_dim " + std::to_string(d);
      AttentionCase c(s);
      DeviceCase dev(c);
      dev.out.buffer.fill_bytes(0xFF);
      try {
        dev.run(c, kSm90);
        ADD_FAILURE() << "a pinned 192-row pipeline ran " << s.describe();
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::unsupported) << e.what();
        EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
      }
      std::vector<unsigned char> bytes(dev.out.buffer.bytes());
      dev.out.buffer.copy_to_host(bytes.data(), bytes.size());
      for (unsigned char byte : bytes) ASSERT_EQ(byte, 0xFF) << "out was written on error";
    }
  }
}

// ---- step 4.6: persistent CTAs, several work items each ---------------------------------

// Dense shapes with at least four work items (batch, head, 128-row query block) per SM, so
// that every persistent CTA runs several back to back even at two CTAs per SM: the producer
// loads the next item's Q (d=64/128 into the second buffer, d=256 after the consumers
// release the only one) and first tiles under the current item, and the ring's phases run on
// across items. 300 query rows: three blocks, the last partial; causal with 100 keys leaves
// block 0 with no key at all (an item with no tile), with 450 keys the diagonal crosses
// tiles.
Shape several_items_per_cta(DType dtype, int64_t seqlen_k, int64_t head_dim, bool causal) {
  int sms = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  constexpr int64_t kSeqlenQ = 300, kHeads = 8, kItemsPerBatch = kHeads * 3;
  const int64_t batch = (4 * int64_t(sms) + kItemsPerBatch - 1) / kItemsPerBatch;
  Shape s = shape_of(dtype, batch, kSeqlenQ, seqlen_k, kHeads, 2, head_dim);
  s.causal = causal;
  return s;
}

TEST(CudaSm90Persistent, CtasRunningSeveralItemsMatchOracle) {
  SKIP_WITHOUT_SM90_DEVICE();
  const ScopedPipeline pinned("tma_persistent");
  int variant = 0;
  for (int64_t d : {64, 128, 256})
    for (int64_t sk : {100, 450})
      for (bool causal : {false, true}) {
        Shape s = several_items_per_cta(variant % 2 ? DType::f16 : DType::bf16, sk, d, causal);
        s.strided = variant % 3 == 1;
        ++variant;
        expect_matches_oracle(s);
      }
  for (int64_t d : {64, 128, 256}) {
    SCOPED_TRACE("d=" + std::to_string(d));
    Shape window = several_items_per_cta(DType::bf16, 450, d, false);  // both sides, sinks
    window.window = {60, 20}, window.sinks = true;
    expect_matches_oracle(window);
    // Q's sign flipped in place, in each buffer in turn.
    expect_matches_oracle(several_items_per_cta(DType::f16, 450, d, true), -0.2f);
    Shape transformed = several_items_per_cta(DType::bf16, 450, d, true);
    transformed.softcap = 15.0f, transformed.alibi = true;
    expect_matches_oracle(transformed);
  }
}

// The static schedule and the per-item accumulation are fixed, so repeated runs agree bit
// for bit, with several items per CTA.
TEST(CudaSm90Persistent, RunsRepeatBitwise) {
  SKIP_WITHOUT_SM90_DEVICE();
  const ScopedPipeline pinned("tma_persistent");
  for (int64_t d : {64, 128, 256})
    for (bool causal : {false, true}) {
      SCOPED_TRACE("d=" + std::to_string(d) + (causal ? " causal" : " full"));
      AttentionCase c(several_items_per_cta(DType::bf16, 450, d, causal));
      DeviceCase dev(c);
      dev.run(c, kSm90);
      expect_oracle(c);
      ASSERT_NO_FATAL_FAILURE(testing::assert_runs_repeat_bitwise(c, dev, kSm90, small_grid() ? 3 : 20));
    }
}

// A grid capped at 3 CTAs (FLASHTILE_SM90_PERSISTENT_CTAS) on shapes of 24 items: 8 per CTA,
// so both Q buffers (d=64/128) and the one of d=256 are refilled several times and the
// ring's laps run across many items, on small shapes (the cheap case for compute-sanitizer:
// racecheck sees the hand-over of each Q buffer from the epilogue to the next TMA load).
TEST(CudaSm90Persistent, ThreeCtasRunEightItemsEach) {
  SKIP_WITHOUT_SM90_DEVICE();
  const ScopedPipeline pinned("tma_persistent");
  const testing::ScopedEnv capped("FLASHTILE_SM90_PERSISTENT_CTAS", "3");
  int variant = 0;
  for (int64_t d : {64, 128, 256})
    for (int64_t sk : {100, 450})
      for (bool causal : {false, true}) {
        Shape s = shape_of(variant % 2 ? DType::f16 : DType::bf16, 2, 300, sk, 4, 2, d);
        s.causal = causal;
        if (variant % 4 == 3) s.softcap = 10.0f, s.alibi = true;
        ++variant;
        AttentionCase c(s);
        DeviceCase dev(c);
        dev.run(c, kSm90);
        expect_oracle(c);
        ASSERT_NO_FATAL_FAILURE(testing::assert_runs_repeat_bitwise(c, dev, kSm90, 3));
      }
  expect_matches_oracle(shape_of(DType::bf16, 2, 300, 450, 4, 2, 128), -0.3f);  // sign flip
}

TEST(CudaSm90Persistent, RefusesABadCtaCap) {
  SKIP_WITHOUT_SM90_DEVICE();
  const ScopedPipeline pinned("tma_persistent");
  const testing::ScopedEnv capped("FLASHTILE_SM90_PERSISTENT_CTAS", "0");
  AttentionCase c(shape_of(DType::bf16, 1, 200, 200, 2, 2, 64));
  DeviceCase d(c);
  d.out.buffer.fill_bytes(0xFF);
  try {
    forward(d.q.view, d.k.view, d.v.view, d.out.view, d.options(c, kSm90));
    ADD_FAILURE() << "a CTA cap of 0 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::invalid_argument) << e.what();
    EXPECT_NE(std::string(e.what()).find("FLASHTILE_SM90_PERSISTENT_CTAS must be a whole number"),
              std::string::npos)
        << e.what();
  }
  std::vector<unsigned char> bytes(d.out.buffer.bytes());
  d.out.buffer.copy_to_host(bytes.data(), bytes.size());
  for (unsigned char byte : bytes) ASSERT_EQ(byte, 0xFF) << "out was written on error";
}

// Varlen batches have no TMA maps, so a pinned persistent pipeline refuses them by name.
TEST(CudaSm90Persistent, RefusesVarlenWhenPinned) {
  SKIP_WITHOUT_SM90_DEVICE();
  const ScopedPipeline pinned("tma_persistent");
  Shape s = shape_of(DType::bf16, 1, 0, 0, 4, 2, 128);
  s.varlen_q = s.varlen_k = {100, 300};
  AttentionCase c(s);
  DeviceCase d(c);
  try {
    d.run(c, kSm90);
    ADD_FAILURE() << "a pinned TMA pipeline ran a varlen batch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TMA maps of this call cannot be encoded"), std::string::npos)
        << e.what();
  }
}

// `auto` takes cuda_sm90 where it was measured faster than cuda_mma (dense bf16 and fp16
// calls from 512 queries and keys at d=64 full, 1024 causal; d=128 from 256 full, 512
// causal; d=256 from 128; every variant from 1024) and keeps cuda_mma elsewhere (shorter
// calls, varlen: slower or not measured against it).
TEST(CudaSm90, AutoPicksCudaSm90WhereMeasuredFaster) {
  SKIP_WITHOUT_SM90_DEVICE();
  struct Row {
    DType dtype;
    int64_t seqlen, head_dim;
    bool causal;
    float softcap;
    Backend expected;
    int64_t window_left = -1;  // with window_right 0 (a sliding window) when >= 0
    bool sinks = false;
  };
  const Row rows[] = {
      {DType::bf16, 1024, 64, false, 0, kSm90},
      {DType::bf16, 1024, 64, true, 0, kSm90},
      {DType::bf16, 512, 64, true, 0, Backend::cuda_mma},  // 0.96-0.97x: cuda_mma keeps it
      {DType::bf16, 512, 64, false, 0, kSm90},
      {DType::f16, 256, 64, false, 0, Backend::cuda_mma},  // 0.90x
      {DType::bf16, 512, 128, true, 0, kSm90},
      {DType::f16, 256, 128, true, 0, Backend::cuda_mma},  // 0.96x
      {DType::bf16, 256, 128, false, 0, kSm90},
      {DType::f16, 128, 128, false, 0, Backend::cuda_mma},  // a tie (1.01-1.02x)
      {DType::bf16, 700, 256, false, 0, kSm90},
      {DType::f16, 128, 256, true, 0, kSm90},
      {DType::bf16, 100, 256, false, 0, Backend::cuda_mma},  // below the measured grid
      {DType::f16, 1024, 128, false, 0, kSm90},
      {DType::bf16, 1024, 128, false, 5.0f, kSm90},
      {DType::f16, 1024, 64, true, 30.0f, kSm90},
      {DType::bf16, 512, 256, false, 5.0f, Backend::cuda_mma},  // variants: measured from 1k
      {DType::bf16, 2048, 64, false, 0, kSm90, 1024},
      {DType::f16, 512, 128, false, 0, Backend::cuda_mma, 256},
      {DType::bf16, 1024, 256, true, 0, kSm90, -1, true},
  };
  for (const Row& row : rows) {
    Shape s = shape_of(row.dtype, 1, row.seqlen, row.seqlen, 2, 2, row.head_dim);
    s.causal = row.causal;
    s.softcap = row.softcap;
    if (row.window_left >= 0) s.window = {row.window_left, 0};
    s.sinks = row.sinks;
    AttentionCase c(s);
    DeviceCase dc(c);
    EXPECT_EQ(plan(dc.q.view, dc.k.view, dc.v.view, dc.out.view, dc.options(c, kSm90)).backend, kSm90);
    EXPECT_EQ(plan(dc.q.view, dc.k.view, dc.v.view, dc.out.view,
                   dc.options(c, Backend::automatic)).backend,
              row.expected)
        << s.describe();
  }
  Shape varlen = shape_of(DType::bf16, 1, 0, 0, 2, 2, 128);
  varlen.varlen_q = varlen.varlen_k = {300, 700};
  AttentionCase c(varlen);
  DeviceCase dc(c);
  EXPECT_EQ(testing::plan_call(dc.q.view, dc.k.view, dc.v.view, dc.out.view,
                               dc.options(c, Backend::automatic), dc.varlen(c))
                .backend,
            Backend::cuda_mma);
}

// What this step refuses, with the reason named, leaving out untouched; `auto` then runs
// the call on cuda_mma.
TEST(CudaSm90, RefusesWhatItDoesNotServeAndLeavesOutUntouched) {
  SKIP_WITHOUT_SM90_DEVICE();
  struct Bad {
    DType dtype;
    int64_t head_dim;
    bool misaligned;
    const char* message;
  };
  const Bad bads[] = {
      {DType::f32, 64, false, "float16 and bfloat16; got float32"},
      {DType::bf16, 96, false, "head_dim 64, 128 and 256; got 96"},
      {DType::bf16, 64, true, "q.data is not 16-byte aligned"},
  };
  for (const Bad& bad : bads) {
    Shape s = shape_of(bad.dtype, 1, 40, 40, 2, 2, bad.head_dim);
    AttentionCase c(s);
    DeviceCase d(c);
    TensorView q = d.q.view;
    if (bad.misaligned) {  // q starts 2 bytes in: 39 rows fit behind it
      q.data = static_cast<unsigned char*>(q.data) + 2;
      q.shape[1] = 39;
    }
    TensorView out = d.out.view;
    if (bad.misaligned) out.shape[1] = 39;
    d.out.buffer.fill_bytes(0xFF);
    try {
      forward(q, d.k.view, d.v.view, out, d.options(c, kSm90));
      ADD_FAILURE() << "cuda_sm90 accepted: " << bad.message;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::unsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad.message), std::string::npos) << e.what();
    }
    std::vector<unsigned char> bytes(d.out.buffer.bytes());
    d.out.buffer.copy_to_host(bytes.data(), bytes.size());
    for (unsigned char byte : bytes) ASSERT_EQ(byte, 0xFF) << "out was written on error";
    if (bad.dtype != DType::f32)  // what cuda_sm90 refuses, auto still serves (cuda_mma)
      EXPECT_EQ(plan(q, d.k.view, d.v.view, out, d.options(c, Backend::automatic)).backend,
                Backend::cuda_mma);
  }
}

TEST(CudaSm90, OffsetsBeyond2Pow31Elements) {
  SKIP_WITHOUT_SM90_DEVICE();
  testing::expect_offsets_beyond_2pow31_match_oracle(kSm90);
}

}  // namespace
}  // namespace flashtile
