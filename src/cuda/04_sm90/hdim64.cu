// cuda_sm90 at head dim 64 (its own translation unit, compiled for sm_90a only).
#include "cuda/04_sm90/traits.cuh"

namespace flashtile::detail::sm90 {

FLASHTILE_SM90_INSTANTIATIONS(, 64)

}  // namespace flashtile::detail::sm90
