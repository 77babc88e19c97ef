// cpu_flash backward SIMD code, compiled once per Highway target and chosen at run time
// (the same targets as the forward: cpu/flash_targets.hpp).
#include "cpu/flash_targets.hpp"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/flash_backward_hwy.cpp"
#include "hwy/foreach_target.h"  // re-includes this file once per target
// clang-format on

#include "cpu/flash_backward_kernels-inl.hpp"
#include "hwy/highway.h"

#if HWY_ONCE
#include "cpu/flash_backward.hpp"
#include "cpu/simd_dispatch.hpp"
#include "hwy/targets.h"

namespace flashtile::detail::cpu_flash_backward {

HWY_EXPORT(Gemm);
HWY_EXPORT(Softcap);
HWY_EXPORT(Probabilities);
HWY_EXPORT(VectorLanes);

Kernels kernels() {
  choose_simd_target_once();
  return {HWY_DYNAMIC_DISPATCH(Gemm), HWY_DYNAMIC_DISPATCH(Softcap),
          HWY_DYNAMIC_DISPATCH(Probabilities), HWY_DYNAMIC_DISPATCH(VectorLanes)()};
}

}  // namespace flashtile::detail::cpu_flash_backward
#endif  // HWY_ONCE
