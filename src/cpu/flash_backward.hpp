// cpu_flash's backward pass (flash_backward.cpp): the entry points its BackendEntry lists.
#pragma once

#include <cstdint>

#include "api/params.hpp"

namespace flashtile::detail::cpu_flash_backward {

// D (fp32, one per query row and head), the per-thread tiles and fp32 dK/dV/dQ
// accumulators, and the sinks' per-task partial sums.
int64_t workspace_bytes(const BackwardParams& bp);
void run(const BackwardParams& bp);

}  // namespace flashtile::detail::cpu_flash_backward
