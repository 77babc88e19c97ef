// Mirrors a host AttentionCase on a CUDA device (same strided layouts, byte for byte),
// runs a backend there and copies the results back for verification.
#pragma once

#include <gtest/gtest.h>

#include "flashtile/device.hpp"
#include "support/attention_case.hpp"

namespace flashtile::testing {

#define FLASHTILE_SKIP_WITHOUT_CUDA()                                        \
  do {                                                                       \
    if (::flashtile::cuda_device_count() == 0)                               \
      GTEST_SKIP() << "no CUDA device: " << ::flashtile::cuda_unavailable_reason(); \
  } while (0)

struct DeviceTensor {
  DeviceBuffer buffer;
  TensorView view;
  explicit DeviceTensor(const HostTensor& host) : buffer(host.bytes.size()) {
    buffer.copy_from_host(host.bytes.data(), host.bytes.size());
    view = host.view;
    view.data = buffer.data();
    view.device = Device::cuda(0);
  }
};

struct DeviceCase {
  DeviceTensor q, k, v, out;
  DeviceBuffer lse;
  explicit DeviceCase(const AttentionCase& host)
      : q(host.q), k(host.k), v(host.v), out(host.out), lse(host.lse.size() * sizeof(float)) {
    poison();
  }
  void poison() {
    out.buffer.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
  }
  // Runs `backend` and copies out and lse back into `host` (whose outputs it overwrites).
  void run(AttentionCase& host, Backend backend) {
    Options o = host.options(backend);
    o.lse = static_cast<float*>(lse.data());
    forward(q.view, k.view, v.view, out.view, o);
    cuda_synchronize(0);
    out.buffer.copy_to_host(host.out.bytes.data(), host.out.bytes.size());
    lse.copy_to_host(host.lse.data(), host.lse.size() * sizeof(float));
  }
};

}  // namespace flashtile::testing
