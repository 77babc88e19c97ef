// Small CUDA runtime helpers for callers that do not want to include cuda_runtime.h
// (the CLI, the tests, the Python module). All of them work in a CPU-only build:
// cuda_device_count() is 0 there and the rest throw flashtile::Error.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace flashtile {

// Number of usable CUDA devices (0 when CUDA is not compiled in or no driver/device).
int cuda_device_count();
// Why there is no CUDA device ("" when there is one).
std::string cuda_unavailable_reason();
std::string cuda_device_name(int index);
// Compute capability as major*10 + minor, e.g. 90 for Hopper.
int cuda_compute_capability(int index);
void cuda_synchronize(int index);

// Owning device allocation (cudaMalloc), released in the destructor.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(std::size_t bytes, int device_index = 0);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  int device_index() const { return device_; }
  // The three are complete on return, so work queued afterwards on any stream, including
  // a non-blocking one (which does not wait for the default stream), sees their bytes.
  void copy_from_host(const void* src, std::size_t bytes);
  void copy_to_host(void* dst, std::size_t bytes) const;
  // Fills every byte with `value` (0xFF makes fp32/fp16/bf16 NaNs: the poison for tests).
  void fill_bytes(unsigned char value);
  // The same, queued on the legacy default stream and not waited for (an L2 flush between
  // timed calls, which must not leave the GPU idle while the host queues the next one).
  void fill_bytes_async(unsigned char value);

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = 0;
};

// Times `fn` on the default stream of `device_index` with CUDA events:
// `warmup` untimed calls, then the median of `repeats` timed calls, in milliseconds.
// `before_each` runs before every timed call, outside the events (e.g. an L2 flush).
// The calls are queued back to back with an event pair around each and one synchronisation
// at the end, as triton.testing.do_bench times the PyTorch peers: while the GPU runs one
// call (or the flush before it), the host queues the next, so a call's time does not
// include the host's launch latency from an idle GPU. fn and before_each should not
// synchronise (a call that must, e.g. to read device-side lengths, is timed with its wait).
template <class Fn, class Before>
double cuda_median_ms(int device_index, int warmup, int repeats, Fn&& fn, Before&& before_each);
template <class Fn>
double cuda_median_ms(int device_index, int warmup, int repeats, Fn&& fn) {
  return cuda_median_ms(device_index, warmup, repeats, fn, [] {});
}

namespace detail {
// `pairs` start/stop event pairs recorded on the legacy default stream.
struct EventPairs;
EventPairs* event_pairs_create(int device_index, int pairs);
void event_pairs_destroy(EventPairs*);
void event_pairs_record(EventPairs*, int pair, bool stop);
// Synchronises on the last stop event; each pair's elapsed milliseconds.
std::vector<double> event_pairs_elapsed_ms(EventPairs*);
double median(std::vector<double>& values);
}  // namespace detail

}  // namespace flashtile

template <class Fn, class Before>
double flashtile::cuda_median_ms(int device_index, int warmup, int repeats, Fn&& fn,
                                 Before&& before_each) {
  detail::EventPairs* events = detail::event_pairs_create(device_index, repeats);
  std::vector<double> times;
  try {
    for (int i = 0; i < warmup; ++i) fn();
    for (int i = 0; i < repeats; ++i) {
      before_each();
      detail::event_pairs_record(events, i, /*stop=*/false);
      fn();
      detail::event_pairs_record(events, i, /*stop=*/true);
    }
    times = detail::event_pairs_elapsed_ms(events);
  } catch (...) {
    detail::event_pairs_destroy(events);
    throw;
  }
  detail::event_pairs_destroy(events);
  return detail::median(times);
}
