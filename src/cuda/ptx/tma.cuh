// Thin wrappers over the bulk tensor copy (TMA, PTX ISA "cp.async.bulk.tensor" and
// "cp.reduce.async.bulk.tensor"), sm_90: a tile described by a CUtensorMap (built on the
// host, passed as a __grid_constant__ kernel parameter) is copied global -> shared by the
// copy engine, elements outside the tensor read as zeros, and completion is reported to an
// mbarrier as transaction bytes; or added shared -> global, completion tracked by bulk groups.
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

// Adds the 4-D box at shared address `src` (laid out as the map's swizzle puts a loaded box)
// into the global tensor at coordinates (c0 .. c3) of `map`, element by element, by the copy
// engine; box rows past the tensor are not written. One thread issues it; it belongs to the
// issuing thread's current bulk group (bulk_commit_group).
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* map, uint32_t src, int c0,
                                                  int c1, int c2, int c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
      " [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
      : "memory");
}

// Closes the issuing thread's bulk group (the copies issued since the last commit).
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until at most kPending of this thread's bulk groups still read shared memory
// (their sources may then be overwritten).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// Waits until at most kPending of this thread's bulk groups are incomplete: the others'
// global writes are performed.
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// Orders the async proxy's completed global writes before this thread's later generic
// accesses (e.g. the release that lets another CTA add after them).
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// Fetches the tensor map's 128 bytes into the constant cache ahead of the first copy.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace flashtile::detail::ptx
