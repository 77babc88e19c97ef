// GPU test support: the shared DeviceCase, skips for machines without a CUDA device or
// without a backend's hardware, the sanitizer runs' smaller grid, device tensors at an
// offset into their buffer, and the bitwise-repeatability check.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "testing/device_case.hpp"

#define FLASHTILE_SKIP_WITHOUT_CUDA()                                               \
  do {                                                                              \
    if (::flashtile::cuda_device_count() == 0)                                      \
      GTEST_SKIP() << "no CUDA device: " << ::flashtile::cuda_unavailable_reason(); \
  } while (0)

// Skips unless `backend` (a Backend) can run here: a CUDA device with its hardware.
#define FLASHTILE_SKIP_WITHOUT_BACKEND(backend)                                              \
  do {                                                                                     \
    FLASHTILE_SKIP_WITHOUT_CUDA();                                                         \
    if (!::flashtile::backend_available(backend))                                          \
      GTEST_SKIP() << ::flashtile::backend_name(backend)                                   \
                   << " unavailable: " << ::flashtile::backend_unavailable_reason(backend); \
  } while (0)

namespace flashtile::testing {
// Under compute-sanitizer the long lengths are left out (FLASHTILE_SMALL_GRID=1).
inline bool small_grid() { return std::getenv("FLASHTILE_SMALL_GRID") != nullptr; }

// A device copy of a host tensor whose data starts `offset_bytes` into its buffer.
struct OffsetDeviceTensor {
  DeviceBuffer buffer;
  TensorView view;
  OffsetDeviceTensor(const HostTensor& host, size_t offset_bytes)
      : buffer(host.bytes.size() + offset_bytes) {
    auto* at = static_cast<unsigned char*>(buffer.data()) + offset_bytes;
    EXPECT_EQ(cudaMemcpy(at, host.bytes.data(), host.bytes.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    view = host.view;
    view.data = at;
    view.device = Device::cuda(0);
  }
  void copy_back(HostTensor& host) const {
    EXPECT_EQ(cudaMemcpy(host.bytes.data(), view.data, host.bytes.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
};

// Runs `backend` on d `runs - 1` more times, poisoned before each, and asserts that every
// output and LSE is bitwise the one c holds now (the first run's). The assertions are
// fatal: call it through ASSERT_NO_FATAL_FAILURE so that the test stops there too.
inline void assert_runs_repeat_bitwise(AttentionCase& c, DeviceCase& d, Backend backend,
                                       int runs) {
  const HostBytes first_out = c.out.bytes;
  const std::vector<float> first_lse = c.lse;
  for (int run = 1; run < runs; ++run) {
    d.poison();
    d.run(c, backend);
    ASSERT_EQ(c.out.bytes, first_out) << "run " << run;
    ASSERT_EQ(std::memcmp(c.lse.data(), first_lse.data(), c.lse.size() * sizeof(float)), 0)
        << "lse, run " << run;
  }
}
}  // namespace flashtile::testing
