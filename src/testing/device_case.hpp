// Mirrors a host AttentionCase on a CUDA device (same strided layouts, byte for byte; the
// variant's slopes and sinks and the varlen cu_seqlens too), runs a backend there and copies
// the results back for verification.
#pragma once

#include "flashtile/device.hpp"
#include "testing/attention_case.hpp"

namespace flashtile::testing {

struct DeviceTensor {
  DeviceBuffer buffer;
  TensorView view;
  explicit DeviceTensor(const HostTensor& host, int device_index = 0)
      : buffer(host.bytes.size(), device_index) {
    buffer.copy_from_host(host.bytes.data(), host.bytes.size());
    view = host.view;
    view.data = buffer.data();
    view.device = Device::cuda(device_index);
  }
};

// A device copy of a small host vector (empty stays unallocated: data() is then null).
template <class T>
struct DeviceArray {
  DeviceBuffer buffer;
  DeviceArray(const std::vector<T>& host, int device_index) {
    if (host.empty()) return;
    buffer = DeviceBuffer(host.size() * sizeof(T), device_index);
    buffer.copy_from_host(host.data(), host.size() * sizeof(T));
  }
  T* data() const { return static_cast<T*>(buffer.data()); }
};

struct DeviceCase {
  DeviceTensor q, k, v, out;
  DeviceBuffer lse;
  DeviceArray<float> alibi_slopes, sinks;
  DeviceArray<int32_t> cu_seqlens_q, cu_seqlens_k, seqused_k;
  int device_index;

  explicit DeviceCase(const AttentionCase& host, int device_index_ = 0)
      : q(host.q, device_index_),
        k(host.k, device_index_),
        v(host.v, device_index_),
        out(host.out, device_index_),
        lse(host.lse.size() * sizeof(float), device_index_),
        alibi_slopes(host.alibi_slopes, device_index_),
        sinks(host.sinks, device_index_),
        cu_seqlens_q(host.cu_seqlens_q, device_index_),
        cu_seqlens_k(host.cu_seqlens_k, device_index_),
        seqused_k(host.seqused_k, device_index_),
        device_index(device_index_) {
    poison();
  }
  void poison() {
    out.buffer.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
  }
  Options options(const AttentionCase& host, Backend backend) const {
    Options o = host.options_with(alibi_slopes.data(), sinks.data(), Device::cuda(device_index));
    o.backend = backend;
    o.lse = static_cast<float*>(lse.data());
    return o;
  }
  std::optional<Varlen> varlen(const AttentionCase& host) const {
    return host.varlen_with(cu_seqlens_q.data(), cu_seqlens_k.data(), seqused_k.data());
  }
  // Runs `backend` and copies out and lse back into `host` (whose outputs it overwrites).
  void run(AttentionCase& host, Backend backend) { run(host, options(host, backend)); }
  // The same with the caller's options (their lse is replaced by this case's buffer).
  void run(AttentionCase& host, Options o) {
    o.lse = static_cast<float*>(lse.data());
    run_forward(q.view, k.view, v.view, out.view, o, varlen(host));
    cuda_synchronize(out.buffer.device_index());
    copy_back(host);
  }
  void copy_back(AttentionCase& host) const {
    out.buffer.copy_to_host(host.out.bytes.data(), host.out.bytes.size());
    lse.copy_to_host(host.lse.data(), host.lse.size() * sizeof(float));
  }
};

}  // namespace flashtile::testing
