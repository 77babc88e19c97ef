// The dispatcher: validate (src/api/validate.cpp), choose a backend, run it. One selector
// answers "supported?" for forward, plan and the varlen entry points alike.
#include <cstdint>
#include <sstream>

#include "api/backend.hpp"
#include "flashtile/flashtile.hpp"

namespace flashtile {
namespace {

const detail::BackendEntry* find_entry(Backend backend) {
  for (const auto& entry : detail::backend_registry())
    if (entry.id == backend) return &entry;
  return nullptr;
}

template <class... Parts>
[[noreturn]] void fail(const char* api, ErrorKind kind, const Parts&... parts) {
  std::ostringstream message;
  message << api << ": ";
  (message << ... << parts);
  throw Error(kind, message.str());
}

// Why `entry` cannot run p: forward's reason, and for a backward call (`backward` given)
// also a missing backward or the backward's own reason.
std::string refusal(const detail::BackendEntry& entry, const detail::AttentionParams& p,
                    const detail::BackwardParams* backward) {
  if (backward != nullptr && entry.run_backward == nullptr)
    return std::string(backend_name(entry.id)) + " has no backward pass";
  if (std::string why = entry.unsupported_reason(p); !why.empty()) return why;
  if (backward != nullptr && entry.backward_unsupported_reason != nullptr)
    return entry.backward_unsupported_reason(*backward);
  return "";
}

// The priority of `entry` for this call in automatic selection: the per-call rule of the
// pass it was measured on, or the entry's priority.
int rank(const detail::BackendEntry& entry, const detail::AttentionParams& p,
         const detail::BackwardParams* backward) {
  if (backward != nullptr)
    return entry.backward_priority_for != nullptr ? entry.backward_priority_for(*backward)
                                                  : entry.priority;
  return entry.priority_for != nullptr ? entry.priority_for(p) : entry.priority;
}

const detail::BackendEntry& choose(const detail::AttentionParams& p, DeviceType device,
                                   Backend requested, const char* api,
                                   const detail::BackwardParams* backward = nullptr) {
  if (requested != Backend::automatic) {
    // Where a backend runs is known even when it is not compiled in, so a device mismatch
    // is reported the same way in every build.
    if (backend_device(requested) != device)
      fail(api, ErrorKind::invalid_argument, "backend ", backend_name(requested), " runs on ",
           backend_device(requested) == DeviceType::cpu ? "cpu" : "cuda",
           " but the tensors are on ", device == DeviceType::cpu ? "cpu" : "cuda");
    const detail::BackendEntry* entry = find_entry(requested);
    if (entry == nullptr)
      fail(api, ErrorKind::unsupported, "backend ", backend_name(requested),
           " is not compiled into this build");
    if (std::string why = entry->unavailable_reason(); !why.empty())
      fail(api, ErrorKind::unsupported, "backend ", backend_name(requested), " is not available: ", why);
    if (std::string why = refusal(*entry, p, backward); !why.empty())
      fail(api, ErrorKind::unsupported, "backend ", backend_name(requested), " cannot run this call: ",
           why);
    return *entry;
  }
  const detail::BackendEntry* best = nullptr;
  std::string reasons;
  for (const auto& entry : detail::backend_registry()) {
    if (entry.device != device) continue;
    std::string why = entry.unavailable_reason();
    if (why.empty()) why = refusal(entry, p, backward);
    if (!why.empty()) {
      reasons += std::string("; ") + std::string(backend_name(entry.id)) + ": " + why;
      continue;
    }
    if (best == nullptr || rank(entry, p, backward) > rank(*best, p, backward)) best = &entry;
  }
  if (best == nullptr) fail(api, ErrorKind::unsupported, "no backend can run this call", reasons);
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
  // A shape whose strides overflow saturates them; the validator then refuses the shape
  // itself (its element count overflows too), so no wrapped stride is ever used.
  auto times = [](int64_t a, int64_t b) {
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
  };
  const int64_t head = shape[3], row = times(shape[2], head);
  return {data, dtype, device, shape, {times(shape[1], row), row, head, 1}};
}

std::string_view backend_name(Backend backend) {
  switch (backend) {
    case Backend::automatic: return "auto";
    case Backend::cpu_reference: return "cpu_reference";
    case Backend::cpu_standard: return "cpu_standard";
    case Backend::cpu_flash: return "cpu_flash";
    case Backend::cuda_naive: return "cuda_naive";
    case Backend::cuda_tiled: return "cuda_tiled";
    case Backend::cuda_tf32x3: return "cuda_tf32x3";
    case Backend::cuda_mma: return "cuda_mma";
    case Backend::cuda_sm90: return "cuda_sm90";
  }
  return "?";
}

const std::vector<Backend>& all_backends() {
  static const std::vector<Backend> backends = {Backend::cpu_reference, Backend::cpu_standard,
                                                Backend::cpu_flash,     Backend::cuda_naive,
                                                Backend::cuda_tiled,    Backend::cuda_tf32x3,
                                                Backend::cuda_mma,      Backend::cuda_sm90};
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
    case Backend::cuda_tf32x3:
    case Backend::cuda_mma:
    case Backend::cuda_sm90: return DeviceType::cuda;
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

namespace {

Plan plan_call(const detail::CallArgs& call) {
  const detail::AttentionParams p = detail::validate(call);
  const detail::BackendEntry& entry = choose(p, call.q.device.type, call.options.backend, call.api);
  return {entry.id, entry.workspace_bytes(p)};
}

void run_call(const detail::CallArgs& call) {
  const detail::AttentionParams p = detail::validate(call);
  choose(p, call.q.device.type, call.options.backend, call.api).run(p);
}

detail::BackwardArgs grads(const TensorView& dout, const float* lse, const TensorView& dq,
                           const TensorView& dk, const TensorView& dv) {
  return {dout, lse, dq, dk, dv};
}

Plan plan_backward_call(const detail::CallArgs& call, const detail::BackwardArgs& g) {
  const detail::BackwardParams p = detail::validate_backward(call, g);
  const detail::BackendEntry& entry =
      choose(p.fwd, call.q.device.type, call.options.backend, call.api, &p);
  return {entry.id, entry.backward_workspace_bytes(p)};
}

void run_backward_call(const detail::CallArgs& call, const detail::BackwardArgs& g) {
  const detail::BackwardParams p = detail::validate_backward(call, g);
  choose(p.fwd, call.q.device.type, call.options.backend, call.api, &p).run_backward(p);
}

}  // namespace

void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
              const TensorView& dout, const float* lse, const TensorView& dq, const TensorView& dk,
              const TensorView& dv, const Options& options) {
  run_backward_call({q, k, v, &out, nullptr, options, "flashtile::backward"},
                    grads(dout, lse, dq, dk, dv));
}

void backward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const TensorView& dout, const float* lse,
                     const TensorView& dq, const TensorView& dk, const TensorView& dv,
                     const Varlen& varlen, const Options& options) {
  run_backward_call({q, k, v, &out, &varlen, options, "flashtile::backward_varlen"},
                    grads(dout, lse, dq, dk, dv));
}

Plan plan_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const TensorView& dout, const float* lse,
                   const TensorView& dq, const TensorView& dk, const TensorView& dv,
                   const Options& options) {
  return plan_backward_call({q, k, v, &out, nullptr, options, "flashtile::backward"},
                            grads(dout, lse, dq, dk, dv));
}

Plan plan_backward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const TensorView& dout, const float* lse,
                          const TensorView& dq, const TensorView& dk, const TensorView& dv,
                          const Varlen& varlen, const Options& options) {
  return plan_backward_call({q, k, v, &out, &varlen, options, "flashtile::backward_varlen"},
                            grads(dout, lse, dq, dk, dv));
}

Plan plan(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
          const Options& options) {
  return plan_call({q, k, v, &out, nullptr, options, "flashtile::forward"});
}

Plan plan_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& out, const Varlen& varlen, const Options& options) {
  return plan_call({q, k, v, &out, &varlen, options, "flashtile::forward_varlen"});
}

void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const Options& options) {
  run_call({q, k, v, &out, nullptr, options, "flashtile::forward"});
}

void forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const Varlen& varlen, const Options& options) {
  run_call({q, k, v, &out, &varlen, options, "flashtile::forward_varlen"});
}

}  // namespace flashtile
