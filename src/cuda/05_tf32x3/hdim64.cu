// cuda_tf32x3 kernels for head_dim 64 (and the dims served by it). One translation unit per
// head dim keeps each nvcc job small.
#include "cuda/05_tf32x3/kernel.cuh"

namespace flashtile::detail::tf32x3 {
FLASHTILE_TF32X3_INSTANTIATIONS(, 64)
}  // namespace flashtile::detail::tf32x3
