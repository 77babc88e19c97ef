// Reading small device arrays on the host, for validation (varlen cu_seqlens).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flashtile::detail {

// Copies n int32 values from `src`, which must be device memory of CUDA device `device`,
// into `dst`, ordered after the work already queued on `stream` (which is synchronised).
// Returns "" on success, else why not (host pointer, other device, stream being captured
// into a CUDA graph, a CUDA error); throws nothing.
std::string copy_device_int32_to_host(const int32_t* src, int64_t n, int device, void* stream,
                                      std::vector<int32_t>& dst);

}  // namespace flashtile::detail
