// Whether strided views share memory, decided exactly rather than by their byte ranges:
// two interleaved views (heads 0::2 and 1::2 of one buffer) are disjoint, and an output
// whose strides alias its own elements is caught. Arithmetic is 128-bit, so no stride or
// address can wrap.
#pragma once

#include <cstdint>

#include "common/fixed_vector.hpp"

namespace flashtile::detail {

// A strided view in bytes: element x (0 <= x_i < extents[i]) covers
// [address + Σ x_i·byte_strides[i], + element_bytes).
// Up to four dimensions (a TensorView's rank), held in place.
using StridedDims = FixedVector<int64_t, 4>;
struct StridedBytes {
  uintptr_t address = 0;
  int64_t element_bytes = 1;
  StridedDims extents;       // every extent >= 1
  StridedDims byte_strides;  // any sign
};

enum class Overlap {
  no,       // proven disjoint
  yes,      // a shared byte exists
  unknown,  // the search gave up (pathological layouts): callers treat it as overlap
};

// Do two views share a byte?
Overlap views_overlap(const StridedBytes& a, const StridedBytes& b);
// Do two distinct elements of one view share a byte?
Overlap self_overlap(const StridedBytes& view);

}  // namespace flashtile::detail
