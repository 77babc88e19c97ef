// cuda_tf32x3 (fp32 on tensor cores, 3xTF32, sm_80+) against the double-precision oracle
// with the fp32 rule (normwise relative error <= 1e-5): the backend grid, every variant and
// their combinations, packed varlen batches, head dims 1 to 128, unaligned rows, the split-KV
// path forced on and off (bitwise deterministic in both), N = 131072 on one head, the NaN/Inf
// rule, the selector's choice and the refusals. Split calls at d 64/128 run the wgmma kernel
// on sm_90a (2c.3); the split tests also run them with FLASHTILE_TF32X3_PATH=unsplit (split
// calls on the mma.sync kernel). Every test skips without a capable device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "support/backend_grid.hpp"
#include "support/device_case.hpp"
#include "support/nonfinite_cases.hpp"
#include "support/oracle_check.hpp"
#include "support/refusal.hpp"
#include "support/scoped_env.hpp"
#include "support/variants.hpp"

namespace flashtile {
namespace {

using testing::AttentionCase;
using testing::DeviceCase;
using testing::OffsetDeviceTensor;
using testing::Shape;
using testing::small_grid;

constexpr Backend kTf32x3 = Backend::cuda_tf32x3;

#define SKIP_WITHOUT_TF32X3() FLASHTILE_SKIP_WITHOUT_BACKEND(kTf32x3)

using testing::ScopedEnv;

// Pins the key splits (nullptr: the backend chooses).
ScopedEnv pin_splits(const char* splits) { return ScopedEnv("FLASHTILE_TF32X3_SPLITS", splits); }

Shape shape_of(int64_t batch, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d) {
  return testing::shape_of(DType::f32, batch, sq, sk, hq, hkv, d);
}

Verification run_and_verify(const Shape& shape, Backend backend = kTf32x3,
                            std::optional<float> scale = std::nullopt) {
  AttentionCase c(shape);
  DeviceCase d(c);
  Options o = d.options(c, backend);
  o.scale = scale;
  d.run(c, o);
  const Verification v = testing::verify_case(c, scale);
  EXPECT_TRUE(testing::matches_oracle(c, v)) << backend_name(backend);
  return v;
}

// The three split settings every correctness test runs under: the backend's choice, never
// split, and split in 3 (uneven shares, some empty on short keys).
const char* const kSplitSettings[] = {nullptr, "1", "3"};

TEST(CudaTf32x3, GridMatchesOracle) {
  SKIP_WITHOUT_TF32X3();
  for (const char* splits : kSplitSettings) {
    SCOPED_TRACE(std::string("splits ") + (splits ? splits : "auto"));
    const ScopedEnv pinned = pin_splits(splits);
    for (const Shape& s : testing::backend_grid({32, 64, 128, 40, 72}, DType::f32, !small_grid()))
      run_and_verify(s);
  }
}

// One variant feature at a time, then combinations, over lengths that put the window edges,
// the diagonal and the end of K inside tiles (sq != sk both ways), GQA/MQA and strides.
TEST(CudaTf32x3, VariantsMatchOracle) {
  SKIP_WITHOUT_TF32X3();
  const std::vector<testing::Lengths> lengths = testing::variant_lengths(!small_grid());
  for (const char* splits : kSplitSettings) {
    SCOPED_TRACE(std::string("splits ") + (splits ? splits : "auto"));
    const ScopedEnv pinned = pin_splits(splits);
    int rotate = 0;
    for (const testing::Variant& f : testing::forward_variants())
      for (const testing::Lengths& len : lengths) {
        const int64_t head_dims[] = {64, 128, 96, 40};
        Shape s = shape_of(2, len.q, len.k, 4, 2, head_dims[rotate % 4]);
        s.strided = rotate % 3 == 1;
        if (rotate % 5 == 2) s.heads_kv = 1;  // MQA
        ++rotate;
        run_and_verify(testing::with_variant(s, f));
      }
  }
}

// Packed varlen batches: empty sequences, length-1 sequences, sq != sk, seqused_k.
TEST(CudaTf32x3, VarlenMatchesOracle) {
  SKIP_WITHOUT_TF32X3();
  for (const char* splits : kSplitSettings) {
    SCOPED_TRACE(std::string("splits ") + (splits ? splits : "auto"));
    const ScopedEnv pinned = pin_splits(splits);
    for (const testing::VarlenBatch& batch : testing::varlen_batches())
      for (const testing::Variant& v : testing::varlen_variants())
        for (int64_t d : {64, 128}) {
          Shape s = testing::with_variant(shape_of(1, 0, 0, 4, 2, d), v);
          s.varlen_q = batch.q, s.varlen_k = batch.k, s.seqused_k = batch.used;
          s.strided = d == 128;
          run_and_verify(s);
        }
  }
}

// Head dims below a specialisation run zero-padded; dims that are not a multiple of 4 (and
// strided rows) take the 4-byte load path.
TEST(CudaTf32x3, EveryHeadDimFrom1To128) {
  SKIP_WITHOUT_TF32X3();
  std::vector<int64_t> dims = {1, 3, 13, 32, 63, 64, 65, 100, 127, 128, 8, 40};
  if (!small_grid())
    for (int64_t d = 2; d <= 128; d += 7) dims.push_back(d);
  int rotate = 0;
  for (int64_t d : dims) {
    Shape s = shape_of(2, 77, 190, 4, 2, d);
    s.causal = rotate % 3 != 0;
    s.strided = rotate % 4 == 1;
    if (rotate % 5 == 3) s.softcap = 10.0f, s.alibi = true, s.sinks = true;
    ++rotate;
    run_and_verify(s);
  }
}

TEST(CudaTf32x3, ScaleOfAnySign) {
  SKIP_WITHOUT_TF32X3();
  for (float scale : {-0.37f, 0.0f, 1.5f})
    for (bool causal : {false, true})
      for (bool transformed : {false, true}) {
        Shape s = shape_of(1, 100, 150, 2, 1, 64);
        s.causal = causal;
        if (transformed) s.softcap = 4.0f, s.alibi = true;
        run_and_verify(s, kTf32x3, scale);
      }
}

TEST(CudaTf32x3, LongerSequences) {
  SKIP_WITHOUT_TF32X3();
  for (int64_t d : {64, 128})
    for (int mask = 0; mask < 3; ++mask) {
      Shape s = shape_of(1, 2000, 2100, 2, 2, d);
      s.causal = mask == 1;
      if (mask == 2) s.window = {300, 0};
      run_and_verify(s);
    }
}

// Rows that do not start on 16 bytes take the 4-byte path (pointers 4, 8, 12 bytes in).
TEST(CudaTf32x3, MisalignedPointersAreServed) {
  SKIP_WITHOUT_TF32X3();
  struct Layout {
    int64_t head_dim;
    bool strided;
    size_t q_off, k_off, v_off, o_off;  // bytes
  };
  const Layout layouts[] = {{64, false, 4, 0, 0, 0}, {64, true, 0, 8, 0, 0},
                            {128, false, 0, 0, 12, 0}, {64, false, 0, 0, 0, 4},
                            {36, true, 4, 8, 12, 4}};
  for (const Layout& l : layouts)
    for (bool variant : {false, true}) {
      Shape s = shape_of(2, 70, 150, 4, 2, l.head_dim);
      s.strided = l.strided;
      s.causal = true;
      if (variant) s.window = {40, 0}, s.softcap = 6.0f, s.alibi = true, s.sinks = true;
      AttentionCase c(s);
      DeviceCase d(c);
      OffsetDeviceTensor q(c.q, l.q_off), k(c.k, l.k_off), v(c.v, l.v_off), out(c.out, l.o_off);
      out.buffer.fill_bytes(0xFF);
      forward(q.view, k.view, v.view, out.view, d.options(c, kTf32x3));
      cuda_synchronize(0);
      out.copy_back(c.out);
      d.lse.copy_to_host(c.lse.data(), c.lse.size() * sizeof(float));
      EXPECT_TRUE(testing::matches_oracle(c)) << "offsets " << l.q_off << "/" << l.k_off << "/"
                                              << l.v_off << "/" << l.o_off;
    }
}

// Split-KV forced on and off: the same answer within the rule, bitwise repeatable in each
// setting, and plan() reports the partials' workspace exactly when the keys are split.
TEST(CudaTf32x3, SplitKvOnAndOffAreDeterministic) {
  SKIP_WITHOUT_TF32X3();
  Shape s = shape_of(2, 257, 700, 4, 2, 64);
  s.window = {300, 20}, s.softcap = 20.0f, s.alibi = true, s.sinks = true;
  for (const char* path : {"auto", "unsplit"})
  for (const char* splits : {"1", "2", "5", "16"}) {
    SCOPED_TRACE(std::string("path ") + path + " splits " + splits);
    const ScopedEnv kernel_path("FLASHTILE_TF32X3_PATH", path);
    const ScopedEnv pinned = pin_splits(splits);
    AttentionCase c(s);
    DeviceCase d(c);
    const Plan planned = plan(d.q.view, d.k.view, d.v.view, d.out.view, d.options(c, kTf32x3));
    EXPECT_EQ(planned.backend, kTf32x3);
    if (std::string(splits) == "1")
      EXPECT_EQ(planned.workspace_bytes, 0);
    else
      EXPECT_GT(planned.workspace_bytes, 0);
    d.run(c, kTf32x3);
    EXPECT_TRUE(testing::matches_oracle(c));
    // 20 repeats; 4 under compute-sanitizer (FLASHTILE_SMALL_GRID), where racecheck's 50-90 s
    // limit cut the 80 runs of the four settings short (H200, both sessions).
    const int repeats = small_grid() ? 4 : 20;
    ASSERT_NO_FATAL_FAILURE(testing::assert_runs_repeat_bitwise(c, d, kTf32x3, repeats));
  }
}

// The write-up's case (B=1, H=1, N=1024, d=64): 16 query blocks cannot fill an H200, so the
// backend splits the keys by itself (its plan names a workspace) and still meets the rule.
TEST(CudaTf32x3, WriteUpCaseSplitsOnItsOwn) {
  SKIP_WITHOUT_TF32X3();
  const ScopedEnv unpinned = pin_splits(nullptr);
  Shape s = shape_of(1, 1024, 1024, 1, 1, 64);
  for (const char* path : {"auto", "unsplit"}) {  // the wgmma kernel's split, mma.sync's
    SCOPED_TRACE(std::string("path ") + path);
    const ScopedEnv kernel_path("FLASHTILE_TF32X3_PATH", path);
    AttentionCase c(s);
    DeviceCase d(c);
    EXPECT_GT(plan(d.q.view, d.k.view, d.v.view, d.out.view, d.options(c, kTf32x3)).workspace_bytes,
              0);
    d.run(c, kTf32x3);
    EXPECT_TRUE(testing::matches_oracle(c));
  }
  // A full batch fills the chip: no split, no workspace.
  Shape big = shape_of(16, 1024, 1024, 16, 16, 64);
  AttentionCase cb(big);
  DeviceCase db(cb);
  EXPECT_EQ(
      plan(db.q.view, db.k.view, db.v.view, db.out.view, db.options(cb, kTf32x3)).workspace_bytes,
      0);
}

// N = 131072 on one head (S would need 64 GiB); sampled rows against the oracle.
TEST(CudaTf32x3, LongSequenceOnOneHead) {
  SKIP_WITHOUT_TF32X3();
  Shape s = shape_of(1, 131072, 131072, 1, 1, 64);
  AttentionCase c(s);
  DeviceCase d(c);
  d.run(c, kTf32x3);
  testing::expect_rows_match_oracle(c, {0, 77777, 131071});
}

// The NaN/Inf rule (docs/VARIANTS.md), split and unsplit: the combine applies it per row.
TEST(CudaTf32x3, NonFiniteValuesFollowTheRule) {
  SKIP_WITHOUT_TF32X3();
  for (const char* splits : {"1", "4"}) {
    const ScopedEnv pinned = pin_splits(splits);
    const std::vector<testing::NonFiniteCase> cases = testing::nonfinite_cases(DType::f32, true);
    ASSERT_FALSE(cases.empty());
    for (const testing::NonFiniteCase& nf : cases) {
      AttentionCase c(nf.shape);
      nf.plant(c);
      DeviceCase d(c);
      d.run(c, kTf32x3);
      EXPECT_TRUE(testing::matches_nonfinite_oracle(c, testing::nonfinite_tolerance(DType::f32),
                                                    nf.expect_nan, nf.spreading_v_channel))
          << nf.name << ", splits " << splits;
    }
  }
}

TEST(CudaTf32x3, AutoPicksItForFloat32) {
  SKIP_WITHOUT_TF32X3();
  for (int64_t d : {32, 64, 128, 100})
    for (bool variant : {false, true}) {
      Shape s = shape_of(1, 64, 64, 2, 2, d);
      if (variant) s.window = {8, 0}, s.softcap = 5.0f, s.alibi = true, s.sinks = true;
      AttentionCase c(s);
      DeviceCase dc(c);
      EXPECT_EQ(plan(dc.q.view, dc.k.view, dc.v.view, dc.out.view,
                     dc.options(c, Backend::automatic)).backend,
                kTf32x3)
          << s.describe();
    }
}

// Error distribution on the fp32 backend grid (docs/JOURNEY.md, step 2b): 3xTF32 beside
// cuda_tiled and beside the single-TF32 opt-in, which must be visibly worse than the split.
TEST(CudaTf32x3, ErrorDistributionBesideCudaTiled) {
  SKIP_WITHOUT_TF32X3();
  struct Errors {
    const char* what;
    std::vector<double> values;
    void print() {
      std::sort(values.begin(), values.end());
      const size_t n = values.size();
      std::printf("[errors] %-22s n=%zu  min %.3g  median %.3g  p90 %.3g  max %.3g\n", what, n,
                  values[0], values[n / 2], values[n * 9 / 10], values[n - 1]);
    }
  };
  Errors split{"cuda_tf32x3 (3xTF32)"}, single{"cuda_tf32x3 single"}, tiled{"cuda_tiled"};
  for (const Shape& s : testing::backend_grid({32, 64, 128}, DType::f32, !small_grid())) {
    if (s.seqlen_q * s.seqlen_k < 1000) continue;  // a handful of keys says nothing of rounding
    split.values.push_back(run_and_verify(s).out_error);
    tiled.values.push_back(run_and_verify(s, Backend::cuda_tiled).out_error);
    const ScopedEnv mode("FLASHTILE_TF32X3_MODE", "single");
    AttentionCase c(s);
    DeviceCase d(c);
    d.run(c, kTf32x3);
    single.values.push_back(testing::verify_case(c).out_error);
  }
  split.print(), single.print(), tiled.print();
  // Plain TF32 keeps 11 significant bits: far above fp32's rule, and the split must remove it.
  EXPECT_GT(single.values.back(), 10 * split.values.back());
  EXPECT_GT(single.values.back(), 1e-5);
}

using testing::expect_refused;

TEST(CudaTf32x3, RefusalsNameTheArgumentAndWriteNothing) {
  SKIP_WITHOUT_TF32X3();
  {
    Shape s = shape_of(1, 17, 17, 1, 1, 64);
    s.dtype = DType::bf16;
    AttentionCase c(s);
    DeviceCase d(c);
    expect_refused(d.q.view, d.k.view, d.v.view, d.out, kTf32x3, ErrorKind::unsupported,
                   "cuda_tf32x3 supports float32; got bfloat16");
  }
  {
    AttentionCase c(shape_of(1, 17, 17, 1, 1, 136));
    DeviceCase d(c);
    expect_refused(d.q.view, d.k.view, d.v.view, d.out, kTf32x3, ErrorKind::unsupported,
                   "head_dim 1 to 128; got 136");
  }
  for (const char* bad : {"0", "17", "two"}) {
    const ScopedEnv pinned = pin_splits(bad);
    AttentionCase c(shape_of(1, 17, 17, 1, 1, 64));
    DeviceCase d(c);
    expect_refused(d.q.view, d.k.view, d.v.view, d.out, kTf32x3, ErrorKind::invalid_argument,
                   "FLASHTILE_TF32X3_SPLITS must be an integer from 1 to 16");
  }
  {
    const ScopedEnv mode("FLASHTILE_TF32X3_MODE", "double");
    AttentionCase c(shape_of(1, 17, 17, 1, 1, 64));
    DeviceCase d(c);
    expect_refused(d.q.view, d.k.view, d.v.view, d.out, kTf32x3, ErrorKind::invalid_argument,
                   "FLASHTILE_TF32X3_MODE must be \"split\" or \"single\"");
  }
}

}  // namespace
}  // namespace flashtile
