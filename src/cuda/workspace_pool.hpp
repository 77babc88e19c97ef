// Stream-ordered scratch for the kernels' workspaces (split-KV partials, the backward's fp32
// dQ accumulator and row sums), from one memory pool of flashtile's own per device.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace flashtile::detail {

// The device's pool. It keeps, across synchronisations, as many bytes as the largest
// workspace handed out so far (at least 64 MiB): the default pool would return them to the
// driver at every synchronisation and pay for mapping them again in the next call (as
// PyTorch's caching allocator, which the peers' workspaces come from, keeps them too).
cudaMemPool_t workspace_pool(int device);

// `bytes` from workspace_pool(device), ordered on `stream` (cudaMallocFromPoolAsync), the
// pool's keep raised to cover them first.
void* allocate_workspace(std::size_t bytes, int device, cudaStream_t stream);

}  // namespace flashtile::detail
