// Reading small device arrays on the host, for validation (varlen cu_seqlens).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flashtile::detail {

// One array to read: n int32 values at `src` into `dst`.
struct Int32Read {
  const int32_t* src;
  int64_t n;
  std::vector<int32_t>* dst;
};

// Why a batch of reads failed: `why` is "" on success, else the reason for reads[index].
struct Int32ReadFailure {
  std::string why;
  size_t index = 0;
};

// Copies every read from CUDA device `device`'s memory to the host, ordered after the work
// already queued on `stream`, through one pinned staging buffer and one synchronisation for
// the whole batch (each synchronisation idles the GPU until the next launch). Fails, naming
// the read, for host pointers, another device, a stream being captured into a CUDA graph,
// or a CUDA error; throws nothing.
Int32ReadFailure copy_device_int32_to_host(const std::vector<Int32Read>& reads, int device,
                                           void* stream);

}  // namespace flashtile::detail
