// `flashtile run`: attention on .npy files. Everything is read and validated before any
// output file is created; outputs appear only when the whole computation succeeded.
#include <cstdio>
#include <optional>

#include "commands.hpp"
#include "flashtile/device.hpp"
#include "npy.hpp"

namespace flashtile::cli {
namespace {

[[noreturn]] void bad_file(const std::string& what) {
  throw Error(ErrorKind::invalid_argument, what);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

// q, k or v: (batch, seqlen, heads, head_dim), or packed (total_tokens, heads, head_dim) for
// a varlen batch, which the library takes as (1, total_tokens, heads, head_dim).
TensorView host_view(NpyArray& array, const std::string& name, bool packed) {
  if (!array.is_float())
    bad_file(name + " must be float32, float16 or bfloat16, got " + array.describe());
  const size_t rank = packed ? 3 : 4;
  if (array.shape.size() != rank)
    bad_file(name + (packed ? " must have 3 dimensions (total_tokens, heads, head_dim) with "
                              "--cu-seqlens-q/k, got "
                            : " must have 4 dimensions (batch, seqlen, heads, head_dim), got ") +
             std::to_string(array.shape.size()));
  for (size_t i = 0; i < rank; ++i)
    if (array.shape[i] == 0) bad_file(name + " has an empty dimension " + std::to_string(i));
  const std::vector<int64_t>& s = array.shape;
  if (packed) return TensorView::packed(array.data.data(), array.dtype(), Device::cpu(), {s[0], s[1], s[2]});
  return TensorView::contiguous(array.data.data(), array.dtype(), Device::cpu(), {s[0], s[1], s[2], s[3]});
}

// A small parameter file: its type and one of the allowed shapes, else an error naming it.
void expect_param(const NpyArray& array, const std::string& name, NpyType type,
                  const std::vector<std::vector<int64_t>>& shapes, const std::string& meaning) {
  bool ok = array.type == type;
  if (ok) {
    ok = false;
    for (const auto& shape : shapes) ok |= array.shape == shape;
  }
  if (ok) return;
  std::string expected;
  for (const auto& shape : shapes) expected += (expected.empty() ? "" : " or ") + shape_text(shape);
  bad_file(name + " must be " + (type == NpyType::i32 ? "int32" : "float32") + " " + expected +
           " (" + meaning + "), got " + array.describe() +
           (type == NpyType::i32 && array.type != NpyType::i32 ? " (save it with .astype(np.int32))"
                                                               : ""));
}

// Bytes on the device where the backend runs (the host bytes themselves on the CPU).
struct Placed {
  std::optional<DeviceBuffer> buffer;
  void* data = nullptr;
};

Placed place(void* host, size_t bytes, bool on_gpu, bool upload) {
  Placed p{std::nullopt, host};
  if (!on_gpu || host == nullptr) return p;
  p.buffer.emplace(bytes, 0);
  if (upload) p.buffer->copy_from_host(host, bytes);
  p.data = p.buffer->data();
  return p;
}

Placed place(NpyArray* array, bool on_gpu) {
  if (array == nullptr) return {};
  return place(array->data.data(), array->data.size(), on_gpu, true);
}

TensorView on(const TensorView& host, const Placed& placed, bool on_gpu) {
  TensorView view = host;
  view.data = placed.data;
  if (on_gpu) view.device = Device::cuda(0);
  return view;
}

// An optional input file, read when its flag was given; errors name the flag.
std::optional<NpyArray> read_optional(const std::string& flag, const std::string& path) {
  if (path.empty()) return std::nullopt;
  try {
    return read_npy(path);
  } catch (const Error& e) {
    throw Error(e.kind(), flag + " " + e.what());
  }
}

NpyArray* pointer(std::optional<NpyArray>& array) { return array ? &*array : nullptr; }

}  // namespace

int run_run(const RunOptions& o) {
  if (o.cu_seqlens_q.empty() != o.cu_seqlens_k.empty())
    bad_file("--cu-seqlens-q and --cu-seqlens-k go together (a packed varlen batch needs both)");
  if (!o.seqused_k.empty() && o.cu_seqlens_q.empty())
    bad_file("--seqused-k needs --cu-seqlens-q and --cu-seqlens-k");
  const bool packed = !o.cu_seqlens_q.empty();

  NpyArray q_file = read_npy(o.q), k_file = read_npy(o.k), v_file = read_npy(o.v);
  const TensorView q = host_view(q_file, "--q " + o.q, packed),
                   k = host_view(k_file, "--k " + o.k, packed),
                   v = host_view(v_file, "--v " + o.v, packed);
  std::optional<NpyArray> slopes_file = read_optional("--alibi", o.alibi),
                          sinks_file = read_optional("--sinks", o.sinks),
                          cu_q_file = read_optional("--cu-seqlens-q", o.cu_seqlens_q),
                          cu_k_file = read_optional("--cu-seqlens-k", o.cu_seqlens_k),
                          used_file = read_optional("--seqused-k", o.seqused_k);

  int64_t batch = q.batch();  // sequences: the batch, or the cu_seqlens' length - 1
  if (packed) {
    const std::vector<int64_t> shape = cu_q_file->shape;
    if (cu_q_file->type != NpyType::i32 || shape.size() != 1 || shape[0] < 2)
      bad_file("--cu-seqlens-q " + o.cu_seqlens_q +
               " must be int32 (batch + 1,) with batch >= 1 (cumulative query offsets), got " +
               cu_q_file->describe() +
               (cu_q_file->type != NpyType::i32 ? " (save it with .astype(np.int32))" : ""));
    batch = shape[0] - 1;
    expect_param(*cu_k_file, "--cu-seqlens-k " + o.cu_seqlens_k, NpyType::i32, {{batch + 1}},
                 "cumulative key offsets, as long as --cu-seqlens-q");
    if (used_file)
      expect_param(*used_file, "--seqused-k " + o.seqused_k, NpyType::i32, {{batch}},
                   "keys used per sequence");
  }
  const int64_t heads = q.heads();
  if (slopes_file)
    expect_param(*slopes_file, "--alibi " + o.alibi, NpyType::f32, {{heads}, {batch, heads}},
                 "ALiBi slopes per query head, or per sequence and query head");
  if (sinks_file)
    expect_param(*sinks_file, "--sinks " + o.sinks, NpyType::f32, {{heads}},
                 "one sink logit per query head");

  Options options;
  options.causal = o.causal;
  if (o.has_scale) options.scale = static_cast<float>(o.scale);
  options.window = o.window;
  options.softcap = o.softcap;
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
  // [batch, heads, seqlen_q], or [heads, total_q] for a packed batch (q.batch() is 1 then).
  std::vector<float> lse(static_cast<size_t>(q.batch() * q.heads() * q.seqlen()));
  const TensorView out_host = TensorView::contiguous(out_bytes.data(), q.dtype, Device::cpu(), q.shape);

  auto attempt = [&](bool gpu) {
    const Device device = gpu ? Device::cuda(0) : Device::cpu();
    Placed pq = place(&q_file, gpu), pk = place(&k_file, gpu), pv = place(&v_file, gpu),
           po = place(out_bytes.data(), out_bytes.size(), gpu, false);
    Placed slopes = place(pointer(slopes_file), gpu), sinks = place(pointer(sinks_file), gpu),
           cu_q = place(pointer(cu_q_file), gpu), cu_k = place(pointer(cu_k_file), gpu),
           used = place(pointer(used_file), gpu);
    Options call = options;
    if (slopes_file) {
      const float* data = static_cast<const float*>(slopes.data);
      call.alibi_slopes = slopes_file->shape.size() == 1
                              ? ParamView::vector(data, device, heads)
                              : ParamView::matrix(data, device, batch, heads);
    }
    if (sinks_file) call.sinks = ParamView::vector(static_cast<const float*>(sinks.data), device, heads);
    std::optional<DeviceBuffer> lse_device;
    call.lse = o.lse.empty() ? nullptr : lse.data();
    if (gpu && call.lse != nullptr) {
      lse_device.emplace(lse.size() * sizeof(float), 0);
      call.lse = static_cast<float*>(lse_device->data());
    }
    const TensorView qv = on(q, pq, gpu), kv = on(k, pk, gpu), vv = on(v, pv, gpu),
                     ov = on(out_host, po, gpu);
    Varlen varlen;
    varlen.cu_seqlens_q = static_cast<const int32_t*>(cu_q.data);
    varlen.cu_seqlens_k = static_cast<const int32_t*>(cu_k.data);
    varlen.seqused_k = static_cast<const int32_t*>(used.data);
    varlen.batch = batch;
    // Validation and backend choice happen here, before anything is written.
    const Plan plan = packed ? plan_varlen(qv, kv, vv, ov, varlen, call) : flashtile::plan(qv, kv, vv, ov, call);
    if (packed)
      forward_varlen(qv, kv, vv, ov, varlen, call);
    else
      forward(qv, kv, vv, ov, call);
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

  const std::vector<int64_t> out_shape = q_file.shape;
  const std::vector<int64_t> lse_shape =
      packed ? std::vector<int64_t>{q.heads(), q.seqlen()}
             : std::vector<int64_t>{q.batch(), q.heads(), q.seqlen()};
  const std::string out_temp = write_npy_temp(o.out, q.dtype, out_shape, out_bytes.data());
  std::string lse_temp;
  try {
    if (!o.lse.empty()) lse_temp = write_npy_temp(o.lse, DType::f32, lse_shape, lse.data());
    commit_npy(out_temp, o.out);
    if (!lse_temp.empty()) commit_npy(lse_temp, o.lse);
  } catch (...) {
    discard_npy(out_temp);
    if (!lse_temp.empty()) discard_npy(lse_temp);
    throw;
  }
  std::fprintf(stderr, "flashtile run: %s, out %s %s -> %s\n",
               std::string(backend_name(used)).c_str(), shape_text(out_shape).c_str(),
               std::string(dtype_name(q.dtype)).c_str(), o.out.c_str());
  return 0;
}

}  // namespace flashtile::cli
