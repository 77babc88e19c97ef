// The first Highway dynamic dispatch picks the SIMD target. Doing it once and serially (a
// function-local static) lets threads read the chosen function pointers without racing on
// that choice; cpu_flash's forward and backward both start here.
#pragma once

#include "hwy/targets.h"

namespace flashtile::detail {

inline void choose_simd_target_once() {
  static const bool chosen = [] {
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    return true;
  }();
  (void)chosen;
}

}  // namespace flashtile::detail
