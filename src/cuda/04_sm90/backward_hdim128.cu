// cuda_sm90 backward kernels for head_dim 128, fp16 and bf16 (sm_90a only).
#include "cuda/04_sm90/backward_kernel.cuh"

namespace flashtile::detail::sm90 {
FLASHTILE_SM90_BACKWARD_INSTANTIATIONS(, 128)
}  // namespace flashtile::detail::sm90
