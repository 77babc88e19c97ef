// flashtile/device.hpp: thin CUDA runtime helpers, compiled as plain C++ against cudart.
// In a CPU-only build they report no device and throw on use.
#include "flashtile/device.hpp"

#include <algorithm>
#include <string>

#include "flashtile/flashtile.hpp"
#include "runtime/host_copy.hpp"

#if FLASHTILE_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/device_guard.cuh"
#endif

namespace flashtile {

#if FLASHTILE_WITH_CUDA
namespace {
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(ErrorKind::runtime, std::string(what) + ": " + cudaGetErrorString(status));
}
}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

std::string cuda_unavailable_reason() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device (") + cudaGetErrorString(status) + ")";
  }
  return count > 0 ? "" : "no CUDA device found";
}

std::string cuda_device_name(int index) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
  return prop.name;
}

int cuda_compute_capability(int index) {
  int major = 0, minor = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index), "cc major");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index), "cc minor");
  return major * 10 + minor;
}

void cuda_synchronize(int index) {
  const detail::DeviceGuard on_device(index);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

DeviceBuffer::DeviceBuffer(std::size_t bytes, int device_index) : bytes_(bytes), device_(device_index) {
  const detail::DeviceGuard on_device(device_index);
  check(cudaMalloc(&data_, std::max<std::size_t>(bytes, 1)), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

// cudaMemcpy from pageable memory and cudaMemset of device memory may return before the
// device has finished them, ordered only on the legacy default stream: wait for that stream.
void DeviceBuffer::copy_from_host(const void* src, std::size_t bytes) {
  check(cudaMemcpy(data_, src, std::min(bytes, bytes_), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize after cudaMemcpy H2D");
}

void DeviceBuffer::copy_to_host(void* dst, std::size_t bytes) const {
  check(cudaMemcpy(dst, data_, std::min(bytes, bytes_), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

void DeviceBuffer::fill_bytes(unsigned char value) {
  check(cudaMemset(data_, value, bytes_), "cudaMemset");
  check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize after cudaMemset");
}

void DeviceBuffer::fill_bytes_async(unsigned char value) {
  const detail::DeviceGuard on_device(device_);
  check(cudaMemsetAsync(data_, value, bytes_, cudaStreamLegacy), "cudaMemsetAsync");
}

namespace detail {
struct EventPairs {
  std::vector<cudaEvent_t> start, stop;
};
EventPairs* event_pairs_create(int device_index, int pairs) {
  check(cudaSetDevice(device_index), "cudaSetDevice");
  auto* events = new EventPairs;
  auto create = [&](std::vector<cudaEvent_t>& into) {
    for (int i = 0; i < pairs; ++i) {
      cudaEvent_t event = nullptr;
      if (const cudaError_t status = cudaEventCreate(&event); status != cudaSuccess) {
        event_pairs_destroy(events);
        check(status, "cudaEventCreate");
      }
      into.push_back(event);
    }
  };
  create(events->start);
  create(events->stop);
  return events;
}
void event_pairs_destroy(EventPairs* events) {
  for (cudaEvent_t event : events->start) cudaEventDestroy(event);
  for (cudaEvent_t event : events->stop) cudaEventDestroy(event);
  delete events;
}
void event_pairs_record(EventPairs* events, int pair, bool stop) {
  check(cudaEventRecord((stop ? events->stop : events->start).at(size_t(pair))), "cudaEventRecord");
}
std::vector<double> event_pairs_elapsed_ms(EventPairs* events) {
  std::vector<double> times;
  if (events->stop.empty()) return times;
  // Events complete in stream order: the last stop covers every pair.
  check(cudaEventSynchronize(events->stop.back()), "cudaEventSynchronize");
  for (size_t i = 0; i < events->stop.size(); ++i) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, events->start[i], events->stop[i]), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  return times;
}
}  // namespace detail


namespace detail {
namespace {
// Page-locked staging memory of the calling thread, grown on demand and kept: a device-to-
// host copy into pageable memory goes through the driver's own staging, about twice as
// slow for these few bytes. One per thread, so concurrent callers never share it.
struct PinnedStaging {
  void* data = nullptr;
  size_t bytes = 0;
  ~PinnedStaging() {
    if (data != nullptr) cudaFreeHost(data);
  }
  cudaError_t reserve(size_t needed) {
    if (needed <= bytes) return cudaSuccess;
    if (data != nullptr) cudaFreeHost(data);
    data = nullptr;
    bytes = 0;
    const cudaError_t status = cudaHostAlloc(&data, needed, cudaHostAllocDefault);
    if (status == cudaSuccess) bytes = needed;
    return status;
  }
};
thread_local PinnedStaging staging;
}  // namespace

Int32ReadFailure copy_device_int32_to_host(const std::vector<Int32Read>& reads, int device,
                                           void* stream_ptr) {
  auto error = [](const char* what, cudaError_t status) {
    cudaGetLastError();
    return std::string(what) + " failed: " + cudaGetErrorString(status);
  };
  size_t total = 0;
  for (size_t r = 0; r < reads.size(); ++r) {
    cudaPointerAttributes attributes{};
    if (cudaError_t status = cudaPointerGetAttributes(&attributes, reads[r].src);
        status != cudaSuccess)
      return {error("cudaPointerGetAttributes", status), r};
    if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
      return {"must point to CUDA device memory (got host memory)", r};
    if (attributes.type == cudaMemoryTypeDevice && attributes.device != device)
      return {"must be on cuda:" + std::to_string(device) + " (got cuda:" +
                  std::to_string(attributes.device) + ")",
              r};
    total += static_cast<size_t>(reads[r].n);
  }
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  try {
    const DeviceGuard on_device(device);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaError_t status = cudaStreamIsCapturing(stream, &capture); status != cudaSuccess)
      return {error("cudaStreamIsCapturing", status), 0};
    if (capture != cudaStreamCaptureStatusNone)
      return {"are read on the host for validation, which cannot happen while the stream is "
              "being captured into a CUDA graph",
              0};
    if (cudaError_t status = staging.reserve(total * sizeof(int32_t)); status != cudaSuccess)
      return {error("allocating pinned memory to read them", status), 0};
    auto* host = static_cast<int32_t*>(staging.data);
    size_t offset = 0;
    for (size_t r = 0; r < reads.size(); ++r) {
      const size_t n = static_cast<size_t>(reads[r].n);
      if (cudaError_t status = cudaMemcpyAsync(host + offset, reads[r].src, n * sizeof(int32_t),
                                               cudaMemcpyDeviceToHost, stream);
          status != cudaSuccess)
        return {error("reading them", status), r};
      offset += n;
    }
    if (cudaError_t status = cudaStreamSynchronize(stream); status != cudaSuccess)
      return {error("reading them", status), 0};
    offset = 0;
    for (const Int32Read& read : reads) {
      read.dst->assign(host + offset, host + offset + read.n);
      offset += static_cast<size_t>(read.n);
    }
  } catch (const Error& e) {
    return {e.what(), 0};
  }
  return {};
}
}  // namespace detail

#else  // CPU-only build

namespace {
[[noreturn]] void no_cuda() {
  throw Error(ErrorKind::unsupported, "flashtile was built without CUDA");
}
}  // namespace

int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() { return "flashtile was built without CUDA"; }
std::string cuda_device_name(int) { no_cuda(); }
int cuda_compute_capability(int) { no_cuda(); }
void cuda_synchronize(int) { no_cuda(); }
DeviceBuffer::DeviceBuffer(std::size_t, int) { no_cuda(); }
DeviceBuffer::~DeviceBuffer() = default;
void DeviceBuffer::copy_from_host(const void*, std::size_t) { no_cuda(); }
void DeviceBuffer::copy_to_host(void*, std::size_t) const { no_cuda(); }
void DeviceBuffer::fill_bytes(unsigned char) { no_cuda(); }
void DeviceBuffer::fill_bytes_async(unsigned char) { no_cuda(); }
namespace detail {
struct EventPairs {};
EventPairs* event_pairs_create(int, int) { no_cuda(); }
void event_pairs_destroy(EventPairs*) {}
void event_pairs_record(EventPairs*, int, bool) { no_cuda(); }
std::vector<double> event_pairs_elapsed_ms(EventPairs*) { no_cuda(); }
}  // namespace detail
namespace detail {
Int32ReadFailure copy_device_int32_to_host(const std::vector<Int32Read>&, int, void*) {
  return {"flashtile was built without CUDA", 0};
}
}  // namespace detail

#endif

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(other.data_), bytes_(other.bytes_), device_(other.device_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer old(std::move(*this));
    data_ = other.data_;
    bytes_ = other.bytes_;
    device_ = other.device_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

double detail::median(std::vector<double>& values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace flashtile
