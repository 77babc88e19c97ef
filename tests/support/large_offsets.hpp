// The int64-offset case every CUDA backend's suite runs: tensors of more than 2^31
// elements, checked against the oracle where the offsets would wrap in 32 bits.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <array>
#include <utility>

#include "flashtile/device.hpp"
#include "support/oracle_check.hpp"
#include "testing/attention_case.hpp"

namespace flashtile::testing {

// Each tensor holds 2049·128·64·128 > 2^31 elements (4.3 GB in bf16): the last batch starts
// at element 2^31, where 32-bit offsets would wrap. Batches 0 and 2048 get distinct random
// data and are checked against the oracle; the others are zeros. Runs `backend` (bf16,
// causal, d=128) on them.
inline void expect_offsets_beyond_2pow31_match_oracle(Backend backend) {
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
  o.backend = backend;
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
  EXPECT_TRUE(matches_oracle(c));  // c.shape is causal, as the device run
}

}  // namespace flashtile::testing
