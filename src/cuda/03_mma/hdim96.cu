// cuda_mma kernels for head_dim 96 (and the dims served by it), fp16 and bf16. One
// translation unit per head dim keeps each nvcc job small and lets them build in parallel.
#include "cuda/03_mma/traits.cuh"

namespace flashtile::detail::mma {
FLASHTILE_MMA_INSTANTIATIONS(, 96)
}  // namespace flashtile::detail::mma
