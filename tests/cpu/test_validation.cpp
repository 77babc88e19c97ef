// Every bad input of the API is refused on the host with a clear message, and `out` (and
// lse) stay untouched.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>

#include "flashtile/device.hpp"

#include "testing/attention_case.hpp"

namespace flashtile {
namespace {

using testing::AttentionCase;
using testing::Shape;

struct Bad {
  std::string name;
  std::function<void(AttentionCase&, TensorView& q, TensorView& k, TensorView& v, TensorView& out,
                     Options& o)>
      mutate;
  std::string message;  // expected substring
  ErrorKind kind = ErrorKind::invalid_argument;
};

class Validation : public ::testing::TestWithParam<Bad> {};

TEST_P(Validation, RefusedWithMessageAndNoWrite) {
  const Bad& bad = GetParam();
  Shape shape;
  shape.batch = 2;
  shape.seqlen_q = 5;
  shape.seqlen_k = 7;
  shape.heads_q = 4;
  shape.heads_kv = 2;
  shape.head_dim = 32;
  AttentionCase c(shape);
  TensorView q = c.q.view, k = c.k.view, v = c.v.view, out = c.out.view;
  Options o = c.options(Backend::cpu_standard);
  bad.mutate(c, q, k, v, out, o);
  const testing::HostBytes out_before = c.out.bytes;
  const std::vector<float> lse_before = c.lse;
  try {
    forward(q, k, v, out, o);
    FAIL() << bad.name << ": no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad.message), std::string::npos)
        << bad.name << ": message was: " << e.what();
    EXPECT_EQ(e.kind(), bad.kind) << e.what();
  }
  EXPECT_EQ(c.out.bytes, out_before) << bad.name << ": out was written";
  EXPECT_EQ(0, std::memcmp(c.lse.data(), lse_before.data(), lse_before.size() * 4))
      << bad.name << ": lse was written";
}

// Builds the table of bad inputs; each mutates a valid call into an invalid one.
std::vector<Bad> bad_inputs() {
  using V = TensorView;
  return {
      {"mismatched_dtype_k", [](auto&, V&, V& k, V&, V&, Options&) { k.dtype = DType::f16; },
       "k.dtype must match q.dtype (expected float32, got float16)", ErrorKind::dtype},
      {"mismatched_dtype_out", [](auto&, V&, V&, V&, V& out, Options&) { out.dtype = DType::bf16; },
       "out.dtype must match q.dtype", ErrorKind::dtype},
      {"zero_batch", [](auto&, V& q, V&, V&, V&, Options&) { q.shape[0] = 0; },
       "q.shape[0] (batch) must be positive, got 0"},
      {"negative_seqlen", [](auto&, V&, V& k, V&, V&, Options&) { k.shape[1] = -3; },
       "k.shape[1] (seqlen) must be positive, got -3"},
      {"zero_head_dim", [](auto&, V&, V&, V& v, V&, Options&) { v.shape[3] = 0; },
       "v.shape[3] (head_dim) must be positive"},
      {"head_dim_mismatch_k", [](auto&, V&, V& k, V&, V&, Options&) { k.shape[3] = 16; },
       "k.shape[3] must equal q head_dim (expected 32, got 16)"},
      {"head_dim_mismatch_v", [](auto&, V&, V&, V& v, V&, Options&) { v.shape[3] = 16; },
       "v.shape[3] must equal q head_dim (expected 32, got 16)"},
      {"kv_seqlen_mismatch", [](auto&, V&, V&, V& v, V&, Options&) { v.shape[1] = 6; },
       "v.shape[1] must equal k seqlen (expected 7, got 6)"},
      {"kv_heads_mismatch", [](auto&, V&, V&, V& v, V&, Options&) { v.shape[2] = 1; },
       "v.shape[2] must equal k heads (expected 2, got 1)"},
      {"batch_mismatch", [](auto&, V&, V& k, V&, V&, Options&) { k.shape[0] = 1; },
       "k.shape[0] must equal q batch (expected 2, got 1)"},
      {"gqa_not_multiple",
       [](auto&, V&, V& k, V& v, V&, Options&) { k.shape[2] = v.shape[2] = 3; },
       "q heads (4) must be a multiple of k heads (3)"},
      {"out_shape", [](auto&, V&, V&, V&, V& out, Options&) { out.shape[1] = 4; },
       "out.shape[1] must equal the q dimension (expected 5, got 4)"},
      {"last_stride_q", [](auto&, V& q, V&, V&, V&, Options&) { q.strides[3] = 2; },
       "q.strides[3] (head_dim stride) must be 1, got 2"},
      {"last_stride_out", [](auto&, V&, V&, V&, V& out, Options&) { out.strides[3] = 0; },
       "out.strides[3] (head_dim stride) must be 1, got 0"},
      {"negative_stride", [](auto&, V&, V& k, V&, V&, Options&) { k.strides[1] = -1; },
       "k.strides[1] must be non-negative"},
      {"null_q", [](auto&, V& q, V&, V&, V&, Options&) { q.data = nullptr; }, "q.data is null"},
      {"null_out", [](auto&, V&, V&, V&, V& out, Options&) { out.data = nullptr; },
       "out.data is null"},
      {"mixed_devices", [](auto&, V&, V&, V& v, V&, Options&) { v.device = Device::cuda(0); },
       "v.device must match q.device (expected cpu, got cuda:0)"},
      {"out_overlaps_q", [](auto&, V& q, V&, V&, V& out, Options&) { out.data = q.data; },
       "out must not overlap q"},
      {"out_overlaps_v_partially",
       [](auto&, V&, V&, V& v, V& out, Options&) {
         out.data = static_cast<float*>(v.data) + 3;
       },
       // out is larger than v, so it also reaches whatever the allocator put after v
       // (k, under some allocators): the message names the first input it meets.
       "out must not overlap "},
      {"lse_overlaps_k",
       [](auto&, V&, V& k, V&, V&, Options& o) { o.lse = static_cast<float*>(k.data) + 1; },
       "lse must not overlap k"},
      {"nonfinite_scale",
       [](auto&, V&, V&, V&, V&, Options& o) { o.scale = std::numeric_limits<float>::infinity(); },
       "scale must be finite"},
      {"scale_whose_log2e_multiple_overflows",
       [](auto&, V&, V&, V&, V&, Options& o) { o.scale = -3e38f; },
       "scale must be at most 2.35"},
      {"backend_wrong_device",
       [](auto&, V&, V&, V&, V&, Options& o) { o.backend = Backend::cuda_tiled; },
       "backend cuda_tiled runs on cuda but the tensors are on cpu"},
  };
}

INSTANTIATE_TEST_SUITE_P(BadInputs, Validation, ::testing::ValuesIn(bad_inputs()),
                         [](const auto& info) { return info.param.name; });

TEST(Validation, UnsupportedHeadDimForChosenBackend) {
  Shape shape;
  shape.head_dim = 40;
  AttentionCase c(shape);
  Options o = c.options(Backend::cuda_naive);
  const testing::HostBytes before = c.out.bytes;
  // Without CUDA the backend is unavailable; with CUDA it refuses head_dim 40. Either way
  // the message names the backend and nothing is written.
  EXPECT_THROW(forward(c.q.view, c.k.view, c.v.view, c.out.view, o), Error);
  EXPECT_EQ(c.out.bytes, before);
}

TEST(Validation, UnavailableBackendIsRefused) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "needs a machine without a CUDA device";
  // Views that claim to live on a GPU; no backend may touch them.
  AttentionCase c(Shape{});
  TensorView q = c.q.view, k = c.k.view, v = c.v.view, out = c.out.view;
  for (TensorView* t : {&q, &k, &v, &out}) t->device = Device::cuda(0);
  Options o;
  o.backend = Backend::cuda_tiled;
  const auto before = c.out.bytes;
  try {
    forward(q, k, v, out, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backend cuda_tiled is not"), std::string::npos) << e.what();
    EXPECT_EQ(e.kind(), ErrorKind::unsupported);
  }
  o.backend = Backend::automatic;
  EXPECT_THROW(forward(q, k, v, out, o), Error);
  EXPECT_EQ(c.out.bytes, before);
}

TEST(Validation, SizesThatWrapInt64AreRefusedBeforeAnyBackendSeesThem) {
  // The probe's reproducer: a shape product that wraps int64 used to pass plan() with a
  // negative workspace and crash forward().
  std::vector<float> tiny(64);
  const int64_t huge = (int64_t(1) << 61) + 5;
  const TensorView q = TensorView::contiguous(tiny.data(), DType::f32, Device::cpu(), {2, huge, 4, 16});
  const TensorView kv = TensorView::contiguous(tiny.data(), DType::f32, Device::cpu(), {2, 3, 4, 16});
  std::vector<float> out_buf(64);
  const TensorView out = TensorView::contiguous(out_buf.data(), DType::f32, Device::cpu(), {2, huge, 4, 16});
  for (Backend backend : {Backend::automatic, Backend::cpu_reference}) {
    Options o;
    o.backend = backend;
    try {
      plan(q, kv, kv, out, o);
      ADD_FAILURE() << "plan accepted a wrapping shape";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("q is too large"), std::string::npos) << e.what();
    }
    EXPECT_THROW(forward(q, kv, kv, out, o), Error);
  }
}

TEST(Validation, InvalidEnumValuesAreRefused) {
  AttentionCase c(Shape{});
  TensorView q = c.q.view;
  q.dtype = static_cast<DType>(7);
  EXPECT_THROW(forward(q, c.k.view, c.v.view, c.out.view, Options{}), Error);
}

TEST(Validation, ParseNames) {
  EXPECT_EQ(parse_backend("cuda_tiled"), Backend::cuda_tiled);
  EXPECT_EQ(parse_backend("auto"), Backend::automatic);
  EXPECT_FALSE(parse_backend("cuda_fast"));
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_FALSE(parse_dtype("int8"));
}

TEST(Validation, AutoPicksACpuBackendForCpuTensors) {
  AttentionCase c(Shape{});
  const Plan plan = flashtile::plan(c.q.view, c.k.view, c.v.view, c.out.view, Options{});
  EXPECT_EQ(backend_device(plan.backend), DeviceType::cpu);
  EXPECT_NE(plan.backend, Backend::cpu_reference);  // the oracle is never the auto choice
}

}  // namespace
}  // namespace flashtile
