// `flashtile run`: attention on .npy files. Everything is read and validated before any
// output file is created; outputs appear only when the whole computation succeeded.
#include <cstdio>
#include <optional>

#include "commands.hpp"
#include "flashtile/device.hpp"
#include "npy.hpp"

namespace flashtile::cli {
namespace {

TensorView host_view(NpyArray& array, const std::string& name) {
  if (array.shape.size() != 4)
    throw Error(ErrorKind::invalid_argument,
                name + " must have 4 dimensions (batch, seqlen, heads, head_dim), got " +
                    std::to_string(array.shape.size()));
  for (size_t i = 0; i < 4; ++i)
    if (array.shape[i] == 0)
      throw Error(ErrorKind::invalid_argument, name + " has an empty dimension " + std::to_string(i));
  return TensorView::contiguous(array.data.data(), array.dtype, Device::cpu(),
                                {array.shape[0], array.shape[1], array.shape[2], array.shape[3]});
}

// A view's bytes on the device where the backend runs.
struct Placed {
  std::optional<DeviceBuffer> buffer;
  TensorView view;
};

Placed place(const TensorView& host, size_t bytes, bool on_gpu, bool upload) {
  Placed p{std::nullopt, host};
  if (!on_gpu) return p;
  p.buffer.emplace(bytes, 0);
  if (upload) p.buffer->copy_from_host(host.data, bytes);
  p.view.data = p.buffer->data();
  p.view.device = Device::cuda(0);
  return p;
}

}  // namespace

int run_run(const RunOptions& o) {
  NpyArray q_file = read_npy(o.q), k_file = read_npy(o.k), v_file = read_npy(o.v);
  const TensorView q = host_view(q_file, "--q " + o.q), k = host_view(k_file, "--k " + o.k),
                   v = host_view(v_file, "--v " + o.v);

  Options options;
  options.causal = o.causal;
  if (o.has_scale) options.scale = static_cast<float>(o.scale);
  const auto backend = parse_backend(o.backend);
  if (!backend) parse_backend_list({o.backend});  // throws with the list of known names
  options.backend = *backend;
  if (*backend != Backend::automatic && !backend_available(*backend))
    throw Error(ErrorKind::unsupported, "--backend " + o.backend + " is not available: " +
                                            backend_unavailable_reason(*backend));

  bool on_gpu = false;
  if (o.device == "cuda") {
    if (cuda_device_count() == 0)
      throw Error(ErrorKind::unsupported, "--device cuda: " + cuda_unavailable_reason());
    on_gpu = true;
  } else if (o.device == "auto") {
    on_gpu = *backend == Backend::automatic ? cuda_device_count() > 0
                                            : backend_device(*backend) == DeviceType::cuda;
  }

  std::vector<unsigned char> out_bytes(q_file.data.size());
  std::vector<float> lse(static_cast<size_t>(q.batch() * q.heads() * q.seqlen()));
  const TensorView out_host = TensorView::contiguous(out_bytes.data(), q.dtype, Device::cpu(), q.shape);

  auto attempt = [&](bool gpu) {
    Placed pq = place(q, q_file.data.size(), gpu, true), pk = place(k, k_file.data.size(), gpu, true),
           pv = place(v, v_file.data.size(), gpu, true),
           po = place(out_host, out_bytes.size(), gpu, false);
    std::optional<DeviceBuffer> lse_device;
    Options call = options;
    call.lse = o.lse.empty() ? nullptr : lse.data();
    if (gpu && call.lse != nullptr) {
      lse_device.emplace(lse.size() * sizeof(float), 0);
      call.lse = static_cast<float*>(lse_device->data());
    }
    // Validation and backend choice happen here, before anything is written.
    const Plan plan = flashtile::plan(pq.view, pk.view, pv.view, po.view, call);
    forward(pq.view, pk.view, pv.view, po.view, call);
    if (gpu) {
      cuda_synchronize(0);
      po.buffer->copy_to_host(out_bytes.data(), out_bytes.size());
      if (lse_device) lse_device->copy_to_host(lse.data(), lse.size() * sizeof(float));
    }
    return plan.backend;
  };

  Backend used;
  if (on_gpu && o.device == "auto" && *backend == Backend::automatic) {
    // auto on a GPU machine: fall back to the CPU when no CUDA backend takes this call.
    try {
      used = attempt(true);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::unsupported) throw;
      std::fprintf(stderr, "flashtile run: no CUDA backend for this call (%s); using the CPU\n",
                   e.what());
      used = attempt(false);
    }
  } else {
    used = attempt(on_gpu);
  }

  const std::string out_temp =
      write_npy_temp(o.out, q.dtype, {q.batch(), q.seqlen(), q.heads(), q.head_dim()}, out_bytes.data());
  std::string lse_temp;
  try {
    if (!o.lse.empty())
      lse_temp = write_npy_temp(o.lse, DType::f32, {q.batch(), q.heads(), q.seqlen()}, lse.data());
    commit_npy(out_temp, o.out);
    if (!lse_temp.empty()) commit_npy(lse_temp, o.lse);
  } catch (...) {
    discard_npy(out_temp);
    if (!lse_temp.empty()) discard_npy(lse_temp);
    throw;
  }
  std::fprintf(stderr, "flashtile run: %s, out (%lld, %lld, %lld, %lld) %s -> %s\n",
               std::string(backend_name(used)).c_str(), (long long)q.batch(), (long long)q.seqlen(),
               (long long)q.heads(), (long long)q.head_dim(), std::string(dtype_name(q.dtype)).c_str(),
               o.out.c_str());
  return 0;
}

}  // namespace flashtile::cli
