// The validator and the dispatcher: every check happens here, on the host, before any
// backend touches memory. A backend receives AttentionParams that are already valid.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "api/backend.hpp"
#include "flashtile/flashtile.hpp"

namespace flashtile {
namespace {

constexpr const char* kTensorNames[] = {"q", "k", "v", "out"};

template <class... Parts>
[[noreturn]] void fail(ErrorKind kind, const Parts&... parts) {
  std::ostringstream message;
  message << "flashtile::forward: ";
  (message << ... << parts);
  throw Error(kind, message.str());
}

// Byte range [first, last] a view can touch.
struct ByteRange {
  uintptr_t first, last;
  bool overlaps(const ByteRange& other) const { return first <= other.last && other.first <= last; }
};

ByteRange byte_range(const TensorView& t) {
  int64_t last_element = 0;
  for (int i = 0; i < 4; ++i) last_element += (t.shape[i] - 1) * t.strides[i];
  auto first = reinterpret_cast<uintptr_t>(t.data);
  return {first, first + static_cast<uintptr_t>(last_element + 1) * dtype_size(t.dtype) - 1};
}

void check_view(const TensorView& t, const char* name) {
  if (t.data == nullptr) fail(ErrorKind::invalid_argument, name, ".data is null");
  static constexpr const char* kDims[] = {"batch", "seqlen", "heads", "head_dim"};
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] <= 0)
      fail(ErrorKind::invalid_argument, name, ".shape[", i, "] (", kDims[i],
           ") must be positive, got ", t.shape[i]);
  }
  if (t.strides[3] != 1)
    fail(ErrorKind::invalid_argument, name, ".strides[3] (head_dim stride) must be 1, got ",
         t.strides[3]);
  for (int i = 0; i < 3; ++i) {
    if (t.strides[i] < 0)
      fail(ErrorKind::invalid_argument, name, ".strides[", i, "] must be non-negative, got ",
           t.strides[i]);
  }
  if (t.device.type == DeviceType::cuda && t.device.index < 0)
    fail(ErrorKind::invalid_argument, name, ".device index must be >= 0, got ", t.device.index);
}

void expect_dim(const TensorView& t, const char* name, int dim, int64_t expected,
                const char* what) {
  if (t.shape[dim] != expected)
    fail(ErrorKind::invalid_argument, name, ".shape[", dim, "] must equal ", what, " (expected ",
         expected, ", got ", t.shape[dim], ")");
}

}  // namespace

detail::AttentionParams detail::validate(const TensorView& q, const TensorView& k,
                                         const TensorView& v, const TensorView* out_or_null,
                                         const Options& options) {
  // Without an output (the oracle's case) q stands in for it in the per-view checks.
  const TensorView& out = out_or_null ? *out_or_null : q;
  const TensorView* views[] = {&q, &k, &v, &out};
  const int n_views = out_or_null ? 4 : 3;
  for (int i = 0; i < n_views; ++i) check_view(*views[i], kTensorNames[i]);

  for (int i = 1; i < n_views; ++i) {
    if (views[i]->dtype != q.dtype)
      fail(ErrorKind::dtype, kTensorNames[i], ".dtype must match q.dtype (expected ",
           dtype_name(q.dtype), ", got ", dtype_name(views[i]->dtype), ")");
    if (!(views[i]->device == q.device))
      fail(ErrorKind::invalid_argument, kTensorNames[i],
           ".device must match q.device (expected ", device_name(q.device), ", got ",
           device_name(views[i]->device), ")");
  }

  expect_dim(k, "k", 0, q.batch(), "q batch");
  expect_dim(v, "v", 0, q.batch(), "q batch");
  expect_dim(k, "k", 3, q.head_dim(), "q head_dim");
  expect_dim(v, "v", 3, q.head_dim(), "q head_dim");
  expect_dim(v, "v", 1, k.seqlen(), "k seqlen");
  expect_dim(v, "v", 2, k.heads(), "k heads");
  if (q.heads() % k.heads() != 0)
    fail(ErrorKind::invalid_argument, "q heads (", q.heads(), ") must be a multiple of k heads (",
         k.heads(), ") for GQA/MQA");
  if (out_or_null != nullptr) {
    for (int i = 0; i < 4; ++i) expect_dim(out, "out", i, q.shape[i], "the q dimension");
    const ByteRange out_range = byte_range(out);
    for (int i = 0; i < 3; ++i) {
      if (out_range.overlaps(byte_range(*views[i])))
        fail(ErrorKind::invalid_argument, "out must not overlap ", kTensorNames[i]);
    }
  }
  if (options.lse != nullptr) {
    auto first = reinterpret_cast<uintptr_t>(options.lse);
    ByteRange lse_range{first, first + static_cast<uintptr_t>(q.batch() * q.heads() * q.seqlen()) *
                                           sizeof(float) - 1};
    for (int i = 0; i < n_views; ++i) {
      if (lse_range.overlaps(byte_range(*views[i])))
        fail(ErrorKind::invalid_argument, "lse must not overlap ", kTensorNames[i]);
    }
  }

  float scale = 1.0f / std::sqrt(static_cast<float>(q.head_dim()));
  if (options.scale) {
    if (!std::isfinite(*options.scale))
      fail(ErrorKind::invalid_argument, "scale must be finite, got ", *options.scale);
    scale = *options.scale;
  }

  detail::AttentionParams p;
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = out.data;
  p.lse = options.lse;
  p.dtype = q.dtype;
  p.device_index = q.device.index;
  p.stream = options.stream;
  p.batch = q.batch();
  p.seqlen_q = q.seqlen();
  p.seqlen_k = k.seqlen();
  p.heads_q = q.heads();
  p.heads_kv = k.heads();
  p.head_dim = q.head_dim();
  auto strides = [](const TensorView& t, int64_t& b, int64_t& s, int64_t& h) {
    b = t.strides[0];
    s = t.strides[1];
    h = t.strides[2];
  };
  strides(q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  strides(k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  strides(v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  strides(out, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  p.scale = scale;
  p.causal = options.causal;
  return p;
}

namespace {

const detail::BackendEntry* find_entry(Backend backend) {
  for (const auto& entry : detail::backend_registry())
    if (entry.id == backend) return &entry;
  return nullptr;
}

const detail::BackendEntry& choose(const detail::AttentionParams& p, DeviceType device,
                                   Backend requested) {
  if (requested != Backend::automatic) {
    // Where a backend runs is known even when it is not compiled in, so a device mismatch
    // is reported the same way in every build.
    if (backend_device(requested) != device)
      fail(ErrorKind::invalid_argument, "backend ", backend_name(requested), " runs on ",
           backend_device(requested) == DeviceType::cpu ? "cpu" : "cuda",
           " but the tensors are on ", device == DeviceType::cpu ? "cpu" : "cuda");
    const detail::BackendEntry* entry = find_entry(requested);
    if (entry == nullptr)
      fail(ErrorKind::unsupported, "backend ", backend_name(requested),
           " is not compiled into this build");
    if (std::string why = entry->unavailable_reason(); !why.empty())
      fail(ErrorKind::unsupported, "backend ", backend_name(requested), " is not available: ", why);
    if (std::string why = entry->unsupported_reason(p); !why.empty())
      fail(ErrorKind::unsupported, "backend ", backend_name(requested), " cannot run this call: ",
           why);
    return *entry;
  }
  const detail::BackendEntry* best = nullptr;
  std::string reasons;
  for (const auto& entry : detail::backend_registry()) {
    if (entry.device != device) continue;
    std::string why = entry.unavailable_reason();
    if (why.empty()) why = entry.unsupported_reason(p);
    if (!why.empty()) {
      reasons += std::string("; ") + std::string(backend_name(entry.id)) + ": " + why;
      continue;
    }
    if (best == nullptr || entry.priority > best->priority) best = &entry;
  }
  if (best == nullptr) fail(ErrorKind::unsupported, "no backend can run this call", reasons);
  return *best;
}

}  // namespace

std::size_t dtype_size(DType dtype) { return dtype == DType::f32 ? 4 : 2; }

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "f32" || name == "float32" || name == "fp32") return DType::f32;
  if (name == "f16" || name == "float16" || name == "fp16" || name == "half") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  return std::nullopt;
}

std::string device_name(Device device) {
  return device.type == DeviceType::cpu ? "cpu" : "cuda:" + std::to_string(device.index);
}

TensorView TensorView::contiguous(void* data, DType dtype, Device device,
                                  std::array<int64_t, 4> shape) {
  return {data, dtype, device, shape,
          {shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1}};
}

std::string_view backend_name(Backend backend) {
  switch (backend) {
    case Backend::automatic: return "auto";
    case Backend::cpu_reference: return "cpu_reference";
    case Backend::cpu_standard: return "cpu_standard";
    case Backend::cpu_flash: return "cpu_flash";
    case Backend::cuda_naive: return "cuda_naive";
    case Backend::cuda_tiled: return "cuda_tiled";
    case Backend::cuda_mma: return "cuda_mma";
  }
  return "?";
}

const std::vector<Backend>& all_backends() {
  static const std::vector<Backend> backends = {Backend::cpu_reference, Backend::cpu_standard,
                                                Backend::cpu_flash,     Backend::cuda_naive,
                                                Backend::cuda_tiled,    Backend::cuda_mma};
  return backends;
}

std::optional<Backend> parse_backend(std::string_view name) {
  if (name == "auto") return Backend::automatic;
  for (Backend b : all_backends())
    if (backend_name(b) == name) return b;
  return std::nullopt;
}

DeviceType backend_device(Backend backend) {
  switch (backend) {
    case Backend::cuda_naive:
    case Backend::cuda_tiled:
    case Backend::cuda_mma: return DeviceType::cuda;
    default: return DeviceType::cpu;
  }
}

bool backend_available(Backend backend) { return backend_unavailable_reason(backend).empty(); }

std::string backend_unavailable_reason(Backend backend) {
  if (backend == Backend::automatic) return "";
  const detail::BackendEntry* entry = find_entry(backend);
  if (entry == nullptr) return "not compiled into this build";
  return entry->unavailable_reason();
}

Plan plan(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
          const Options& options) {
  const detail::AttentionParams p = detail::validate(q, k, v, &out, options);
  const detail::BackendEntry& entry = choose(p, q.device.type, options.backend);
  return {entry.id, entry.workspace_bytes(p)};
}

void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const Options& options) {
  const detail::AttentionParams p = detail::validate(q, k, v, &out, options);
  choose(p, q.device.type, options.backend).run(p);
}

}  // namespace flashtile
