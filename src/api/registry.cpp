// The list of backends compiled into this build. Adding a backend = one factory here.
#include "api/backend.hpp"

namespace flashtile::detail {

BackendEntry make_cpu_reference_backend();
BackendEntry make_cpu_standard_backend();
BackendEntry make_cpu_flash_backend();
#if FLASHTILE_WITH_CUDA
BackendEntry make_cuda_naive_backend();
BackendEntry make_cuda_tiled_backend();
BackendEntry make_cuda_tf32x3_backend();
BackendEntry make_cuda_mma_backend();
BackendEntry make_cuda_sm90_backend();
#endif

const std::vector<BackendEntry>& backend_registry() {
  static const std::vector<BackendEntry> registry = [] {
    std::vector<BackendEntry> entries = {make_cpu_reference_backend(), make_cpu_standard_backend(),
                                         make_cpu_flash_backend()};
#if FLASHTILE_WITH_CUDA
    entries.push_back(make_cuda_naive_backend());
    entries.push_back(make_cuda_tiled_backend());
    entries.push_back(make_cuda_tf32x3_backend());
    entries.push_back(make_cuda_mma_backend());
    entries.push_back(make_cuda_sm90_backend());
#endif
    return entries;
  }();
  return registry;
}

}  // namespace flashtile::detail
