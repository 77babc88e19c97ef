// cuda_tf32x3's wgmma kernels (sm_90a) for head_dim 64. One translation unit per head dim
// keeps each nvcc job small.
#include "cuda/05_tf32x3/sm90.hpp"
#include "cuda/05_tf32x3/sm90_kernel.cuh"

namespace flashtile::detail::tf32x3 {
template void run_tf32x3_sm90_forward<64>(const AttentionParams&, const SplitArgs&,
                                              Tf32Sm90Schedule, cudaStream_t);
template Tf32Sm90Tile tf32x3_sm90_tile<64>();
}  // namespace flashtile::detail::tf32x3
