// cuda_sm90 at head dim 256 (its own translation unit, compiled for sm_90a only).
#include "cuda/04_sm90/traits.cuh"

namespace flashtile::detail::sm90 {

FLASHTILE_SM90_INSTANTIATIONS(, 256)

}  // namespace flashtile::detail::sm90
