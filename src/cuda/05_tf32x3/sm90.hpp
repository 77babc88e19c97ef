// What cuda_tf32x3's sm_90a translation units (sm90_hdim<D>.cu, step 2c: wgmma) offer the
// backend: one forward entry per head dim served. Built, and declared here as existing, only
// when FLASHTILE_TF32X3_WITH_SM90 (CMAKE_CUDA_ARCHITECTURES names 90a).
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "api/params.hpp"

namespace flashtile::detail::tf32x3 {

// The head dims the wgmma path has kernels for (exactly these; others run on mma.sync).
inline constexpr int kSm90HeadDims[] = {64, 128};

// Runs the wgmma forward for head dim kHeadDim (p validated; fp32, head_dim == kHeadDim,
// rows on 16 bytes, no key split: backend.cu checks), on `stream`.
template <int kHeadDim>
void run_tf32x3_sm90_forward(const AttentionParams& p, cudaStream_t stream);

extern template void run_tf32x3_sm90_forward<64>(const AttentionParams&, cudaStream_t);
extern template void run_tf32x3_sm90_forward<128>(const AttentionParams&, cudaStream_t);

}  // namespace flashtile::detail::tf32x3
