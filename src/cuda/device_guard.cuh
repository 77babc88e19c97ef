// Runs a scope on the tensors' CUDA device and gives the caller back its current device,
// whatever happens in between (a backend must never change global state).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flashtile/flashtile.hpp"

namespace flashtile::detail {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ == device) {  // already current (the usual case): nothing to set or restore
      previous_ = -1;
      return;
    }
    if (const cudaError_t status = cudaSetDevice(device); status != cudaSuccess) {
      cudaGetLastError();
      throw Error(ErrorKind::runtime, std::string("cudaSetDevice(") + std::to_string(device) +
                                          "): " + cudaGetErrorString(status));
    }
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace flashtile::detail
