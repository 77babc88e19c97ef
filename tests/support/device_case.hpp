// GPU test support: the shared DeviceCase plus a skip for machines without a CUDA device.
#pragma once

#include <gtest/gtest.h>

#include "testing/device_case.hpp"

#define FLASHTILE_SKIP_WITHOUT_CUDA()                                               \
  do {                                                                              \
    if (::flashtile::cuda_device_count() == 0)                                      \
      GTEST_SKIP() << "no CUDA device: " << ::flashtile::cuda_unavailable_reason(); \
  } while (0)
