// cpu_flash's forward kernels for Highway's AVX2 target alone (see cpu/flash_entries-inl.hpp);
// flash_hwy.cpp compiles the other targets and holds the dispatch.
#include "cpu/flash_targets.hpp"

#define FLASHTILE_HWY_OWNS_TARGET (HWY_TARGET == HWY_AVX2)

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/flash_hwy_avx2.cpp"
#include "hwy/foreach_target.h"  // re-includes this file once per target
// clang-format on

#include "cpu/flash_entries-inl.hpp"
