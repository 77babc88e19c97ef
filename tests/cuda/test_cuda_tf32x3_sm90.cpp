// cuda_tf32x3's wgmma path (step 2c, sm_90a) against the double-precision oracle with the
// fp32 rule (normwise relative error <= 1e-5), beside the mma.sync kernel on the same inputs
// (FLASHTILE_TF32X3_PATH=mma): the field's shapes at d 64 and 128 (odd lengths, sq != sk,
// causal, GQA/MQA, strides), every variant, varlen, N = 131072 on one head, bitwise
// repeatability, split calls (the combine after the wgmma kernel's partials, 2c.3), and the
// selector's choice. d=128 runs its three schedules
// (FLASHTILE_TF32X3_SM90_SCHEDULE: producer, the default, pingpong and together), which must
// also agree bitwise with each other (same products in the same order). The suite in
// test_cuda_tf32x3.cpp runs the same backend (and so this path, on the default schedule,
// wherever it is chosen). Every test skips without a capable
// device; the wgmma assertions skip on devices other than compute capability 9.0.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "api/params.hpp"
#include "cuda/05_tf32x3/selection.hpp"
#include "support/backend_grid.hpp"
#include "support/device_case.hpp"
#include "support/oracle_check.hpp"
#include "support/scoped_env.hpp"
#include "support/variants.hpp"

namespace flashtile {
namespace {

using detail::Tf32x3Kernel;
using testing::AttentionCase;
using testing::DeviceCase;
using testing::Shape;
using testing::small_grid;

constexpr Backend kTf32x3 = Backend::cuda_tf32x3;

#define SKIP_WITHOUT_TF32X3() FLASHTILE_SKIP_WITHOUT_BACKEND(kTf32x3)

using testing::ScopedEnv;

// Whether the wgmma kernels can run here: built for sm_90a and device 0 is 9.0.
bool wgmma_device() {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess)
    return false;
  return FLASHTILE_WITH_SM90 && major == 9 && minor == 0;
}

#define SKIP_WITHOUT_WGMMA()                                                         \
  do {                                                                               \
    SKIP_WITHOUT_TF32X3();                                                           \
    if (!wgmma_device()) GTEST_SKIP() << "no sm_90a code or device 0 is not 9.0";    \
  } while (0)

// The wgmma path's kernels: d=64's overlapped pipeline and d=128's three schedules.
struct Sm90Kernel {
  int64_t head_dim;
  const char* schedule;  // FLASHTILE_TF32X3_SM90_SCHEDULE (nullptr: unset, the default)
};
constexpr Sm90Kernel kSm90Kernels[] = {
    {64, nullptr}, {128, "together"}, {128, "pingpong"}, {128, "producer"}};
constexpr const char* kScheduleEnv = "FLASHTILE_TF32X3_SM90_SCHEDULE";

std::string describe(const Sm90Kernel& k) {
  return "d=" + std::to_string(k.head_dim) + " schedule=" + (k.schedule ? k.schedule : "(default)");
}

Shape shape_of(int64_t batch, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d) {
  return testing::shape_of(DType::f32, batch, sq, sk, hq, hkv, d);
}

// The kernel the backend picks for c's call on d (the dense call's validated params).
Tf32x3Kernel kernel_for(const AttentionCase& c, const DeviceCase& d) {
  const Options o = d.options(c, kTf32x3);
  const detail::AttentionParams p =
      detail::validate({d.q.view, d.k.view, d.v.view, &d.out.view, nullptr, o});
  return detail::tf32x3_kernel_for(p);
}

// s on the wgmma path (asserted), against the oracle, then `repeats` runs bitwise equal to it.
void expect_wgmma_matches_and_repeats(const Shape& s, int repeats) {
  AttentionCase c(s);
  DeviceCase d(c);
  ASSERT_EQ(kernel_for(c, d), Tf32x3Kernel::wgmma);
  d.run(c, kTf32x3);
  EXPECT_TRUE(testing::matches_oracle(c));
  ASSERT_NO_FATAL_FAILURE(testing::assert_runs_repeat_bitwise(c, d, kTf32x3, repeats));
}

// N = 131072 on one head, d=64, on the wgmma path (asserted; the caller pins the splits):
// sampled rows against the oracle.
void expect_long_sequence_on_one_head() {
  AttentionCase c(shape_of(1, 131072, 131072, 1, 1, 64));
  DeviceCase d(c);
  ASSERT_EQ(kernel_for(c, d), Tf32x3Kernel::wgmma);
  d.run(c, kTf32x3);
  testing::expect_rows_match_oracle(c, {0, 77777, 131071});
}

// Runs c on both kernels (the backend's choice, then the mma.sync kernel pinned), checks
// each against the oracle, and returns the two normwise errors (choice first).
struct PathErrors {
  double chosen = 0, mma = 0;
};
PathErrors run_both_paths(const Shape& s) {
  AttentionCase c(s);
  DeviceCase d(c);
  PathErrors errors;
  d.run(c, kTf32x3);
  const Verification chosen = testing::verify_case(c);
  EXPECT_TRUE(testing::matches_oracle(c, chosen)) << "the backend's choice";
  errors.chosen = chosen.out_error;
  {
    const ScopedEnv mma("FLASHTILE_TF32X3_PATH", "mma");
    d.poison();
    d.run(c, kTf32x3);
    const Verification pinned = testing::verify_case(c);
    EXPECT_TRUE(testing::matches_oracle(c, pinned)) << "mma.sync pinned";
    errors.mma = pinned.out_error;
  }
  return errors;
}

// The field's shapes (fp32, d 64 and 128), unsplit so that the wgmma path serves them:
// lengths inside and across tiles, sq != sk both ways, causal and not, MHA/GQA/MQA, strides.
TEST(CudaTf32x3Sm90, FieldShapesMatchOracleOnBothKernels) {
  SKIP_WITHOUT_WGMMA();
  const ScopedEnv unsplit("FLASHTILE_TF32X3_SPLITS", "1");
  struct Lengths {
    int64_t q, k;
  };
  const std::vector<Lengths> lengths = {{1, 1},     {63, 200},  {129, 129}, {300, 77},
                                        {513, 700}, {700, 513}, {128, 64},  {2, 1500}};
  int rotate = 0;
  double worst = 0;
  for (const Sm90Kernel& kernel : kSm90Kernels)
    for (const Lengths& len : lengths)
      for (bool causal : {false, true}) {
        const ScopedEnv schedule(kScheduleEnv, kernel.schedule);
        SCOPED_TRACE(describe(kernel));
        Shape s = shape_of(rotate % 2 == 0 ? 1 : 2, len.q, len.k, 4, rotate % 3 == 2 ? 1 : 2,
                           kernel.head_dim);
        s.causal = causal;
        s.strided = rotate % 4 == 1;
        ++rotate;
        SCOPED_TRACE(s.describe());
        {
          AttentionCase c(s);
          DeviceCase dc(c);
          if (!s.strided) EXPECT_EQ(kernel_for(c, dc), Tf32x3Kernel::wgmma);
        }
        const PathErrors e = run_both_paths(s);
        worst = std::max(worst, e.chosen);
      }
  std::printf("wgmma path, field shapes: worst normwise error %.3g\n", worst);
}

// Every variant feature and their combinations on the wgmma path (unsplit), each on every
// kernel of kSm90Kernels (the kernel rotates with the lengths: 5 lengths cover all three).
TEST(CudaTf32x3Sm90, VariantsMatchOracle) {
  SKIP_WITHOUT_WGMMA();
  const ScopedEnv unsplit("FLASHTILE_TF32X3_SPLITS", "1");
  const std::vector<testing::Lengths> lengths = testing::variant_lengths(/*large=*/false);  // the field test covers long tiles
  int rotate = 0;
  for (const testing::Variant& f : testing::forward_variants())
    for (const testing::Lengths& len : lengths) {
      const Sm90Kernel& kernel = kSm90Kernels[rotate % 3];
      const ScopedEnv schedule(kScheduleEnv, kernel.schedule);
      Shape s = shape_of(2, len.q, len.k, 4, 2, kernel.head_dim);
      if (rotate % 5 == 2) s.heads_kv = 1;  // MQA
      ++rotate;
      s = testing::with_variant(s, f);
      SCOPED_TRACE(describe(kernel));
      AttentionCase c(s);
      DeviceCase d(c);
      EXPECT_EQ(kernel_for(c, d), Tf32x3Kernel::wgmma) << s.describe();
      d.run(c, kTf32x3);
      EXPECT_TRUE(testing::matches_oracle(c));
    }
}

// Packed varlen batches (empty and length-1 sequences, sq != sk, seqused_k) on the wgmma
// path: the kernel reads every offset through SeqlenInfo, as the mma.sync one.
TEST(CudaTf32x3Sm90, VarlenMatchesOracle) {
  SKIP_WITHOUT_WGMMA();
  const ScopedEnv unsplit("FLASHTILE_TF32X3_SPLITS", "1");
  for (const testing::VarlenBatch& batch : testing::varlen_batches())
    for (const testing::Variant& v : testing::varlen_variants())
      for (const Sm90Kernel& kernel : kSm90Kernels) {
        const ScopedEnv schedule(kScheduleEnv, kernel.schedule);
        SCOPED_TRACE(describe(kernel));
        Shape s = testing::with_variant(shape_of(1, 0, 0, 4, 2, kernel.head_dim), v);
        s.varlen_q = batch.q, s.varlen_k = batch.k, s.seqused_k = batch.used;
        AttentionCase c(s);
        DeviceCase dc(c);
        dc.run(c, kTf32x3);
        EXPECT_TRUE(testing::matches_oracle(c)) << s.describe();
      }
}

// Bitwise repeatable: the kernel has no atomics and a fixed order of every sum.
TEST(CudaTf32x3Sm90, RunsRepeatBitwise) {
  SKIP_WITHOUT_WGMMA();
  const ScopedEnv unsplit("FLASHTILE_TF32X3_SPLITS", "1");
  for (const Sm90Kernel& kernel : kSm90Kernels) {
    const ScopedEnv schedule(kScheduleEnv, kernel.schedule);
    SCOPED_TRACE(describe(kernel));
    const int64_t d = kernel.head_dim;
    Shape s = shape_of(2, 700, 900, 4, 2, d);
    s.causal = d == 128;
    s.softcap = d == 64 ? 20.0f : 0.0f, s.sinks = true;
    ASSERT_NO_FATAL_FAILURE(expect_wgmma_matches_and_repeats(s, small_grid() ? 3 : 20));
  }
}

// N = 131072 on one head, unsplit (1024 query blocks on the wgmma path): O's per-tile sums
// keep the tensor cores' round-toward-zero from growing with the keys.
TEST(CudaTf32x3Sm90, LongSequenceOnOneHead) {
  SKIP_WITHOUT_WGMMA();
  if (small_grid()) GTEST_SKIP() << "too long under compute-sanitizer";
  const ScopedEnv unsplit("FLASHTILE_TF32X3_SPLITS", "1");
  expect_long_sequence_on_one_head();
}

// Which kernel a call gets: the wgmma one for what it covers, the mma.sync one otherwise.
TEST(CudaTf32x3Sm90, SelectorChoosesByCoverage) {
  SKIP_WITHOUT_WGMMA();
  const ScopedEnv unpinned("FLASHTILE_TF32X3_SPLITS", nullptr);
  auto choice = [](const Shape& s) {
    AttentionCase c(s);
    DeviceCase d(c);
    return kernel_for(c, d);
  };
  // The field grid's calls fill the chip unsplit.
  EXPECT_EQ(choice(shape_of(4, 4096, 4096, 32, 32, 64)), Tf32x3Kernel::wgmma);
  EXPECT_EQ(choice(shape_of(1, 16384, 16384, 16, 16, 128)), Tf32x3Kernel::wgmma);
  // Head dims without a wgmma kernel.
  EXPECT_EQ(choice(shape_of(4, 4096, 4096, 32, 32, 96)), Tf32x3Kernel::mma_sync);
  EXPECT_EQ(choice(shape_of(4, 4096, 4096, 32, 32, 32)), Tf32x3Kernel::mma_sync);
  // The write-up's case splits its keys, on the wgmma kernel (2c.3): 8 query blocks of 128
  // rows, 16 splits of one 64-key tile; pinned to unsplit calls only, the mma.sync kernel.
  EXPECT_EQ(choice(shape_of(1, 1024, 1024, 1, 1, 64)), Tf32x3Kernel::wgmma);
  {
    AttentionCase c(shape_of(1, 1024, 1024, 1, 1, 64));
    DeviceCase d(c);
    const Options o = d.options(c, kTf32x3);
    EXPECT_EQ(detail::tf32x3_splits_for(
                  detail::validate({d.q.view, d.k.view, d.v.view, &d.out.view, nullptr, o})),
              16);
  }
  {
    const ScopedEnv unsplit_only("FLASHTILE_TF32X3_PATH", "unsplit");
    EXPECT_EQ(choice(shape_of(1, 1024, 1024, 1, 1, 64)), Tf32x3Kernel::mma_sync);
    EXPECT_EQ(choice(shape_of(4, 4096, 4096, 32, 32, 64)), Tf32x3Kernel::wgmma);
  }
  {
    const ScopedEnv split("FLASHTILE_TF32X3_SPLITS", "3");
    EXPECT_EQ(choice(shape_of(4, 4096, 4096, 32, 32, 64)), Tf32x3Kernel::wgmma);
  }
  {
    const ScopedEnv single("FLASHTILE_TF32X3_MODE", "single");
    EXPECT_EQ(choice(shape_of(4, 4096, 4096, 32, 32, 64)), Tf32x3Kernel::mma_sync);
  }
  {
    const ScopedEnv mma("FLASHTILE_TF32X3_PATH", "mma");
    EXPECT_EQ(choice(shape_of(4, 4096, 4096, 32, 32, 64)), Tf32x3Kernel::mma_sync);
  }
  {
    const ScopedEnv bad("FLASHTILE_TF32X3_PATH", "tensor");
    EXPECT_THROW(choice(shape_of(4, 4096, 4096, 32, 32, 64)), Error);
  }
}

// Split calls on the wgmma path (2c.3; FLASHTILE_TF32X3_SPLITS pins the count): each split's
// partial goes to the split-KV combine. Odd lengths (splits with one tile, empty splits when
// a block sees fewer key tiles than splits), sq != sk both ways, causal, GQA/MQA, strides,
// at d 64 and 128 (both schedules).
TEST(CudaTf32x3Sm90, SplitCallsMatchOracle) {
  SKIP_WITHOUT_WGMMA();
  const std::vector<testing::Lengths> lengths = {{1, 1},     {63, 200}, {129, 129}, {300, 77},
                                                 {513, 700}, {700, 513}, {2, 1500}, {1024, 1024}};
  const char* const split_counts[] = {"2", "3", "5", "16"};
  int rotate = 0;
  for (const Sm90Kernel& kernel : kSm90Kernels)
    for (const testing::Lengths& len : lengths)
      for (bool causal : {false, true}) {
        const char* split_count = split_counts[rotate % 4];
        const ScopedEnv splits("FLASHTILE_TF32X3_SPLITS", split_count);
        const ScopedEnv schedule(kScheduleEnv, kernel.schedule);
        Shape s = shape_of(rotate % 2 == 0 ? 1 : 2, len.q, len.k, 4, rotate % 3 == 2 ? 1 : 2,
                           kernel.head_dim);
        s.causal = causal;
        s.strided = rotate % 4 == 1;
        ++rotate;
        SCOPED_TRACE(describe(kernel) + " splits=" + split_count);
        SCOPED_TRACE(s.describe());
        AttentionCase c(s);
        DeviceCase d(c);
        if (!s.strided) EXPECT_EQ(kernel_for(c, d), Tf32x3Kernel::wgmma);
        d.run(c, kTf32x3);
        EXPECT_TRUE(testing::matches_oracle(c));
      }
}

// Every variant, and packed varlen batches, split on the wgmma path: the NaN rule and the
// sink are applied once by the combine, never by a partial.
TEST(CudaTf32x3Sm90, SplitVariantsAndVarlenMatchOracle) {
  SKIP_WITHOUT_WGMMA();
  const ScopedEnv splits("FLASHTILE_TF32X3_SPLITS", "4");
  int rotate = 0;
  for (const testing::Variant& f : testing::forward_variants())
    for (const testing::Lengths& len : testing::variant_lengths(/*large=*/false)) {
      const Sm90Kernel& kernel = kSm90Kernels[rotate % 3];
      const ScopedEnv schedule(kScheduleEnv, kernel.schedule);
      Shape s = shape_of(2, len.q, len.k, 4, rotate % 5 == 2 ? 1 : 2, kernel.head_dim);
      ++rotate;
      s = testing::with_variant(s, f);
      SCOPED_TRACE(describe(kernel));
      AttentionCase c(s);
      DeviceCase d(c);
      EXPECT_EQ(kernel_for(c, d), Tf32x3Kernel::wgmma) << s.describe();
      d.run(c, kTf32x3);
      EXPECT_TRUE(testing::matches_oracle(c)) << s.describe();
    }
  for (const testing::VarlenBatch& batch : testing::varlen_batches())
    for (const testing::Variant& v : testing::varlen_variants())
      for (const Sm90Kernel& kernel : kSm90Kernels) {
        const ScopedEnv schedule(kScheduleEnv, kernel.schedule);
        SCOPED_TRACE(describe(kernel));
        Shape s = testing::with_variant(shape_of(1, 0, 0, 4, 2, kernel.head_dim), v);
        s.varlen_q = batch.q, s.varlen_k = batch.k, s.seqused_k = batch.used;
        AttentionCase c(s);
        DeviceCase d(c);
        d.run(c, kTf32x3);
        EXPECT_TRUE(testing::matches_oracle(c)) << s.describe();
      }
}

// The write-up's case as the selector plans it (16 splits on the wgmma path), and a split
// call with variants, repeat bitwise: partials and the combine have a fixed order.
TEST(CudaTf32x3Sm90, SplitCallsRepeatBitwise) {
  SKIP_WITHOUT_WGMMA();
  {
    const ScopedEnv unpinned("FLASHTILE_TF32X3_SPLITS", nullptr);
    ASSERT_NO_FATAL_FAILURE(
        expect_wgmma_matches_and_repeats(shape_of(1, 1024, 1024, 1, 1, 64), small_grid() ? 3 : 20));
  }
  const ScopedEnv splits("FLASHTILE_TF32X3_SPLITS", "5");
  for (const Sm90Kernel& kernel : kSm90Kernels) {
    const ScopedEnv schedule(kScheduleEnv, kernel.schedule);
    SCOPED_TRACE(describe(kernel));
    Shape s = shape_of(2, 300, 900, 4, 2, kernel.head_dim);
    s.causal = true, s.softcap = 20.0f, s.sinks = true;
    ASSERT_NO_FATAL_FAILURE(expect_wgmma_matches_and_repeats(s, small_grid() ? 3 : 10));
  }
}

// The d=64 kernel's in-kernel merge (2c.5) against the combine kernel: the same partials
// weighed by the same combine_row, so outputs and LSEs agree bitwise, and both match the
// oracle. The write-up's case as planned, split counts that divide 128 rows, variants (the
// NaN rule and the sink applied once), and a varlen batch whose empty and short sequences
// leave CTAs idle (they still meet the grid barrier).
TEST(CudaTf32x3Sm90, MergeInGridAgreesWithCombineBitwise) {
  SKIP_WITHOUT_WGMMA();
  struct Case {
    Shape shape;
    const char* splits;  // FLASHTILE_TF32X3_SPLITS (nullptr: the selector's)
  };
  std::vector<Case> cases = {{shape_of(1, 1024, 1024, 1, 1, 64), nullptr},
                             {shape_of(1, 200, 3000, 2, 1, 64), "16"},
                             {shape_of(2, 129, 700, 3, 3, 64), "8"}};
  {
    Shape s = shape_of(1, 250, 1100, 4, 2, 64);
    s.causal = true, s.softcap = 15.0f, s.sinks = true;
    cases.push_back({s, "4"});
    Shape w = shape_of(1, 300, 300, 2, 2, 64);
    w.window = {50, 0}, w.alibi = true;
    cases.push_back({w, "2"});
    const testing::VarlenBatch& batch = testing::varlen_batches()[1];  // empty and 1-row ones
    Shape v = testing::with_variant(shape_of(1, 0, 0, 2, 1, 64), testing::varlen_variants().back());
    v.varlen_q = batch.q, v.varlen_k = batch.k, v.seqused_k = batch.used;
    cases.push_back({v, "2"});
  }
  for (const Case& k : cases) {
    SCOPED_TRACE(k.shape.describe() + " splits=" + (k.splits ? k.splits : "(selector)"));
    const ScopedEnv splits("FLASHTILE_TF32X3_SPLITS", k.splits);
    AttentionCase c(k.shape);
    DeviceCase d(c);
    // The validated params of this call, as the backend sees them (varlen too).
    const Options o = d.options(c, kTf32x3);
    const std::optional<Varlen> varlen = d.varlen(c);
    const detail::AttentionParams p = detail::validate(
        {d.q.view, d.k.view, d.v.view, &d.out.view, varlen ? &*varlen : nullptr, o});
    {
      const ScopedEnv merge("FLASHTILE_TF32X3_MERGE", nullptr);
      ASSERT_EQ(detail::tf32x3_kernel_for(p), Tf32x3Kernel::wgmma);
      ASSERT_TRUE(detail::tf32x3_merges_in_grid_for(p));
      d.run(c, kTf32x3);
      EXPECT_TRUE(testing::matches_oracle(c)) << "merged in grid";
    }
    const testing::HostBytes merged_out = c.out.bytes;
    const std::vector<float> merged_lse = c.lse;
    {
      const ScopedEnv merge("FLASHTILE_TF32X3_MERGE", "combine");
      ASSERT_FALSE(detail::tf32x3_merges_in_grid_for(p));
      d.poison();
      d.run(c, kTf32x3);
      EXPECT_TRUE(testing::matches_oracle(c)) << "combine kernel";
    }
    EXPECT_EQ(c.out.bytes, merged_out) << "outputs differ between the merges";
    EXPECT_EQ(std::memcmp(c.lse.data(), merged_lse.data(), c.lse.size() * sizeof(float)), 0)
        << "LSEs differ between the merges";
  }
  // A grid the GPU cannot hold at once keeps the combine kernel (no cooperative launch).
  const ScopedEnv splits("FLASHTILE_TF32X3_SPLITS", "16");
  AttentionCase c(shape_of(4, 1024, 1024, 8, 8, 64));
  DeviceCase d(c);
  const Options o = d.options(c, kTf32x3);
  const detail::AttentionParams p =
      detail::validate({d.q.view, d.k.view, d.v.view, &d.out.view, nullptr, o});
  EXPECT_FALSE(detail::tf32x3_merges_in_grid_for(p));
  // A FLASHTILE_TF32X3_MERGE that names no merge is refused by name, before anything runs.
  AttentionCase small(shape_of(1, 200, 200, 1, 1, 64));
  DeviceCase ds(small);
  const ScopedEnv bad("FLASHTILE_TF32X3_MERGE", "sideways");
  try {
    ds.run(small, kTf32x3);
    ADD_FAILURE() << "no error for FLASHTILE_TF32X3_MERGE=sideways";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("FLASHTILE_TF32X3_MERGE"), std::string::npos) << what;
    EXPECT_NE(what.find("sideways"), std::string::npos) << what;
  }
}

// N = 131072 on one head with its keys split in two on the wgmma path (the selector itself
// does not split it: 1024 query blocks fill the chip), sampled rows against the oracle.
TEST(CudaTf32x3Sm90, LongSequenceSplitOnOneHead) {
  SKIP_WITHOUT_WGMMA();
  if (small_grid()) GTEST_SKIP() << "too long under compute-sanitizer";
  const ScopedEnv splits("FLASHTILE_TF32X3_SPLITS", "2");
  expect_long_sequence_on_one_head();
}

// d=128's three schedules run the same products in the same order on the same plane values,
// so their outputs and LSEs agree bitwise (and all match the oracle): odd lengths, sq != sk
// both ways, causal, GQA and MQA, strides, a variant mix, and a varlen batch.
TEST(CudaTf32x3Sm90, D128SchedulesAgreeBitwise) {
  SKIP_WITHOUT_WGMMA();
  const ScopedEnv unsplit("FLASHTILE_TF32X3_SPLITS", "1");
  std::vector<Shape> shapes;
  for (const testing::Lengths& len :
       std::vector<testing::Lengths>{{1, 33}, {95, 31}, {129, 257}, {300, 77}, {520, 1000}})
    for (bool causal : {false, true}) {
      Shape s = shape_of(2, len.q, len.k, 4, shapes.size() % 3 == 2 ? 1 : 2, 128);
      s.causal = causal;
      s.strided = shapes.size() % 4 == 1;
      shapes.push_back(s);
    }
  {
    Shape s = shape_of(1, 333, 444, 4, 2, 128);
    s.window = {40, 7}, s.softcap = 10.0f, s.alibi = true, s.sinks = true;
    shapes.push_back(s);
    const testing::VarlenBatch& batch = testing::varlen_batches().back();
    Shape v = testing::with_variant(shape_of(1, 0, 0, 4, 2, 128), testing::varlen_variants().back());
    v.varlen_q = batch.q, v.varlen_k = batch.k, v.seqused_k = batch.used;
    shapes.push_back(v);
  }
  if (small_grid())  // (compute-sanitizer) the shortest two and the variant and varlen ones
    shapes.erase(shapes.begin() + 2, shapes.end() - 2);
  for (const Shape& s : shapes) {
    SCOPED_TRACE(s.describe());
    AttentionCase c(s);
    DeviceCase d(c);
    {
      const ScopedEnv schedule(kScheduleEnv, "pingpong");
      if (!s.is_varlen()) ASSERT_EQ(kernel_for(c, d), Tf32x3Kernel::wgmma);  // (dense calls)
      d.run(c, kTf32x3);
      EXPECT_TRUE(testing::matches_oracle(c)) << "pingpong";
    }
    const testing::HostBytes pingpong_out = c.out.bytes;
    const std::vector<float> pingpong_lse = c.lse;
    for (const char* other : {"together", "producer"}) {
      {
        const ScopedEnv schedule(kScheduleEnv, other);
        d.poison();
        d.run(c, kTf32x3);
        EXPECT_TRUE(testing::matches_oracle(c)) << other;
      }
      EXPECT_EQ(c.out.bytes, pingpong_out) << "outputs differ: pingpong and " << other;
      EXPECT_EQ(std::memcmp(c.lse.data(), pingpong_lse.data(), c.lse.size() * sizeof(float)), 0)
          << "LSEs differ: pingpong and " << other;
    }
  }
}

// A FLASHTILE_TF32X3_SM90_SCHEDULE that names no schedule is refused by name, with the values
// it takes and the one given, before anything is written.
TEST(CudaTf32x3Sm90, UnknownScheduleIsRefusedAndWritesNothing) {
  SKIP_WITHOUT_WGMMA();
  const ScopedEnv unsplit("FLASHTILE_TF32X3_SPLITS", "1");
  for (int64_t head_dim : {64, 128}) {
    AttentionCase c(shape_of(1, 200, 200, 2, 2, head_dim));
    DeviceCase d(c);
    ASSERT_EQ(kernel_for(c, d), Tf32x3Kernel::wgmma);
    const ScopedEnv bad(kScheduleEnv, "sideways");
    try {
      d.run(c, kTf32x3);
      ADD_FAILURE() << "no error for FLASHTILE_TF32X3_SM90_SCHEDULE=sideways at d=" << head_dim;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("FLASHTILE_TF32X3_SM90_SCHEDULE"), std::string::npos) << what;
      EXPECT_NE(what.find("\"pingpong\" or \"together\""), std::string::npos) << what;
      EXPECT_NE(what.find("sideways"), std::string::npos) << what;
    }
    d.copy_back(c);
    const testing::HostBytes poisoned(c.out.bytes.size(), 0xFF);
    EXPECT_EQ(c.out.bytes, poisoned) << "the output was written";
  }
}

// The error distribution of the two kernels on the same inputs (for docs/JOURNEY.md).
TEST(CudaTf32x3Sm90, ErrorDistributionBesideMmaSync) {
  SKIP_WITHOUT_WGMMA();
  const ScopedEnv unsplit("FLASHTILE_TF32X3_SPLITS", "1");
  std::vector<double> wgmma, mma;
  for (int64_t d : {64, 128})
    for (int64_t n : {256, 1024})
      for (bool causal : {false, true}) {
        Shape s = shape_of(1, n, n, 4, 2, d);
        s.causal = causal;
        const PathErrors e = run_both_paths(s);
        wgmma.push_back(e.chosen);
        mma.push_back(e.mma);
      }
  auto summary = [](const char* name, std::vector<double> v) {
    std::sort(v.begin(), v.end());
    std::printf("%s: min %.3g median %.3g max %.3g (%zu shapes)\n", name, v.front(),
                v[v.size() / 2], v.back(), v.size());
  };
  summary("wgmma path", wgmma);
  summary("mma.sync path", mma);
}

}  // namespace
}  // namespace flashtile
