// `flashtile info`: the version, how this build was configured, every backend with its
// availability, the SIMD target cpu_flash runs on, and the CUDA devices.
#include <cstdio>
#include <string>

#include "commands.hpp"
#include "flashtile/device.hpp"

namespace flashtile::cli {

int run_info() {
  const BuildInfo build = build_info();
  std::printf("flashtile %s\n", build.version.c_str());
  std::printf("build:      %s, %s%s\n", build.build_type.c_str(), build.compiler.c_str(),
              build.sanitizers.empty() ? "" : (", sanitizers " + build.sanitizers).c_str());
  std::printf("CUDA:       %s\n", build.cuda.c_str());
  std::printf("CPU SIMD:   %s%s\n", build.cpu_simd.c_str(),
              build.simd_target.empty() ? "" : (", running " + build.simd_target).c_str());
  const int devices = cuda_device_count();
  if (devices == 0) std::printf("devices:    none (%s)\n", cuda_unavailable_reason().c_str());
  for (int d = 0; d < devices; ++d)
    std::printf("device %d:   %s, compute capability %d.%d\n", d, cuda_device_name(d).c_str(),
                cuda_compute_capability(d) / 10, cuda_compute_capability(d) % 10);
  std::printf("backends:\n");
  for (Backend b : all_backends()) {
    const std::string why = backend_unavailable_reason(b);
    std::printf("  %-14s %-5s %s\n", std::string(backend_name(b)).c_str(),
                backend_device(b) == DeviceType::cpu ? "cpu" : "cuda",
                why.empty() ? "available" : ("unavailable: " + why).c_str());
  }
  return 0;
}

}  // namespace flashtile::cli
