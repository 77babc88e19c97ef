// cuda_tf32x3 (fp32 on tensor cores, 3xTF32, sm_80+) against the double-precision oracle
// with the fp32 rule (normwise relative error <= 1e-5): the backend grid, every variant and
// their combinations, packed varlen batches, head dims 1 to 128, unaligned rows, the split-KV
// path forced on and off (bitwise deterministic in both), N = 131072 on one head, the NaN/Inf
// rule, the selector's choice and the refusals. Every test skips without a capable device.
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

namespace flashtile {
namespace {

using testing::AttentionCase;
using testing::DeviceCase;
using testing::Shape;
using testing::small_grid;

constexpr Backend kTf32x3 = Backend::cuda_tf32x3;

#define SKIP_WITHOUT_TF32X3() FLASHTILE_SKIP_WITHOUT_BACKEND(kTf32x3)

// Sets an environment variable for one scope (the backend's knobs are read per call).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Pins the key splits (nullptr: the backend chooses).
ScopedEnv pin_splits(const char* splits) { return ScopedEnv("FLASHTILE_TF32X3_SPLITS", splits); }

Shape shape_of(int64_t batch, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d) {
  Shape s;
  s.dtype = DType::f32;
  s.batch = batch, s.seqlen_q = sq, s.seqlen_k = sk;
  s.heads_q = hq, s.heads_kv = hkv, s.head_dim = d;
  return s;
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
  struct Feature {
    Window window;
    bool causal = false;
    float softcap = 0;
    bool alibi = false, alibi_per_batch = false, sinks = false;
  };
  const Feature features[] = {
      {{16, 0}},  {{0, 0}},  {{5, 7}},  {{-1, 3}},  {{40, -1}},  {{70, 0}, true},
      {{}, false, 5.0f},                          // softcap
      {{}, true, 30.0f},                          // causal + softcap
      {{}, false, 0, true},                       // ALiBi (heads)
      {{}, true, 0, true, true},                  // causal + ALiBi (batch, heads)
      {{}, false, 0, false, false, true},         // sinks
      {{}, true, 0, false, false, true},          // causal + sinks (empty rows when sq > sk)
      {{}, false, 20.0f, true},                   // softcap + ALiBi
      {{33, 9}, false, 0, true, false, true},     // window + ALiBi + sinks
      {{}, true, 8.0f, false, false, true},       // causal + softcap + sinks
      {{64, 0}, false, 12.0f, true, true, true},  // everything
  };
  struct Lengths {
    int64_t q, k;
  };
  std::vector<Lengths> lengths = {{1, 1}, {17, 200}, {200, 17}, {129, 129}, {100, 300}};
  if (!small_grid()) lengths.push_back({700, 513});
  for (const char* splits : kSplitSettings) {
    SCOPED_TRACE(std::string("splits ") + (splits ? splits : "auto"));
    const ScopedEnv pinned = pin_splits(splits);
    int rotate = 0;
    for (const Feature& f : features)
      for (const Lengths& len : lengths) {
        const int64_t head_dims[] = {64, 128, 96, 40};
        Shape s = shape_of(2, len.q, len.k, 4, 2, head_dims[rotate % 4]);
        s.strided = rotate % 3 == 1;
        if (rotate % 5 == 2) s.heads_kv = 1;  // MQA
        ++rotate;
        s.window = f.window, s.causal = f.causal, s.softcap = f.softcap;
        s.alibi = f.alibi, s.alibi_per_batch = f.alibi_per_batch, s.sinks = f.sinks;
        run_and_verify(s);
      }
  }
}

// Packed varlen batches: empty sequences, length-1 sequences, sq != sk, seqused_k.
TEST(CudaTf32x3, VarlenMatchesOracle) {
  SKIP_WITHOUT_TF32X3();
  struct Variant {
    bool causal;
    Window window;
    float softcap;
    bool alibi, sinks;
  };
  const Variant variants[] = {{false, {}, 0, false, false}, {true, {}, 0, false, false},
                              {false, {20, 3}, 0, false, true}, {true, {}, 15.0f, true, true}};
  for (const char* splits : kSplitSettings) {
    SCOPED_TRACE(std::string("splits ") + (splits ? splits : "auto"));
    const ScopedEnv pinned = pin_splits(splits);
    for (const testing::VarlenBatch& batch : testing::varlen_batches())
      for (const Variant& v : variants)
        for (int64_t d : {64, 128}) {
          Shape s = shape_of(1, 0, 0, 4, 2, d);
          s.varlen_q = batch.q, s.varlen_k = batch.k, s.seqused_k = batch.used;
          s.causal = v.causal, s.window = v.window, s.softcap = v.softcap;
          s.alibi = s.alibi_per_batch = v.alibi;
          s.sinks = v.sinks;
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

// A device copy of a host tensor whose data starts `offset_bytes` into its buffer.
struct OffsetDeviceTensor {
  DeviceBuffer buffer;
  TensorView view;
  OffsetDeviceTensor(const testing::HostTensor& host, size_t offset_bytes)
      : buffer(host.bytes.size() + offset_bytes) {
    auto* at = static_cast<unsigned char*>(buffer.data()) + offset_bytes;
    EXPECT_EQ(cudaMemcpy(at, host.bytes.data(), host.bytes.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    view = host.view;
    view.data = at;
    view.device = Device::cuda(0);
  }
  void copy_back(testing::HostTensor& host) const {
    EXPECT_EQ(cudaMemcpy(host.bytes.data(), view.data, host.bytes.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
};

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
  for (const char* splits : {"1", "2", "5", "16"}) {
    SCOPED_TRACE(std::string("splits ") + splits);
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
    const testing::HostBytes first_out = c.out.bytes;
    const std::vector<float> first_lse = c.lse;
    for (int run = 1; run < 20; ++run) {
      d.poison();
      d.run(c, kTf32x3);
      ASSERT_EQ(c.out.bytes, first_out) << "run " << run;
      ASSERT_EQ(std::memcmp(c.lse.data(), first_lse.data(), c.lse.size() * sizeof(float)), 0)
          << "lse, run " << run;
    }
  }
}

// The write-up's case (B=1, H=1, N=1024, d=64): 16 query blocks cannot fill an H200, so the
// backend splits the keys by itself (its plan names a workspace) and still meets the rule.
TEST(CudaTf32x3, WriteUpCaseSplitsOnItsOwn) {
  SKIP_WITHOUT_TF32X3();
  const ScopedEnv unpinned = pin_splits(nullptr);
  Shape s = shape_of(1, 1024, 1024, 1, 1, 64);
  AttentionCase c(s);
  DeviceCase d(c);
  EXPECT_GT(plan(d.q.view, d.k.view, d.v.view, d.out.view, d.options(c, kTf32x3)).workspace_bytes,
            0);
  d.run(c, kTf32x3);
  EXPECT_TRUE(testing::matches_oracle(c));
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
  for (int64_t row : {int64_t(0), int64_t(77777), int64_t(131071)}) {
    TensorView q_rows = c.q.view;
    q_rows.data = static_cast<float*>(c.q.view.data) + row * c.q.view.strides[1];
    q_rows.shape[1] = 1;
    TensorView out_rows = c.out.view;
    out_rows.data = static_cast<float*>(c.out.view.data) + row * c.out.view.strides[1];
    out_rows.shape[1] = 1;
    const Verification check =
        verify_forward(q_rows, c.k.view, c.v.view, out_rows, c.lse.data() + row, Options{});
    EXPECT_TRUE(check.pass()) << "row " << row << ": " << check.out_error << " > "
                              << check.out_bound;
  }
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

void expect_refused(const TensorView& q, const TensorView& k, const TensorView& v,
                    testing::DeviceTensor& out, Backend backend, ErrorKind kind,
                    const std::string& message_part) {
  out.buffer.fill_bytes(0xFF);
  Options o;
  o.backend = backend;
  try {
    forward(q, k, v, out.view, o);
    ADD_FAILURE() << backend_name(backend) << " accepted: " << message_part;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(message_part), std::string::npos) << e.what();
  }
  std::vector<unsigned char> bytes(out.buffer.bytes());
  out.buffer.copy_to_host(bytes.data(), bytes.size());
  for (unsigned char byte : bytes) ASSERT_EQ(byte, 0xFF) << "out was written on error";
}

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
