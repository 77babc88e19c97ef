// Which of cuda_tf32x3's two kernels a call runs (plain C++: the tests include it).
#pragma once

#include "api/params.hpp"

namespace flashtile::detail {

enum class Tf32x3Kernel {
  mma_sync,  // step 2b: mma.sync m16n8k8 (sm_80+), every call, split-KV for small ones
  wgmma,     // step 2c: wgmma m64nNk8 (sm_90a), what its kernels cover, split-KV too (2c.3)
};

// The kernel cuda_tf32x3 runs for p (validated and supported by cuda_tf32x3).
Tf32x3Kernel tf32x3_kernel_for(const AttentionParams& p);
// The key splits that call runs with (1: none), worked out for that kernel's tile.
int tf32x3_splits_for(const AttentionParams& p);
// Whether that call's splits merge inside the forward kernel (a grid barrier, 2c.5) rather
// than in the split-KV combine kernel.
bool tf32x3_merges_in_grid_for(const AttentionParams& p);

}  // namespace flashtile::detail
