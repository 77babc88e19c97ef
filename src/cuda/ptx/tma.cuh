// Thin wrappers over the bulk tensor copy (TMA, PTX ISA "cp.async.bulk.tensor"), sm_90: a
// tile described by a CUtensorMap (built on the host, passed as a __grid_constant__ kernel
// parameter) is copied global -> shared by the copy engine, elements outside the tensor
// read as zeros, and completion is reported to an mbarrier as transaction bytes.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace flashtile::detail::ptx {

// Loads the 4-D box at coordinates (c0 innermost .. c3) of `map` into shared address `dst`
// and reports its bytes to the mbarrier at `bar`. One thread issues it.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// Fetches the tensor map's 128 bytes into the constant cache ahead of the first copy.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace flashtile::detail::ptx
