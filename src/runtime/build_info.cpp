// flashtile::version() and build_info(): what CMake configured (build_config.hpp, generated
// from build_config.hpp.in) and what cpu_flash chooses on this CPU.
#include <string>

#include "build_config.hpp"
#include "flashtile/flashtile.hpp"

#if FLASHTILE_WITH_HWY
#include "cpu/flash.hpp"
#endif
#if FLASHTILE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace flashtile {

std::string_view version() { return FLASHTILE_VERSION; }

BuildInfo build_info() {
  BuildInfo info;
  info.version = FLASHTILE_VERSION;
  info.build_type = FLASHTILE_BUILD_TYPE;
#if defined(__clang__)
  info.compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  info.compiler = "GCC " __VERSION__;
#else
  info.compiler = "unknown";
#endif
#if FLASHTILE_WITH_CUDA
  info.cuda = "CUDA runtime " + std::to_string(CUDART_VERSION / 1000) + "." +
              std::to_string(CUDART_VERSION % 1000 / 10) + ", architectures " FLASHTILE_CUDA_ARCHS;
#else
  info.cuda = "off";
#endif
#if FLASHTILE_WITH_HWY
  info.cpu_simd = std::string("Google Highway ") + FLASHTILE_HWY_VERSION;
  info.simd_target = detail::cpu_flash::geometry(64).target;
#else
  info.cpu_simd = "off";
#endif
  info.sanitizers = FLASHTILE_SANITIZERS;
  return info;
}

}  // namespace flashtile
