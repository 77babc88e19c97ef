// cpu_flash SIMD code, compiled once per Highway target (AVX-512, AVX2, SSE4, NEON and a
// portable fallback) and chosen at run time from what the CPU supports. AVX3 and AVX2 are
// compiled in flash_hwy_avx3.cpp and flash_hwy_avx2.cpp, so that the targets compile in
// parallel (cpu/flash_entries-inl.hpp); this file compiles the others and dispatches.
#include "cpu/flash_targets.hpp"

#define FLASHTILE_HWY_OWNS_TARGET (HWY_TARGET != HWY_AVX3 && HWY_TARGET != HWY_AVX2)

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/flash_hwy.cpp"
#include "hwy/foreach_target.h"  // re-includes this file once per target
// clang-format on

#include "cpu/flash_entries-inl.hpp"

#if HWY_ONCE
#include "cpu/simd_dispatch.hpp"
#include "hwy/targets.h"

namespace flashtile::detail::cpu_flash {

HWY_EXPORT(RunQueryBlockEntry);
HWY_EXPORT(GetGeometryEntry);
HWY_EXPORT(VectorExpEntry);
HWY_EXPORT(VectorTanhEntry);
HWY_EXPORT(OnlineSoftmaxLanesEntry);

Geometry geometry(int64_t head_dim) {
  choose_simd_target_once();
  return HWY_DYNAMIC_DISPATCH(GetGeometryEntry)(head_dim);
}

QueryBlockFn query_block_kernel() {
  choose_simd_target_once();
  return HWY_DYNAMIC_DISPATCH(RunQueryBlockEntry);
}

std::vector<std::string> available_targets() {
  std::vector<std::string> names;
  for (int64_t target : hwy::SupportedAndGeneratedTargets())
    names.emplace_back(hwy::TargetName(target));
  return names;
}

bool force_target(const std::string& name) {
  choose_simd_target_once();
  hwy::SetSupportedTargetsForTest(0);  // 0 = back to what the CPU supports
  int64_t chosen = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets())
    if (name == hwy::TargetName(target)) chosen = target;
  if (!name.empty() && chosen == 0) {
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    return false;
  }
  if (chosen != 0) hwy::SetSupportedTargetsForTest(chosen);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  return true;
}

void vector_exp(const float* x, float* y, size_t n) {
  choose_simd_target_once();
  HWY_DYNAMIC_DISPATCH(VectorExpEntry)(x, y, n);
}

void vector_tanh(const float* x, float* y, size_t n) {
  choose_simd_target_once();
  HWY_DYNAMIC_DISPATCH(VectorTanhEntry)(x, y, n);
}

void online_softmax_lanes(float* scores, int64_t keys, int64_t rows, float* m, float* l,
                          float* alpha) {
  choose_simd_target_once();
  HWY_DYNAMIC_DISPATCH(OnlineSoftmaxLanesEntry)(scores, keys, rows, m, l, alpha);
}

}  // namespace flashtile::detail::cpu_flash
#endif  // HWY_ONCE
