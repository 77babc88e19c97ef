// cuda_mma (tensor cores, fp16/bf16, sm_80+) against the double-precision oracle with
// FlashAttention's error rule, plus what the generic CUDA suite cannot cover for a 16-bit
// backend: non-specialised head dims, determinism, > 2^31-element tensors, alignment
// refusals. Every test skips without a CUDA device (CI).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "support/oracle_check.hpp"
#include "support/backend_grid.hpp"
#include "support/device_case.hpp"

namespace flashtile {
namespace {

using testing::AttentionCase;
using testing::DeviceCase;
using testing::Shape;

constexpr Backend kMma = Backend::cuda_mma;

#define SKIP_WITHOUT_MMA_DEVICE()                                                  \
  do {                                                                             \
    FLASHTILE_SKIP_WITHOUT_CUDA();                                                 \
    if (!backend_available(kMma))                                                  \
      GTEST_SKIP() << "cuda_mma unavailable: " << backend_unavailable_reason(kMma); \
  } while (0)

// On failure: where the output is off, to tell a wrong row or column from a rounding slip.
void report_worst(const AttentionCase& c, std::optional<float> scale) {
  Options ref;
  ref.causal = c.shape.causal;
  ref.scale = scale;
  const double bound =
      verify_forward(c.q.view, c.k.view, c.v.view, c.out.view, c.lse.data(), ref).out_bound;
  const ReferenceResult exact = reference_attention(c.q.view, c.k.view, c.v.view, ref);
  const TensorView& out = c.out.view;
  int shown = 0;
  int64_t n = 0;
  for (int64_t b = 0; b < out.batch(); ++b)
    for (int64_t s = 0; s < out.seqlen(); ++s)
      for (int64_t h = 0; h < out.heads(); ++h)
        for (int64_t d = 0; d < out.head_dim(); ++d, ++n) {
          const int64_t i = b * out.strides[0] + s * out.strides[1] + h * out.strides[2] + d;
          const double got = detail::load_as_float(out.data, out.dtype, i);
          if (!(std::fabs(got - exact.out[n]) <= bound) && shown++ < 8) {
            const int64_t row = (b * out.heads() + h) * out.seqlen() + s;
            std::printf("  b%lld s%lld h%lld d%lld: got %.8g oracle %.8g (lse %.8g oracle %.8g)\n",
                        (long long)b, (long long)s, (long long)h, (long long)d, got,
                        exact.out[n], c.lse[row], exact.lse[row]);
          }
        }
}

void expect_matches_oracle(const Shape& shape, std::optional<float> scale = std::nullopt) {
  AttentionCase c(shape);
  DeviceCase d(c);
  Options o = c.options(kMma);
  o.scale = scale;
  d.run(c, o);
  const ::testing::AssertionResult matches = testing::matches_oracle(c, scale);
  EXPECT_TRUE(matches);
  if (!matches) report_worst(c, scale);
}

class CudaMmaGrid : public ::testing::TestWithParam<DType> {};

// Seqlens 1, 17, 113, 127, 128, 129, 1023, 1025 with seqlen_q != seqlen_k both ways, causal
// or not, MHA/GQA/MQA, strided views; the four specialised head dims and two that are
// served by the next one up with masked loads and stores. FLASHTILE_SMALL_GRID=1 drops
// the 1023/1025 lengths (for compute-sanitizer runs).
TEST_P(CudaMmaGrid, MatchesOracle) {
  SKIP_WITHOUT_MMA_DEVICE();
  const bool large = std::getenv("FLASHTILE_SMALL_GRID") == nullptr;
  for (const Shape& s : testing::backend_grid({64, 96, 128, 256, 40, 72}, GetParam(), large))
    expect_matches_oracle(s);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaMmaGrid, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CudaMma, OtherHeadDimsServedByTheNextSpecialisation) {
  SKIP_WITHOUT_MMA_DEVICE();
  for (int64_t d : {8, 16, 136, 200, 248})
    for (bool causal : {false, true}) {
      Shape s;
      s.dtype = DType::bf16;
      s.batch = 2, s.heads_q = 4, s.heads_kv = 2;
      s.seqlen_q = 77, s.seqlen_k = 190;
      s.head_dim = d;
      s.causal = causal;
      s.strided = causal;
      expect_matches_oracle(s);
    }
}

TEST(CudaMma, ScaleOfAnySign) {
  SKIP_WITHOUT_MMA_DEVICE();
  for (float scale : {-0.37f, 0.0f, 1.5f})
    for (bool causal : {false, true}) {
      Shape s;
      s.dtype = DType::f16;
      s.seqlen_q = 100, s.seqlen_k = 150;
      s.heads_q = 2, s.heads_kv = 1;
      s.head_dim = 64;
      s.causal = causal;
      expect_matches_oracle(s, scale);
    }
}

// Many tiles in flight through the cp.async ring, with the longest causal blocks.
TEST(CudaMma, LongerSequences) {
  SKIP_WITHOUT_MMA_DEVICE();
  for (int64_t d : {64, 128})
    for (bool causal : {false, true}) {
      Shape s;
      s.dtype = DType::bf16;
      s.seqlen_q = 2000, s.seqlen_k = 2100;
      s.heads_q = 2, s.heads_kv = 2;
      s.head_dim = d;
      s.causal = causal;
      expect_matches_oracle(s);
    }
}

TEST(CudaMma, AutoPicksMmaForHalfTypes) {
  SKIP_WITHOUT_MMA_DEVICE();
  for (DType dtype : {DType::f16, DType::bf16}) {
    Shape s;
    s.dtype = dtype;
    AttentionCase c(s);
    DeviceCase d(c);
    EXPECT_EQ(plan(d.q.view, d.k.view, d.v.view, d.out.view, Options{}).backend, kMma);
  }
}

TEST(CudaMma, DeterministicOver100Runs) {
  SKIP_WITHOUT_MMA_DEVICE();
  Shape s;
  s.dtype = DType::bf16;
  s.batch = 2, s.heads_q = 4, s.heads_kv = 2;
  s.seqlen_q = 257, s.seqlen_k = 300;
  s.head_dim = 128;
  s.causal = true;
  AttentionCase c(s);
  DeviceCase d(c);
  d.run(c, kMma);
  const testing::HostBytes first_out = c.out.bytes;
  const std::vector<float> first_lse = c.lse;
  for (int run = 1; run < 100; ++run) {
    d.poison();
    d.run(c, kMma);
    ASSERT_EQ(c.out.bytes, first_out) << "run " << run;
    ASSERT_EQ(std::memcmp(c.lse.data(), first_lse.data(), c.lse.size() * sizeof(float)), 0)
        << "lse, run " << run;
  }
}

void expect_refused(const TensorView& q, const TensorView& k, const TensorView& v,
                    testing::DeviceTensor& out, const std::string& message_part) {
  out.buffer.fill_bytes(0xFF);
  for (Backend backend : {kMma, Backend::automatic}) {
    Options o;
    o.backend = backend;
    try {
      forward(q, k, v, out.view, o);
      ADD_FAILURE() << backend_name(backend) << " accepted: " << message_part;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::unsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find(message_part), std::string::npos) << e.what();
    }
  }
  std::vector<unsigned char> bytes(out.buffer.bytes());
  out.buffer.copy_to_host(bytes.data(), bytes.size());
  for (unsigned char byte : bytes) ASSERT_EQ(byte, 0xFF) << "out was written on error";
}

TEST(CudaMma, RefusesMisalignedTensorsAndLeavesOutUntouched) {
  SKIP_WITHOUT_MMA_DEVICE();
  Shape s;
  s.dtype = DType::bf16;
  s.seqlen_q = s.seqlen_k = 17;
  s.head_dim = 64;
  AttentionCase c(s);
  DeviceCase d(c);

  // q starts one element (2 bytes) into its buffer: 16 rows fit behind it.
  TensorView q = d.q.view;
  q.data = static_cast<unsigned char*>(q.data) + 2;
  q.shape[1] = 16;
  testing::DeviceTensor out16(c.out);
  out16.view.shape[1] = 16;
  expect_refused(q, d.k.view, d.v.view, out16, "16-byte aligned");

  // k rows 68 elements apart (136 bytes): not a multiple of 16 bytes.
  TensorView k = d.k.view;
  k.shape[1] = 16;
  k.strides = {16 * 68, 68, 64, 1};
  TensorView v = d.v.view;
  v.shape[1] = 16;
  expect_refused(d.q.view, k, v, d.out, "k row stride is 68");
}

TEST(CudaMma, RefusesFloat32AndOddHeadDims) {
  SKIP_WITHOUT_MMA_DEVICE();
  struct Bad {
    DType dtype;
    int64_t head_dim;
    const char* message;
  };
  for (const Bad& bad : {Bad{DType::f32, 64, "float16 and bfloat16; got float32"},
                         Bad{DType::bf16, 12, "multiple of 8 up to 256; got 12"},
                         Bad{DType::f16, 264, "multiple of 8 up to 256; got 264"}}) {
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

// Each tensor holds 2049·128·64·128 > 2^31 elements (4.3 GB in bf16): the last batch starts
// at element 2^31, where 32-bit offsets would wrap. Batches 0 and 2048 get distinct random
// data and are checked against the oracle; the others are zeros.
TEST(CudaMma, OffsetsBeyond2Pow31Elements) {
  SKIP_WITHOUT_MMA_DEVICE();
  constexpr int64_t kBatch = 2049, kSeq = 128, kHeads = 64, kDim = 128;
  static_assert(kBatch * kSeq * kHeads * kDim > (int64_t(1) << 31));
  Shape s;
  s.dtype = DType::bf16;
  s.batch = 2;
  s.seqlen_q = s.seqlen_k = kSeq;
  s.heads_q = s.heads_kv = kHeads;
  s.head_dim = kDim;
  s.causal = true;
  AttentionCase c(s);  // batch 0 -> device batch 0, batch 1 -> device batch kBatch-1

  const size_t batch_bytes = kSeq * kHeads * kDim * 2;
  const size_t total_bytes = kBatch * batch_bytes;
  const size_t last = (kBatch - 1) * batch_bytes;
  DeviceBuffer q(total_bytes), k(total_bytes), v(total_bytes), out(total_bytes);
  for (auto [device, host] : {std::pair{&q, &c.q}, {&k, &c.k}, {&v, &c.v}}) {
    device->fill_bytes(0);
    auto* dst = static_cast<unsigned char*>(device->data());
    ASSERT_EQ(cudaMemcpy(dst, host->bytes.data(), batch_bytes, cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dst + last, host->bytes.data() + batch_bytes, batch_bytes,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  out.fill_bytes(0xFF);
  const std::array<int64_t, 4> shape = {kBatch, kSeq, kHeads, kDim};
  auto view = [&](DeviceBuffer& b) {
    return TensorView::contiguous(b.data(), DType::bf16, Device::cuda(0), shape);
  };
  DeviceBuffer lse(kBatch * kHeads * kSeq * sizeof(float));
  Options o;
  o.backend = kMma;
  o.causal = true;
  o.lse = static_cast<float*>(lse.data());
  forward(view(q), view(k), view(v), view(out), o);
  cuda_synchronize(0);

  auto* out_bytes = static_cast<unsigned char*>(out.data());
  ASSERT_EQ(cudaMemcpy(c.out.bytes.data(), out_bytes, batch_bytes, cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(c.out.bytes.data() + batch_bytes, out_bytes + last, batch_bytes,
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  const size_t lse_batch = kHeads * kSeq;
  auto* lse_floats = static_cast<float*>(lse.data());
  ASSERT_EQ(cudaMemcpy(c.lse.data(), lse_floats, lse_batch * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(c.lse.data() + lse_batch, lse_floats + (kBatch - 1) * lse_batch,
                       lse_batch * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_TRUE(testing::matches_oracle(c));  // c.shape is causal, as the device run
}

}  // namespace
}  // namespace flashtile
