// The CUDA backwards, cuda_mma's (mma.sync, fp16/bf16) and cuda_sm90's (wgmma, head dims 64
// and 128), against the double oracle under the rule
// (max|g - oracle| <= 2·max|g_lowprec - oracle| + 1e-4 on dq, dk, dv; dsinks as
// verify_backward states): the backend grid (odd lengths 1..1025, sq != sk both ways,
// MHA/GQA/MQA, strided views), every variant, varlen with empty and length-1 sequences and
// seqused_k, every head dim 1..128 (the aligned and the narrow path), bitwise determinism
// over 100 runs, the atomic mode within the rule over repeated runs, and the refusals
// (nothing written). Each backend's tests skip where it is unavailable (without a CUDA
// device, CI; cuda_sm90 off sm_90).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <optional>
#include <vector>

#include "cpu/backward_case.hpp"
#include "support/backend_grid.hpp"
#include "support/device_case.hpp"
#include "support/scoped_env.hpp"
#include "support/variants.hpp"

namespace flashtile {
namespace {

using testing::BackwardCase;
using testing::DeviceArray;
using testing::DeviceCase;
using testing::DeviceTensor;
using testing::Shape;
using testing::shape_of;
using testing::Variant;
using testing::with_variant;

constexpr Backend kMma = Backend::cuda_mma;
constexpr Backend kSm90 = Backend::cuda_sm90;
constexpr Backend kBackends[] = {kMma, kSm90};

#define SKIP_WITHOUT_MMA_DEVICE() FLASHTILE_SKIP_WITHOUT_BACKEND(kMma)

// Whether `backend`'s backward serves head_dim (the grids skip what it refuses; the
// refusals are tested apart).
bool serves(Backend backend, int64_t head_dim) {
  return backend == kSm90 ? head_dim == 64 || head_dim == 128 : head_dim <= 128;
}

// The backends of kBackends available here, or a skip when none is.
#define FOR_EACH_AVAILABLE_BACKEND(backend)                                    \
  FLASHTILE_SKIP_WITHOUT_CUDA();                                               \
  for (Backend backend : kBackends)                                            \
    if (!backend_available(backend)) {                                         \
      std::printf("[skip] %s unavailable\n", std::string(backend_name(backend)).c_str()); \
    } else

// A host BackwardCase mirrored on the device: the forward's tensors (out restored after
// DeviceCase's poison), its oracle lse, dout, and NaN-poisoned gradients.
struct DeviceBackward {
  Backend backend = kMma;
  DeviceCase fwd;
  DeviceTensor dout, dq, dk, dv;
  DeviceArray<float> dsinks;
  DeviceBuffer lse;

  explicit DeviceBackward(const BackwardCase& c, Backend b = kMma)
      : backend(b),
        fwd(c.fwd),
        dout(c.dout),
        dq(c.dq),
        dk(c.dk),
        dv(c.dv),
        dsinks(c.dsinks, 0),
        lse(c.fwd.lse.size() * sizeof(float), 0) {
    fwd.out.buffer.copy_from_host(c.fwd.out.bytes.data(), c.fwd.out.bytes.size());
    lse.copy_from_host(c.fwd.lse.data(), c.fwd.lse.size() * sizeof(float));
  }

  Options options(const BackwardCase& c, bool deterministic) const {
    Options o = fwd.options(c.fwd, backend);
    o.lse = nullptr;  // an argument of backward
    o.deterministic = deterministic;
    o.dsinks = dsinks.data();
    return o;
  }

  void poison() {
    dq.buffer.fill_bytes(0xFF);
    dk.buffer.fill_bytes(0xFF);
    dv.buffer.fill_bytes(0xFF);
    if (dsinks.data() != nullptr) dsinks.buffer.fill_bytes(0xFF);
  }

  // plan_backward of the case's dense call under o.
  Plan plan(const Options& o) const {
    return plan_backward(fwd.q.view, fwd.k.view, fwd.v.view, fwd.out.view, dout.view,
                         static_cast<const float*>(lse.data()), dq.view, dk.view, dv.view, o);
  }

  // Runs the backward on the device and copies the gradients into c.
  void run(BackwardCase& c, bool deterministic = false) {
    poison();
    const Options o = options(c, deterministic);
    const auto* lse_data = static_cast<const float*>(lse.data());
    if (const std::optional<Varlen> vl = fwd.varlen(c.fwd))
      backward_varlen(fwd.q.view, fwd.k.view, fwd.v.view, fwd.out.view, dout.view, lse_data,
                      dq.view, dk.view, dv.view, *vl, o);
    else
      backward(fwd.q.view, fwd.k.view, fwd.v.view, fwd.out.view, dout.view, lse_data, dq.view,
               dk.view, dv.view, o);
    cuda_synchronize(0);
    copy_back(c);
  }
  void copy_back(BackwardCase& c) const {
    dq.buffer.copy_to_host(c.dq.bytes.data(), c.dq.bytes.size());
    dk.buffer.copy_to_host(c.dk.bytes.data(), c.dk.bytes.size());
    dv.buffer.copy_to_host(c.dv.bytes.data(), c.dv.bytes.size());
    if (!c.dsinks.empty())
      dsinks.buffer.copy_to_host(c.dsinks.data(), c.dsinks.size() * sizeof(float));
  }
};

// The largest error / bound ratio over dq, dk, dv (how close to the rule a suite came),
// printed once at exit.
struct Margin {
  double worst = 0;
  std::string worst_case;
  void add(const BackwardCase& c, const GradientVerification& v) {
    for (auto [err, bound] : {std::pair{v.dq_error, v.dq_bound}, std::pair{v.dk_error, v.dk_bound},
                              std::pair{v.dv_error, v.dv_bound}})
      if (bound > 0 && err / bound > worst) worst = err / bound, worst_case = c.fwd.shape.describe();
  }
  ~Margin() {
    if (!worst_case.empty())
      std::printf("[margin] worst gradient err/bound %.3f (%s)\n", worst, worst_case.c_str());
  }
};
Margin margin;

void expect_passes(Backend backend, const Shape& s, uint32_t seed = 1234) {
  if (!serves(backend, s.head_dim)) return;
  BackwardCase c(s, seed);
  DeviceBackward d(c, backend);
  d.run(c);
  margin.add(c, c.verify());
  EXPECT_TRUE(testing::gradients_match(c)) << backend_name(backend) << " " << s.describe();
}

const std::vector<Variant>& variants() {
  static const std::vector<Variant> all = {
      {"full", {}},
      {"causal", {}, true},
      {"window both", {45, 12}},
      {"window (0, 0)", {0, 0}},
      {"window right only", {-1, 3}},
      {"window left + causal", {70, -1}, true},
      {"softcap 5", {}, false, 5.0f},
      {"softcap 30 + causal", {}, true, 30.0f},
      {"alibi (heads)", {}, false, 0.0f, true},
      {"alibi (batch, heads) + causal", {}, true, 0.0f, true, true},
      {"sinks", {}, false, 0.0f, false, false, true},
      {"sinks + causal", {}, true, 0.0f, false, false, true},
      {"softcap + alibi", {}, false, 20.0f, true},
      {"all: window, softcap, alibi (b, h), sinks", {64, 7}, false, 12.0f, true, true, true},
  };
  return all;
}

class CudaBackwardGrid : public ::testing::TestWithParam<std::tuple<Backend, DType>> {
 protected:
  Backend backend() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
};
#define SKIP_WITHOUT_GRID_BACKEND() FLASHTILE_SKIP_WITHOUT_BACKEND(backend())

// Odd lengths with sq != sk both ways, causal or not, MHA/GQA/MQA, strided views; the two
// specialised head dims, 96 (padded to 128) and 40 (the narrow path: not a multiple of 8).
TEST_P(CudaBackwardGrid, MatchesOracle) {
  SKIP_WITHOUT_GRID_BACKEND();
  for (const Shape& s : testing::backend_grid({64, 128, 96, 40}, dtype(), !testing::small_grid()))
    expect_passes(backend(), s);
}

// Every variant over lengths that put the window edges, the diagonal and the ends of Q and
// K inside blocks, rotating head dims, GQA/MQA and strides.
TEST_P(CudaBackwardGrid, VariantsMatchOracle) {
  SKIP_WITHOUT_GRID_BACKEND();
  const std::vector<testing::Lengths> lengths = testing::variant_lengths(!testing::small_grid());
  int rotate = 0;
  for (const Variant& v : variants())
    for (const testing::Lengths& len : lengths) {
      const int64_t head_dims[] = {64, 128, 96, 40};
      // cuda_sm90 takes 64 and 128 only: its rotation skips the other two.
      const int64_t head_dim = backend() == kSm90 ? head_dims[rotate % 2] : head_dims[rotate % 4];
      Shape s = shape_of(dtype(), 2, len.q, len.k, 4, 2, head_dim);
      s.strided = rotate % 3 == 1;
      if (rotate % 5 == 2) s.heads_kv = 1;  // MQA
      ++rotate;
      expect_passes(backend(), with_variant(s, v));
    }
}

// Packed batches: empty sequences, length-1 sequences, sq != sk per sequence, seqused_k
// (unused keys get dk = dv = 0), masks and the other features aligned per sequence.
TEST_P(CudaBackwardGrid, VarlenMatchesOracle) {
  SKIP_WITHOUT_GRID_BACKEND();
  const Variant varlen_variants[] = {{"full", {}},
                                     {"causal", {}, true},
                                     {"window + sinks", {20, 3}, false, 0.0f, false, false, true},
                                     {"causal softcap alibi sinks", {}, true, 15.0f, true, true, true}};
  for (const testing::VarlenBatch& batch : testing::varlen_batches())
    for (const Variant& v : varlen_variants)
      for (int64_t d : {64, 128}) {
        Shape s = shape_of(dtype(), 1, 0, 0, 4, 2, d);
        s.varlen_q = batch.q, s.varlen_k = batch.k, s.seqused_k = batch.used;
        s.strided = d == 128;
        expect_passes(backend(), with_variant(s, v));
      }
}

INSTANTIATE_TEST_SUITE_P(BackendsAndDtypes, CudaBackwardGrid,
                         ::testing::Combine(::testing::ValuesIn(kBackends),
                                            ::testing::Values(DType::bf16, DType::f16)),
                         [](const auto& info) {
                           return std::string(backend_name(std::get<0>(info.param))) + "_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

TEST(CudaBackward, LongSequences) {
  FOR_EACH_AVAILABLE_BACKEND(backend) {
    for (auto [sq, sk] : {std::pair{1023, 1025}, std::pair{1025, 1023}}) {
      Shape s = shape_of(DType::bf16, 1, sq, sk, 2, 1, 64);
      expect_passes(backend, with_variant(s, {"causal", {}, true}));
      s.head_dim = 128;
      expect_passes(backend, with_variant(s, {"window + softcap + alibi + sinks", {129, 200},
                                              false, 1.5f, true, false, true}));
    }
  }
}

// Every head dim up to 128 runs zero-padded on 64 or 128; dims that are not multiples of 8
// take the narrow path.
TEST(CudaMmaBackward, EveryHeadDimTo128) {
  SKIP_WITHOUT_MMA_DEVICE();
  for (int64_t d : {1, 2, 3, 7, 8, 15, 16, 31, 33, 48, 63, 64, 65, 72, 100, 127, 128}) {
    Shape s = shape_of(d % 2 == 0 ? DType::bf16 : DType::f16, 2, 70, 67, 2, 1, d);
    s.causal = true;
    s.softcap = 3.0f;
    s.sinks = true;
    s.strided = d % 3 == 0;
    expect_passes(kMma, s);
  }
}

// Deterministic mode: the dQ adds in key-block order give the same bits on every run (GQA
// folds the group's heads in a fixed order; dsinks is a fixed-order sum in both modes). Both
// head dims: their query blocks differ (128 rows at d=64, 64 at d=128), and so do the
// counters the key blocks wait on.
TEST(CudaBackward, DeterministicIsBitwiseEqualOver100Runs) {
  FOR_EACH_AVAILABLE_BACKEND(backend)
  for (int64_t head_dim : {64, 128})
    for (bool causal : {false, true}) {
      Shape s = shape_of(DType::bf16, 2, 700, 650, 4, 2, head_dim);
      s.causal = causal;
      s.sinks = true;
      s.alibi = !causal;
      BackwardCase c(s);
      DeviceBackward d(c, backend);
      d.run(c, /*deterministic=*/true);
      ASSERT_TRUE(testing::gradients_match(c)) << backend_name(backend);
      const std::vector<unsigned char> first = c.bytes();
      for (int run = 1; run < 100; ++run) {
        d.run(c, true);
        ASSERT_EQ(c.bytes(), first) << backend_name(backend) << " d " << head_dim << " causal "
                                    << causal << " run " << run;
      }
    }
}

// The atomic mode's dQ adds come in any order: each run stays within the rule.
TEST(CudaBackward, AtomicModeStaysWithinTheRuleOverRuns) {
  FOR_EACH_AVAILABLE_BACKEND(backend) {
    Shape s = shape_of(DType::f16, 1, 515, 513, 4, 1, 64);
    s.window = {300, 40};
    BackwardCase c(s);
    DeviceBackward d(c, backend);
    for (int run = 0; run < 20; ++run) {
      d.run(c, /*deterministic=*/false);
      ASSERT_TRUE(testing::gradients_match(c)) << backend_name(backend) << " run " << run;
    }
  }
}

// `auto`'s backward: cuda_sm90 where it was measured faster (dense, from 1024 keys and
// queries, d 64 and 128), cuda_mma elsewhere (shorter calls, other head dims).
TEST(CudaMmaBackward, PlanPicksTheMeasuredFasterBackendWithLinearWorkspace) {
  SKIP_WITHOUT_MMA_DEVICE();
  const Backend fast = backend_available(kSm90) ? kSm90 : kMma;
  struct Pick {
    int64_t seqlen, head_dim;
    Backend backend;
  };
  for (const Pick& pick : {Pick{1024, 64, fast}, Pick{2048, 128, fast}, Pick{512, 64, kMma},
                           Pick{1024, 96, kMma}}) {
    BackwardCase c(shape_of(DType::bf16, 1, pick.seqlen, pick.seqlen, 2, 2, pick.head_dim));
    DeviceBackward d(c);
    Options o = d.options(c, false);
    o.backend = Backend::automatic;
    const Plan p = d.plan(o);
    EXPECT_EQ(p.backend, pick.backend) << "seqlen " << pick.seqlen << " d " << pick.head_dim;
  }
  Shape s = shape_of(DType::bf16, 1, 1024, 1024, 2, 2, 64);
  BackwardCase c(s);
  DeviceBackward d(c);
  Options o = d.options(c, false);
  o.backend = Backend::automatic;
  const Plan p = d.plan(o);
  // D (a float per row and head) and the fp32 dQ accumulator: O(N·d), far below N×N.
  EXPECT_GE(p.workspace_bytes, 2 * 1024 * 4 + 2 * 1024 * 64 * 4);
  EXPECT_LT(p.workspace_bytes, 1024 * 1024 * 4);
  o.deterministic = true;
  const Plan det = d.plan(o);
  EXPECT_GT(det.workspace_bytes, p.workspace_bytes);  // + one counter per query block
}

// What the backward refuses, with the reason, before anything is written.
void expect_refused(Backend backend, DType dtype, int64_t head_dim, const char* reason) {
  BackwardCase c(shape_of(dtype, 1, 33, 40, 2, 1, head_dim));
  DeviceBackward d(c, backend);
  d.poison();
  const Options o = d.options(c, false);
  try {
    backward(d.fwd.q.view, d.fwd.k.view, d.fwd.v.view, d.fwd.out.view, d.dout.view,
             static_cast<const float*>(d.lse.data()), d.dq.view, d.dk.view, d.dv.view, o);
    ADD_FAILURE() << backend_name(backend) << " head_dim " << head_dim << " was not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported);
    EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
  }
  cuda_synchronize(0);
  d.copy_back(c);
  for (const testing::HostTensor* g : {&c.dq, &c.dk, &c.dv})
    for (unsigned char byte : g->bytes) ASSERT_EQ(byte, 0xFF) << "a refused call wrote";
}

TEST(CudaMmaBackward, RefusesHeadDimsAbove128AndFp32WritingNothing) {
  SKIP_WITHOUT_MMA_DEVICE();
  expect_refused(kMma, DType::bf16, 160, "head_dim 1 to 128");
  expect_refused(kMma, DType::f16, 256, "head_dim 1 to 128");
  expect_refused(kMma, DType::f32, 64, "float16 and bfloat16");
}

// cuda_sm90's backward takes head dims 64 and 128 (its forward also 256; other dims are
// the forward's refusal); `auto` answers them with cuda_mma's.
TEST(CudaSm90Backward, RefusesOtherHeadDimsAndFp32WritingNothing) {
  FLASHTILE_SKIP_WITHOUT_BACKEND(kSm90);
  expect_refused(kSm90, DType::bf16, 256, "backward supports head_dim 64 and 128");
  expect_refused(kSm90, DType::f16, 96, "head_dim 64, 128 and 256");
  expect_refused(kSm90, DType::f32, 64, "float16 and bfloat16");
}

// cuda_sm90's two main kernels on dense calls (the grids run the default, 4b.6's warp-
// specialised one, there, and 4b.5's cp.async one on varlen): each pinned, against the oracle
// over partial blocks at both ends, GQA/MQA, strides and the variants, and each bitwise
// deterministic in deterministic mode.
TEST(CudaSm90Backward, BothMainKernelsMatchOracleAndAreDeterministic) {
  FLASHTILE_SKIP_WITHOUT_BACKEND(kSm90);
  for (const char* pipeline : {"cp_async", "ws"}) {
    const testing::ScopedEnv pinned("FLASHTILE_SM90_BACKWARD_PIPELINE", pipeline);
    int rotate = 0;
    for (const Variant& v : variants())
      for (auto [sq, sk] : {std::pair{1, 129}, std::pair{191, 130}, std::pair{257, 383}}) {
        Shape s = shape_of(rotate % 2 == 0 ? DType::bf16 : DType::f16, 2, sq, sk, 4,
                           rotate % 3 == 0 ? 1 : 2, rotate % 2 == 0 ? 64 : 128);
        s.strided = rotate % 4 == 1;
        ++rotate;
        SCOPED_TRACE(pipeline);
        expect_passes(kSm90, with_variant(s, v));
      }
    for (int64_t head_dim : {64, 128}) {
      Shape s = shape_of(DType::bf16, 1, 333, 300, 4, 2, head_dim);
      s.causal = true;
      BackwardCase c(s);
      DeviceBackward d(c, kSm90);
      d.run(c, /*deterministic=*/true);
      ASSERT_TRUE(testing::gradients_match(c)) << pipeline;
      const std::vector<unsigned char> first = c.bytes();
      for (int run = 1; run < 10; ++run) {
        d.run(c, true);
        ASSERT_EQ(c.bytes(), first) << pipeline << " d " << head_dim << " run " << run;
      }
    }
  }
}

TEST(CudaSm90Backward, RefusesAnUnknownPipelineName) {
  FLASHTILE_SKIP_WITHOUT_BACKEND(kSm90);
  const testing::ScopedEnv pinned("FLASHTILE_SM90_BACKWARD_PIPELINE", "tma");
  Shape s = shape_of(DType::bf16, 1, 64, 64, 2, 1, 64);
  BackwardCase c(s);
  DeviceBackward d(c, kSm90);
  try {
    d.run(c);
    FAIL() << "an unknown pipeline name ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cp_async or ws"), std::string::npos) << e.what();
  }
}

// ---- a gradient into the LSE (options.dlse): D' = D - g in the row-sum pre-pass ----------

// c's backward on the device with c.dlse (drawn) copied there as options.dlse.
void run_with_lse_gradient(Backend backend, BackwardCase& c, bool deterministic = false) {
  DeviceBackward d(c, backend);
  const DeviceArray<float> dlse(c.dlse, 0);
  d.poison();
  Options o = d.options(c, deterministic);
  o.dlse = dlse.data();
  const auto* lse_data = static_cast<const float*>(d.lse.data());
  if (const std::optional<Varlen> vl = d.fwd.varlen(c.fwd))
    backward_varlen(d.fwd.q.view, d.fwd.k.view, d.fwd.v.view, d.fwd.out.view, d.dout.view,
                    lse_data, d.dq.view, d.dk.view, d.dv.view, *vl, o);
  else
    backward(d.fwd.q.view, d.fwd.k.view, d.fwd.v.view, d.fwd.out.view, d.dout.view, lse_data,
             d.dq.view, d.dk.view, d.dv.view, o);
  cuda_synchronize(0);
  d.copy_back(c);
}

// Every variant, both dtypes, head dims 64, 128 (d = 128 is what JAX's old head-dim
// widening could not run) and 40 (the narrow path), GQA/MQA, sq != sk both ways, strides.
TEST(CudaBackward, LseGradientMatchesOracleForEveryVariant) {
  FOR_EACH_AVAILABLE_BACKEND(backend) {
  int rotate = 0;
  for (const Variant& v : variants())
    for (auto [sq, sk] : {std::pair{130, 77}, std::pair{77, 200}}) {
      const int64_t head_dims[] = {128, 64, 40};
      const int64_t head_dim = backend == kSm90 ? head_dims[rotate % 2] : head_dims[rotate % 3];
      Shape s = shape_of(rotate % 2 ? DType::f16 : DType::bf16, 2, sq, sk, 4, 2, head_dim);
      s.strided = rotate % 3 == 1;
      if (rotate % 5 == 2) s.heads_kv = 1;  // MQA
      BackwardCase c(with_variant(s, v));
      c.draw_lse_gradient(uint32_t(100 + rotate++));
      run_with_lse_gradient(backend, c);
      margin.add(c, c.verify());
      EXPECT_TRUE(testing::gradients_match(c)) << backend_name(backend) << " " << v.name;
    }
  }
}

// Packed batches with empty sequences, sequences of queries and no keys (their g must give
// no NaN; with sinks it reaches dsinks) and seqused_k; deterministic mode too.
TEST(CudaBackward, LseGradientVarlenAndDeterministic) {
  FOR_EACH_AVAILABLE_BACKEND(backend) {
  const Variant varlen_variants[] = {{"causal", {}, true},
                                     {"window + sinks", {20, 3}, false, 0.0f, false, false, true},
                                     {"causal softcap alibi sinks", {}, true, 15.0f, true, true, true}};
  int n = 0;
  for (const Variant& v : varlen_variants)
    for (int64_t d : {64, 128}) {
      Shape s = shape_of(DType::bf16, 1, 0, 0, 4, 2, d);
      s.varlen_q = {1, 0, 17, 1, 150, 33};
      s.varlen_k = {1, 5, 0, 130, 140, 90};
      s.seqused_k = {1, 5, 0, 0, 120, 90};
      s.strided = d == 128;
      BackwardCase c(with_variant(s, v));
      c.draw_lse_gradient(uint32_t(200 + n));
      run_with_lse_gradient(backend, c, /*deterministic=*/n++ % 2 == 1);
      EXPECT_TRUE(testing::gradients_match(c))
          << backend_name(backend) << " varlen d" << d << " " << v.name;
    }
  }
}

// g = 0 changes no bit (D - 0 = D), in deterministic mode where the bits are repeatable.
TEST(CudaMmaBackward, ZeroLseGradientLeavesTheGradientsBitwiseUnchanged) {
  SKIP_WITHOUT_MMA_DEVICE();
  Shape s = shape_of(DType::bf16, 2, 300, 257, 4, 2, 128);
  s.causal = true;
  s.sinks = true;
  BackwardCase c(s);
  DeviceBackward d(c);
  d.run(c, /*deterministic=*/true);
  const std::vector<unsigned char> without = c.bytes();
  c.dlse.assign(c.fwd.lse.size(), 0.0f);
  run_with_lse_gradient(kMma, c, /*deterministic=*/true);
  EXPECT_EQ(c.bytes(), without);
}

}  // namespace
}  // namespace flashtile
