// Host and device helpers shared by every CUDA kernel generation.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>

#include "api/backend.hpp"
#include "flashtile/device.hpp"

namespace flashtile::detail {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(ErrorKind::runtime, std::string(what) + ": " + cudaGetErrorString(status));
}

// Call after every launch: reports bad launch configurations at once.
inline void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

inline std::string cuda_backend_unavailable() { return cuda_unavailable_reason(); }

// The compute capability of CUDA device `device_index`; `why` says why it could not be
// queried (the CUDA error is then cleared), "" when it was.
struct ComputeCapability {
  int major = 0, minor = 0;
  std::string why;  // "" when queried
  int number() const { return major * 10 + minor; }
  std::string text() const { return std::to_string(major) + "." + std::to_string(minor); }
};
inline ComputeCapability compute_capability(int device_index) {
  ComputeCapability cc;
  if (cudaDeviceGetAttribute(&cc.major, cudaDevAttrComputeCapabilityMajor, device_index) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&cc.minor, cudaDevAttrComputeCapabilityMinor, device_index) !=
          cudaSuccess) {
    cudaGetLastError();
    cc.why = "cannot query CUDA device " + std::to_string(device_index);
  }
  return cc;
}

// What the backends ask of a device on every call, read from the driver once per device: a
// small call (the write-up's case runs in ~20 us) waits for every host step in front of its
// first launch.
struct DeviceFacts {
  ComputeCapability cc;
  int sms = 0, smem_per_sm = 0, smem_optin = 0;
  bool cooperative_launch = false;  // a grid whose CTAs all run at once, with a grid barrier
};
inline DeviceFacts read_device_facts(int device, const ComputeCapability& cc) {
  DeviceFacts facts;
  facts.cc = cc;
  check_cuda(cudaDeviceGetAttribute(&facts.sms, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(MultiProcessorCount)");
  check_cuda(cudaDeviceGetAttribute(&facts.smem_per_sm,
                                    cudaDevAttrMaxSharedMemoryPerMultiprocessor, device),
             "cudaDeviceGetAttribute(MaxSharedMemoryPerMultiprocessor)");
  check_cuda(cudaDeviceGetAttribute(&facts.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                    device),
             "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  int cooperative = 0;
  check_cuda(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device),
             "cudaDeviceGetAttribute(CooperativeLaunch)");
  facts.cooperative_launch = cooperative != 0;
  return facts;
}
// The facts of `device`, read once; null, with `why` set, when the device cannot be queried
// (a bad index: asked again on the next call, which fails the same way). A call asks
// several times; devices 0-63 are found without the lock once read.
inline const DeviceFacts* find_device_facts(int device, std::string& why) {
  constexpr int kCached = 64;
  static std::atomic<const DeviceFacts*> cached[kCached] = {};
  const bool cacheable = device >= 0 && device < kCached;
  if (cacheable)
    if (const DeviceFacts* known = cached[device].load(std::memory_order_acquire)) return known;
  static std::mutex mutex;
  static auto* facts = new std::map<int, DeviceFacts>();  // lives as long as the process
  const std::lock_guard<std::mutex> lock(mutex);
  if (auto found = facts->find(device); found != facts->end()) return &found->second;
  const ComputeCapability cc = compute_capability(device);
  if (!cc.why.empty()) {
    why = cc.why;
    return nullptr;
  }
  const DeviceFacts* read = &facts->emplace(device, read_device_facts(device, cc)).first->second;
  if (cacheable) cached[device].store(read, std::memory_order_release);
  return read;
}
// The facts of a device a call has already been checked against (device_unsuitable).
inline const DeviceFacts& device_facts(int device) {
  std::string why;
  const DeviceFacts* facts = find_device_facts(device, why);
  if (facts == nullptr) throw Error(ErrorKind::runtime, why);
  return *facts;
}

// Raises `kernel`'s dynamic shared-memory limit to `bytes` on `device` once (bit `device`
// of `raised`, one per kernel, remembers it; devices 64 and above are raised on every call):
// the driver call is host time in front of every launch, which a small call like the
// write-up's waits for.
template <class Kernel>
void raise_smem_limit_once(Kernel* kernel, int bytes, int device, std::atomic<uint64_t>& raised) {
  const uint64_t bit = device < 64 ? uint64_t(1) << device : 0;
  if (bit != 0 && (raised.load(std::memory_order_acquire) & bit) != 0) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
             "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  raised.fetch_or(bit, std::memory_order_acq_rel);
}
// The same for a kernel known by its address alone (kernels of one signature share a
// function type): a lock and a lookup in front of the launch instead of the driver call.
inline void raise_smem_limit_once(const void* kernel, int bytes, int device) {
  static std::mutex mutex;
  static auto* raised = new std::set<std::tuple<const void*, int, int>>();  // process lifetime
  const std::lock_guard<std::mutex> lock(mutex);
  if (raised->count({kernel, bytes, device}) != 0) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
             "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  raised->insert({kernel, bytes, device});
}

// Grid: x = query blocks, y = heads, z = batch. y and z are limited to 65535 by CUDA.
inline std::string grid_unsupported(const AttentionParams& p) {
  if (p.heads_q > 65535) return "heads_q must be <= 65535, got " + std::to_string(p.heads_q);
  if (p.batch > 65535) return "batch must be <= 65535, got " + std::to_string(p.batch);
  return "";
}

// Runs fn(std::integral_constant<int, D>{}) for the compiled head dim D == head_dim.
// Returns false when head_dim is not one of kHeadDims.
template <int... kHeadDims, class Fn>
bool dispatch_head_dim(int64_t head_dim, Fn&& fn) {
  return ((head_dim == kHeadDims ? (fn(std::integral_constant<int, kHeadDims>{}), true) : false) ||
          ...);
}

template <int... kHeadDims>
std::string head_dim_unsupported(const AttentionParams& p, const char* backend) {
  if (((p.head_dim == kHeadDims) || ...)) return "";
  std::string list;
  ((list += (list.empty() ? "" : ", ") + std::to_string(kHeadDims)), ...);
  return std::string(backend) + " supports head_dim " + list + "; got " +
         std::to_string(p.head_dim);
}

// Pointer to the first element of (batch b, row s, head h) in a strided BSHD tensor.
template <class T>
__host__ __device__ __forceinline__ T* bshd_ptr(T* base, int64_t b, int64_t s, int64_t h,
                                                int64_t batch_stride, int64_t row_stride,
                                                int64_t head_stride) {
  return base + b * batch_stride + s * row_stride + h * head_stride;
}

}  // namespace flashtile::detail
