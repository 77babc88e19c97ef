// GPU test support: the shared DeviceCase, skips for machines without a CUDA device or
// without a backend's hardware, and the sanitizer runs' smaller grid.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>

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
}  // namespace flashtile::testing
