// Which Highway targets cpu_flash compiles. Include first in every translation unit that
// compiles flash_kernels-inl.hpp, before any Highway header.
#pragma once

// The register tiles are arrays of vectors, which the sizeless vector types of SVE and
// RVV cannot form: Arm builds use NEON. SSSE3 (CPUs from before 2008) adds compile time for
// no user; such CPUs take the portable EMU128 fallback.
// FLASHTILE_SKIP_SSE4 (scripts/sanitize.sh) leaves SSE4 out too: AVX2 runs the same
// 16-register tiles, and the sanitizers' build is quicker by one target.
#ifndef HWY_DISABLED_TARGETS
#if FLASHTILE_SKIP_SSE4
#define HWY_DISABLED_TARGETS \
  (HWY_SSSE3 | HWY_SSE4 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#else
#define HWY_DISABLED_TARGETS \
  (HWY_SSSE3 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif
#endif
