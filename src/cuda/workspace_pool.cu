// The workspaces' pool (workspace_pool.hpp).
#include "cuda/workspace_pool.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>

#include "cuda/common.cuh"

namespace flashtile::detail {
namespace {

constexpr uint64_t kMinKeepBytes = uint64_t(64) << 20;

struct Pool {
  cudaMemPool_t pool = nullptr;
  uint64_t keep = 0;  // the release threshold set on it
};

std::mutex& pools_mutex() {
  static std::mutex mutex;
  return mutex;
}
// Under pools_mutex().
Pool& pool_of(int device) {
  static auto* pools = new std::map<int, Pool>();  // lives as long as the process
  Pool& entry = (*pools)[device];
  if (entry.pool == nullptr) {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    check_cuda(cudaMemPoolCreate(&entry.pool, &props), "cudaMemPoolCreate");
  }
  return entry;
}
void keep_at_least(Pool& entry, uint64_t bytes) {
  if (bytes <= entry.keep) return;
  check_cuda(cudaMemPoolSetAttribute(entry.pool, cudaMemPoolAttrReleaseThreshold, &bytes),
             "cudaMemPoolSetAttribute(ReleaseThreshold)");
  entry.keep = bytes;
}

}  // namespace

cudaMemPool_t workspace_pool(int device) {
  const std::lock_guard<std::mutex> lock(pools_mutex());
  Pool& entry = pool_of(device);
  keep_at_least(entry, kMinKeepBytes);
  return entry.pool;
}

void* allocate_workspace(std::size_t bytes, int device, cudaStream_t stream) {
  cudaMemPool_t pool = nullptr;
  {
    const std::lock_guard<std::mutex> lock(pools_mutex());
    Pool& entry = pool_of(device);
    keep_at_least(entry, std::max<uint64_t>(kMinKeepBytes, bytes));
    pool = entry.pool;
  }
  void* workspace = nullptr;
  check_cuda(cudaMallocFromPoolAsync(&workspace, bytes, pool, stream),
             "cudaMallocFromPoolAsync(workspace)");
  return workspace;
}

}  // namespace flashtile::detail
