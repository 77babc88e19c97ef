// cuda_mma backward kernels for head_dim 64 (and the dims served by it), fp16 and bf16.
#include "cuda/03_mma/backward_traits.cuh"

namespace flashtile::detail::mma {
FLASHTILE_MMA_BACKWARD_INSTANTIATIONS(, 64)
}  // namespace flashtile::detail::mma
