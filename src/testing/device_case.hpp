// Mirrors a host AttentionCase on a CUDA device (same strided layouts, byte for byte),
// runs a backend there and copies the results back for verification.
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

struct DeviceCase {
  DeviceTensor q, k, v, out;
  DeviceBuffer lse;
  explicit DeviceCase(const AttentionCase& host, int device_index = 0)
      : q(host.q, device_index),
        k(host.k, device_index),
        v(host.v, device_index),
        out(host.out, device_index),
        lse(host.lse.size() * sizeof(float), device_index) {
    poison();
  }
  void poison() {
    out.buffer.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
  }
  Options options(const AttentionCase& host, Backend backend) {
    Options o;
    o.causal = host.shape.causal;
    o.backend = backend;
    o.lse = static_cast<float*>(lse.data());
    return o;
  }
  // Runs `backend` and copies out and lse back into `host` (whose outputs it overwrites).
  void run(AttentionCase& host, Backend backend) { run(host, options(host, backend)); }
  // The same with the caller's options (their lse is replaced by this case's buffer).
  void run(AttentionCase& host, Options o) {
    o.lse = static_cast<float*>(lse.data());
    forward(q.view, k.view, v.view, out.view, o);
    cuda_synchronize(out.buffer.device_index());
    copy_back(host);
  }
  void copy_back(AttentionCase& host) const {
    out.buffer.copy_to_host(host.out.bytes.data(), host.out.bytes.size());
    lse.copy_to_host(host.lse.data(), host.lse.size() * sizeof(float));
  }
};

}  // namespace flashtile::testing
