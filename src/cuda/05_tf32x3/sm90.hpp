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

// How the d=128 kernel (one set of K/Vᵀ planes) splits each K/V tile, set by
// FLASHTILE_TF32X3_SM90_SPLIT (read per call, whenever the wgmma path runs; d=64 has two
// plane sets and one pipeline, the overlapped one, whatever it says):
//   "between" (default)    K and V split by every thread between two barriers, the tensor
//                          cores idle (tf32x3_sm90_forward_kernel, step 2c's first version)
//   "staggered"            V(j) split under S(j), K(j+1) under P·V(j)
//                          (tf32x3_sm90_staggered_kernel)
// Measured (H200, fp32 field grid, d=128, seqlen 1k/4k/16k, one call; docs/JOURNEY.md step
// 2c.2): staggered 58.9/61.5/62.2 TFLOP/s full and 48.0/56.4/62.6 causal against between's
// 60.5/63.1/63.9 and 50.0/58.5/63.9, 1-4% slower, so it is opt-in.
enum class Tf32Sm90Split { between, staggered };

inline Tf32Sm90Split tf32x3_sm90_split_from_environment() {
  const char* value = std::getenv("FLASHTILE_TF32X3_SM90_SPLIT");
  if (value == nullptr || *value == '\0' || std::string(value) == "between")
    return Tf32Sm90Split::between;
  if (std::string(value) == "staggered") return Tf32Sm90Split::staggered;
  throw Error(ErrorKind::invalid_argument,
              std::string("FLASHTILE_TF32X3_SM90_SPLIT must be \"staggered\" or \"between\"; "
                          "got \"") +
                  value + "\"");
}

// Runs the wgmma forward for head dim kHeadDim (p validated; fp32, head_dim == kHeadDim,
// rows on 16 bytes, no key split: backend.cu checks), on `stream`.
template <int kHeadDim>
void run_tf32x3_sm90_forward(const AttentionParams& p, cudaStream_t stream);

extern template void run_tf32x3_sm90_forward<64>(const AttentionParams&, cudaStream_t);
extern template void run_tf32x3_sm90_forward<128>(const AttentionParams&, cudaStream_t);

}  // namespace flashtile::detail::tf32x3
