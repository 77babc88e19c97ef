// flashtile.jax's XLA FFI handlers: attention and attention_varlen, forward and backward,
// as XLA custom calls.
//
// python/flashtile/jax.py calls them through jax.ffi.ffi_call, so they run inside jitted
// programs: on the CPU in XLA's thread, on CUDA on the stream XLA hands the handler. Each
// handler wraps XLA's buffers (dense, row-major) in flashtile TensorViews and calls
// flashtile::forward / forward_varlen / backward / backward_varlen; a flashtile::Error comes
// back to JAX as an FFI error carrying the library's message. backward_refusal() answers,
// at trace time, whether flashtile::backward would serve a call (jax.py's vjp asks it).
// Compiled into the nanobind module (as the submodule flashtile._flashtile.jax_ffi) only
// when the build found XLA's FFI headers (see python/CMakeLists.txt); they are header-only,
// so nothing of jaxlib is linked.
#include <nanobind/nanobind.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flashtile/flashtile.hpp"
#include "packed_message.hpp"
#include "xla/ffi/api/ffi.h"

#if FLASHTILE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ffi = xla::ffi;
namespace nb = nanobind;

namespace {

// The attributes of one call, as python/flashtile/jax.py sets them (every one, always).
struct CallAttrs {
  bool causal;
  bool has_scale;  // false: the library's default 1/sqrt(head_dim)
  float scale;
  int64_t window_left, window_right;
  float softcap;
  bool has_alibi_slopes, has_sinks, has_seqused_k;
  int64_t max_seqlen_q, max_seqlen_k;  // -1: not given (varlen only)
  std::string_view backend;
  bool deterministic;  // backward only
  bool has_dlse;       // backward only: a cotangent of the lse follows it among the operands
};

}  // namespace

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    CallAttrs, ffi::StructMember<bool>("causal"), ffi::StructMember<bool>("has_scale"),
    ffi::StructMember<float>("scale"), ffi::StructMember<int64_t>("window_left"),
    ffi::StructMember<int64_t>("window_right"), ffi::StructMember<float>("softcap"),
    ffi::StructMember<bool>("has_alibi_slopes"), ffi::StructMember<bool>("has_sinks"),
    ffi::StructMember<bool>("has_seqused_k"), ffi::StructMember<int64_t>("max_seqlen_q"),
    ffi::StructMember<int64_t>("max_seqlen_k"), ffi::StructMember<std::string_view>("backend"),
    ffi::StructMember<bool>("deterministic"), ffi::StructMember<bool>("has_dlse"));

namespace {

using flashtile::Error;
using flashtile::ErrorKind;

// Which entry point a handler serves: its name prefixes the handler's own messages.
struct Api {
  const char* name;  // "flashtile.jax.attention", "flashtile.jax.attention_varlen", ...
  bool packed;       // varlen: 3-D (total_tokens, heads, head_dim) tensors and cu_seqlens
};
constexpr Api kDense{"flashtile.jax.attention", false};
constexpr Api kVarlen{"flashtile.jax.attention_varlen", true};
constexpr Api kDenseBackward{"flashtile.jax.attention (backward)", false};
constexpr Api kVarlenBackward{"flashtile.jax.attention_varlen (backward)", true};

[[noreturn]] void fail(const Api& api, ErrorKind kind, const std::string& message) {
  throw Error(kind, std::string(api.name) + ": " + message);
}

std::string rank_string(const ffi::AnyBuffer& buffer) {
  return std::to_string(buffer.dimensions().size()) + "-D";
}

// The names of the element types a caller may plausibly pass.
std::string type_name(ffi::DataType type) {
  switch (type) {
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::F64: return "float64";
    case ffi::DataType::S32: return "int32";
    case ffi::DataType::S64: return "int64";
    case ffi::DataType::U16: return "uint16";
    case ffi::DataType::PRED: return "bool";
    default: return "XLA element type " + std::to_string(static_cast<int>(type));
  }
}

flashtile::DType to_dtype(const Api& api, const ffi::AnyBuffer& buffer, const char* name) {
  switch (buffer.element_type()) {
    case ffi::DataType::F32: return flashtile::DType::f32;
    case ffi::DataType::F16: return flashtile::DType::f16;
    case ffi::DataType::BF16: return flashtile::DType::bf16;
    default:
      fail(api, ErrorKind::dtype,
           std::string(name) + ".dtype must be float32, float16 or bfloat16, got " +
               type_name(buffer.element_type()));
  }
}

// XLA hands row-major buffers (ffi_call's default layouts), so every view is C-contiguous.
flashtile::TensorView tensor_view(const Api& api, const ffi::AnyBuffer& buffer, const char* name,
                                  flashtile::Device device) {
  const auto dims = buffer.dimensions();
  const flashtile::DType dtype = to_dtype(api, buffer, name);
  if (api.packed) {
    if (dims.size() != 3)
      fail(api, ErrorKind::invalid_argument,
           std::string(name) + " must be 3-D (total_tokens, heads, head_dim), got " +
               rank_string(buffer));
    return flashtile::TensorView::packed(buffer.untyped_data(), dtype, device,
                                         {dims[0], dims[1], dims[2]});
  }
  if (dims.size() != 4)
    fail(api, ErrorKind::invalid_argument,
         std::string(name) + " must be 4-D (batch, seqlen, heads, head_dim), got " +
             rank_string(buffer));
  return flashtile::TensorView::contiguous(buffer.untyped_data(), dtype, device,
                                           {dims[0], dims[1], dims[2], dims[3]});
}

// ALiBi slopes or sinks: fp32, (n) or (rows, cols); the library checks the shape it needs.
flashtile::ParamView param_view(const Api& api, const ffi::AnyBuffer& buffer, const char* name,
                                flashtile::Device device) {
  if (buffer.element_type() != ffi::DataType::F32)
    fail(api, ErrorKind::dtype,
         std::string(name) + ".dtype must be float32, got " + type_name(buffer.element_type()));
  const auto dims = buffer.dimensions();
  const auto* data = static_cast<const float*>(buffer.untyped_data());
  if (dims.size() == 1) return flashtile::ParamView::vector(data, device, dims[0]);
  if (dims.size() == 2) return flashtile::ParamView::matrix(data, device, dims[0], dims[1]);
  fail(api, ErrorKind::invalid_argument,
       std::string(name) + " must be 1-D (heads) or 2-D (batch, heads), got " +
           rank_string(buffer));
}

// cu_seqlens_q / cu_seqlens_k / seqused_k: int32 vectors of `length` entries.
const int32_t* int32_vector(const Api& api, const ffi::AnyBuffer& buffer, const char* name,
                            int64_t length, const char* length_name) {
  if (buffer.element_type() != ffi::DataType::S32)
    fail(api, ErrorKind::dtype,
         std::string(name) + ".dtype must be int32, got " + type_name(buffer.element_type()));
  const auto dims = buffer.dimensions();
  if (dims.size() != 1 || dims[0] != length)
    fail(api, ErrorKind::invalid_argument,
         std::string(name) + " must be 1-D with " + length_name + " = " +
             std::to_string(length) + " entries, got " +
             (dims.size() == 1 ? std::to_string(dims[0]) + " entries" : rank_string(buffer)));
  return static_cast<const int32_t*>(buffer.untyped_data());
}

ffi::AnyBuffer extra(const ffi::RemainingArgs& extras, size_t index) {
  ffi::ErrorOr<ffi::AnyBuffer> buffer = extras.get<ffi::AnyBuffer>(index);
  if (buffer.has_error())
    throw Error(ErrorKind::invalid_argument,
                "flashtile.jax: operand " + std::to_string(index) + " after q, k, v: " +
                    buffer.error().message());
  return *buffer;
}

flashtile::Backend to_backend(const Api& api, std::string_view name) {
  if (std::optional<flashtile::Backend> backend = flashtile::parse_backend(name)) return *backend;
  std::string names = "auto";
  for (flashtile::Backend b : flashtile::all_backends())
    names += ", " + std::string(flashtile::backend_name(b));
  fail(api, ErrorKind::invalid_argument,
       "backend must be one of " + names + "; got '" + std::string(name) + "'");
}

ffi::ErrorCode to_error_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::invalid_argument:
    case ErrorKind::dtype: return ffi::ErrorCode::kInvalidArgument;
    case ErrorKind::unsupported: return ffi::ErrorCode::kUnimplemented;
    case ErrorKind::runtime: break;
  }
  return ffi::ErrorCode::kInternal;
}

// The scalar options of a call, as the attributes give them (the stream is XLA's).
flashtile::Options call_options(const Api& api, const CallAttrs& attrs, void* stream) {
  flashtile::Options options;
  options.causal = attrs.causal;
  if (attrs.has_scale) options.scale = attrs.scale;
  options.window = {attrs.window_left, attrs.window_right};
  options.softcap = attrs.softcap;
  options.backend = to_backend(api, attrs.backend);
  options.stream = stream;
  options.deterministic = attrs.deterministic;
  return options;
}

// Options::lse, backward's lse and its cotangent dlse (`name`): fp32, contiguous
// [batch, heads_q, seqlen_q] ([heads_q, total_q] for a packed q, whose view has batch 1).
int64_t lse_elements(const flashtile::TensorView& q) { return q.batch() * q.heads() * q.seqlen(); }

float* lse_data(const Api& api, const ffi::AnyBuffer& lse, const flashtile::TensorView& q,
                const std::string& name = "lse") {
  const int64_t expected = lse_elements(q);
  if (lse.element_type() != ffi::DataType::F32 ||
      static_cast<int64_t>(lse.element_count()) != expected)
    fail(api, ErrorKind::invalid_argument,
         name + " must be float32 with " + std::to_string(expected) + " elements, got " +
             type_name(lse.element_type()) + " with " + std::to_string(lse.element_count()));
  return static_cast<float*>(lse.untyped_data());
}

// What forward and backward calls share: q, k, v, the options, and for a packed batch the
// Varlen, read from the attributes and from extras[first...]: cu_seqlens_q, cu_seqlens_k
// (varlen), seqused_k, alibi_slopes, sinks, in this order and only when given.
struct Call {
  flashtile::TensorView q, k, v;
  flashtile::Options options;
  flashtile::Varlen varlen;
};

Call read_call(const Api& api, flashtile::Device device, void* stream, ffi::AnyBuffer q,
               ffi::AnyBuffer k, ffi::AnyBuffer v, const ffi::RemainingArgs& extras,
               size_t first, const CallAttrs& attrs) {
  Call call{tensor_view(api, q, "q", device), tensor_view(api, k, "k", device),
            tensor_view(api, v, "v", device), call_options(api, attrs, stream), {}};
  size_t next = first;
  if (api.packed) {
    flashtile::Varlen& varlen = call.varlen;
    const ffi::AnyBuffer cu_q = extra(extras, next++);
    const ffi::AnyBuffer cu_k = extra(extras, next++);
    if (cu_q.dimensions().size() != 1 || cu_q.dimensions()[0] < 2)
      fail(api, ErrorKind::invalid_argument,
           "cu_seqlens_q must be 1-D with batch + 1 >= 2 entries, got " + rank_string(cu_q) +
               (cu_q.dimensions().size() == 1
                    ? " with " + std::to_string(cu_q.dimensions()[0]) + " entries"
                    : ""));
    varlen.batch = cu_q.dimensions()[0] - 1;
    varlen.cu_seqlens_q = int32_vector(api, cu_q, "cu_seqlens_q", varlen.batch + 1, "batch + 1");
    varlen.cu_seqlens_k = int32_vector(api, cu_k, "cu_seqlens_k", varlen.batch + 1,
                                       "batch + 1 (as cu_seqlens_q)");
    if (attrs.has_seqused_k)
      varlen.seqused_k = int32_vector(api, extra(extras, next++), "seqused_k", varlen.batch,
                                      "batch (cu_seqlens_q has batch + 1)");
    if (attrs.max_seqlen_q >= 0) varlen.max_seqlen_q = attrs.max_seqlen_q;
    if (attrs.max_seqlen_k >= 0) varlen.max_seqlen_k = attrs.max_seqlen_k;
  }
  if (attrs.has_alibi_slopes)
    call.options.alibi_slopes = param_view(api, extra(extras, next++), "alibi_slopes", device);
  if (attrs.has_sinks)
    call.options.sinks = param_view(api, extra(extras, next++), "sinks", device);
  if (next != extras.size())
    fail(api, ErrorKind::invalid_argument,
         "expected " + std::to_string(next) + " operands after q, k, v, got " +
             std::to_string(extras.size()));
  return call;
}

// Runs `body`, turning a flashtile::Error into an FFI error with the library's message.
template <class Body>
ffi::Error guarded(const Api& api, Body&& body) {
  try {
    body();
    return ffi::Error::Success();
  } catch (const Error& e) {
    // A packed caller passed 3-D tensors: the library's 4-D view indices are shifted back.
    return ffi::Error(to_error_code(e.kind()),
                      api.packed ? flashtile::bindings::packed_message(e.what()) : e.what());
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string(api.name) + ": " + e.what());
  }
}

// One forward call, on `device`, with `stream` (a cudaStream_t; nullptr on the CPU).
// Operands: q, k, v, then read_call's. Results: out, then lse when asked for.
ffi::Error attention(const Api& api, flashtile::Device device, void* stream, ffi::AnyBuffer q,
                     ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::RemainingArgs extras,
                     ffi::Result<ffi::AnyBuffer> out, ffi::RemainingRets lse,
                     const CallAttrs& attrs) {
  return guarded(api, [&] {
    Call call = read_call(api, device, stream, q, k, v, extras, 0, attrs);
    const flashtile::TensorView out_view = tensor_view(api, *out, "out", device);
    if (lse.size() > 1)
      fail(api, ErrorKind::invalid_argument,
           "expected out and at most one lse result, got " + std::to_string(lse.size() + 1));
    if (lse.size() == 1) {
      ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> lse_buffer = lse.get<ffi::AnyBuffer>(0);
      if (lse_buffer.has_error())
        fail(api, ErrorKind::invalid_argument, "lse result: " + lse_buffer.error().message());
      call.options.lse = lse_data(api, **lse_buffer, call.q);
    }
    if (api.packed)
      flashtile::forward_varlen(call.q, call.k, call.v, out_view, call.varlen, call.options);
    else
      flashtile::forward(call.q, call.k, call.v, out_view, call.options);
  });
}

ffi::AnyBuffer result(const Api& api, const ffi::RemainingRets& rets, size_t index,
                      const char* name) {
  ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> buffer = rets.get<ffi::AnyBuffer>(index);
  if (buffer.has_error())
    fail(api, ErrorKind::invalid_argument,
         std::string(name) + " result: " + buffer.error().message());
  return **buffer;
}

// One backward call. Operands: q, k, v, then out, dout, lse (what the forward returned and
// the cotangent of out), dlse (the cotangent of lse) when attrs.has_dlse, then read_call's. Results: dq, then dk, dv and, with sinks, dsinks
// (fp32 (heads_q)).
ffi::Error attention_backward(const Api& api, flashtile::Device device, void* stream,
                              ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                              ffi::RemainingArgs extras, ffi::Result<ffi::AnyBuffer> dq,
                              ffi::RemainingRets rets, const CallAttrs& attrs) {
  return guarded(api, [&] {
    const size_t saved = attrs.has_dlse ? 4 : 3;  // out, dout, lse[, dlse]
    if (extras.size() < saved)
      fail(api, ErrorKind::invalid_argument,
           std::string("expected out, dout, lse") + (attrs.has_dlse ? " and dlse" : "") +
               " after q, k, v, got " + std::to_string(extras.size()) + " operands");
    Call call = read_call(api, device, stream, q, k, v, extras, saved, attrs);
    const flashtile::TensorView out = tensor_view(api, extra(extras, 0), "out", device);
    const flashtile::TensorView dout = tensor_view(api, extra(extras, 1), "dout", device);
    const float* lse = lse_data(api, extra(extras, 2), call.q);
    if (attrs.has_dlse) call.options.dlse = lse_data(api, extra(extras, 3), call.q, "dlse");
    const size_t expected_rets = attrs.has_sinks ? 3 : 2;
    if (rets.size() != expected_rets)
      fail(api, ErrorKind::invalid_argument,
           "expected " + std::to_string(expected_rets + 1) + " results (dq, dk, dv" +
               (attrs.has_sinks ? ", dsinks" : "") + "), got " + std::to_string(rets.size() + 1));
    const flashtile::TensorView dq_view = tensor_view(api, *dq, "dq", device);
    const flashtile::TensorView dk_view =
        tensor_view(api, result(api, rets, 0, "dk"), "dk", device);
    const flashtile::TensorView dv_view =
        tensor_view(api, result(api, rets, 1, "dv"), "dv", device);
    if (attrs.has_sinks) {
      ffi::AnyBuffer dsinks = result(api, rets, 2, "dsinks");
      if (dsinks.element_type() != ffi::DataType::F32)
        fail(api, ErrorKind::dtype,
             "dsinks.dtype must be float32, got " + type_name(dsinks.element_type()));
      // The library writes heads_q floats there (Options::dsinks).
      if (static_cast<int64_t>(dsinks.element_count()) != call.q.heads())
        fail(api, ErrorKind::invalid_argument,
             "dsinks must have heads_q = " + std::to_string(call.q.heads()) + " elements, got " +
                 std::to_string(dsinks.element_count()));
      call.options.dsinks = static_cast<float*>(dsinks.untyped_data());
    }
    if (api.packed)
      flashtile::backward_varlen(call.q, call.k, call.v, out, dout, lse, dq_view, dk_view,
                                 dv_view, call.varlen, call.options);
    else
      flashtile::backward(call.q, call.k, call.v, out, dout, lse, dq_view, dk_view, dv_view,
                          call.options);
  });
}

// A handler: `run` (attention or attention_backward) for one Api, on the CPU or on CUDA.
using Run = ffi::Error (*)(const Api&, flashtile::Device, void*, ffi::AnyBuffer, ffi::AnyBuffer,
                           ffi::AnyBuffer, ffi::RemainingArgs, ffi::Result<ffi::AnyBuffer>,
                           ffi::RemainingRets, const CallAttrs&);

template <Run kRun, const Api& kApi>
ffi::Error on_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::RemainingArgs extras,
                  ffi::Result<ffi::AnyBuffer> first, ffi::RemainingRets rest, CallAttrs attrs) {
  return kRun(kApi, flashtile::Device::cpu(), nullptr, q, k, v, extras, first, rest, attrs);
}

#if FLASHTILE_WITH_CUDA
template <Run kRun, const Api& kApi>
ffi::Error on_cuda(cudaStream_t stream, int32_t device_ordinal, ffi::AnyBuffer q,
                   ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::RemainingArgs extras,
                   ffi::Result<ffi::AnyBuffer> first, ffi::RemainingRets rest, CallAttrs attrs) {
  return kRun(kApi, flashtile::Device::cuda(device_ordinal), stream, q, k, v, extras, first, rest,
              attrs);
}
#endif

}  // namespace

namespace {
// What every handler takes after its context: q, k, v, then the other operands; its first
// result (out or dq), then the others; the attributes.
template <class Binding>
auto with_call_operands(Binding&& binding) {
  return std::forward<Binding>(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .RemainingArgs()
      .template Ret<ffi::AnyBuffer>()
      .RemainingRets()
      .template Attrs<CallAttrs>();
}
#if FLASHTILE_WITH_CUDA
// The CUDA handlers' context first: the stream XLA hands them and the device ordinal.
auto cuda_binding() {
  return with_call_operands(
      ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>().Ctx<ffi::DeviceOrdinal>());
}
#endif
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(flashtile_attention_cpu, (on_cpu<attention, kDense>),
                              with_call_operands(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashtile_attention_varlen_cpu, (on_cpu<attention, kVarlen>),
                              with_call_operands(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashtile_attention_backward_cpu,
                              (on_cpu<attention_backward, kDenseBackward>),
                              with_call_operands(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashtile_attention_varlen_backward_cpu,
                              (on_cpu<attention_backward, kVarlenBackward>),
                              with_call_operands(ffi::Ffi::Bind()));
#if FLASHTILE_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashtile_attention_cuda, (on_cuda<attention, kDense>),
                              cuda_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashtile_attention_varlen_cuda, (on_cuda<attention, kVarlen>),
                              cuda_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashtile_attention_backward_cuda,
                              (on_cuda<attention_backward, kDenseBackward>), cuda_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashtile_attention_varlen_backward_cuda,
                              (on_cuda<attention_backward, kVarlenBackward>), cuda_binding());
#endif

namespace {

nb::capsule handler_capsule(XLA_FFI_Handler* handler) {
  return nb::capsule(reinterpret_cast<void*>(handler));
}

// Why flashtile::backward would not serve a dense call of these shapes, dtype, device and
// options ("" when it would), asked through plan_backward before any buffer exists (at trace
// time). The views get distinct, 256-byte aligned addresses that nothing dereferences: a
// dense plan validates and chooses from shapes, strides, pointers and options only. Returns
// (kind, message): kind "" when a backend serves the call, "unsupported" when none does,
// "invalid" when the call itself is wrong (the run will raise the library's message).
std::pair<std::string, std::string> backward_refusal(
    std::string_view device_type, std::string_view dtype_name, std::array<int64_t, 4> q_shape,
    std::array<int64_t, 4> k_shape, std::vector<int64_t> alibi_shape, bool has_sinks,
    bool causal, std::optional<float> scale, int64_t window_left, int64_t window_right,
    float softcap, std::string backend, bool deterministic) {
  try {
    const flashtile::Device device = device_type == "cpu" ? flashtile::Device::cpu()
                                                          : flashtile::Device::cuda(0);
    flashtile::DType dtype;
    if (dtype_name == "float32")
      dtype = flashtile::DType::f32;
    else if (dtype_name == "float16")
      dtype = flashtile::DType::f16;
    else if (dtype_name == "bfloat16")
      dtype = flashtile::DType::bf16;
    else
      fail(kDenseBackward, ErrorKind::dtype,
           "q.dtype must be float32, float16 or bfloat16, got " + std::string(dtype_name));
    uintptr_t next_address = uintptr_t{1} << 40;
    auto address = [&](int64_t bytes) {
      const uintptr_t at = next_address;
      next_address += (static_cast<uintptr_t>(bytes) + 511) / 256 * 256;
      return reinterpret_cast<void*>(at);
    };
    const int64_t element = dtype == flashtile::DType::f32 ? 4 : 2;
    auto view = [&](std::array<int64_t, 4> shape) {
      return flashtile::TensorView::contiguous(
          address(shape[0] * shape[1] * shape[2] * shape[3] * element), dtype, device, shape);
    };
    const flashtile::TensorView q = view(q_shape), k = view(k_shape), v = view(k_shape),
                                out = view(q_shape), dout = view(q_shape), dq = view(q_shape),
                                dk = view(k_shape), dv = view(k_shape);
    const int64_t heads_q = q_shape[2];
    const auto* lse = static_cast<const float*>(address(q_shape[0] * heads_q * q_shape[1] * 4));

    CallAttrs attrs{causal,      scale.has_value(), scale.value_or(0.0f), window_left,
                    window_right, softcap,          !alibi_shape.empty(), has_sinks,
                    false,       -1,                -1,                   backend,
                    deterministic, /*has_dlse=*/false};
    flashtile::Options options = call_options(kDenseBackward, attrs, nullptr);
    if (alibi_shape.size() == 1)
      options.alibi_slopes = flashtile::ParamView::vector(
          static_cast<const float*>(address(alibi_shape[0] * 4)), device, alibi_shape[0]);
    else if (alibi_shape.size() == 2)
      options.alibi_slopes = flashtile::ParamView::matrix(
          static_cast<const float*>(address(alibi_shape[0] * alibi_shape[1] * 4)), device,
          alibi_shape[0], alibi_shape[1]);
    if (has_sinks) {
      options.sinks = flashtile::ParamView::vector(
          static_cast<const float*>(address(heads_q * 4)), device, heads_q);
      options.dsinks = static_cast<float*>(address(heads_q * 4));
    }
    flashtile::plan_backward(q, k, v, out, dout, lse, dq, dk, dv, options);
    return {"", ""};
  } catch (const Error& e) {
    return {e.kind() == ErrorKind::unsupported ? "unsupported" : "invalid", e.what()};
  }
}

}  // namespace

// Fills flashtile._flashtile.jax_ffi: registrations() -> {platform: {target: capsule}}, for
// jax.ffi.register_ffi_target, backward_refusal (above), and the jax version whose headers
// the build used.
void define_jax_ffi(nb::module_& m) {
  m.attr("built_with_jax") = FLASHTILE_JAX_VERSION;
  m.def("registrations", [] {
    nb::dict platforms;
    nb::dict cpu;
    cpu["flashtile_attention"] = handler_capsule(flashtile_attention_cpu);
    cpu["flashtile_attention_varlen"] = handler_capsule(flashtile_attention_varlen_cpu);
    cpu["flashtile_attention_backward"] = handler_capsule(flashtile_attention_backward_cpu);
    cpu["flashtile_attention_varlen_backward"] =
        handler_capsule(flashtile_attention_varlen_backward_cpu);
    platforms["cpu"] = cpu;
#if FLASHTILE_WITH_CUDA
    nb::dict cuda;
    cuda["flashtile_attention"] = handler_capsule(flashtile_attention_cuda);
    cuda["flashtile_attention_varlen"] = handler_capsule(flashtile_attention_varlen_cuda);
    cuda["flashtile_attention_backward"] = handler_capsule(flashtile_attention_backward_cuda);
    cuda["flashtile_attention_varlen_backward"] =
        handler_capsule(flashtile_attention_varlen_backward_cuda);
    platforms["CUDA"] = cuda;
#endif
    return platforms;
  });
  m.def("backward_refusal", &backward_refusal, nb::arg("device_type"), nb::arg("dtype"),
        nb::arg("q_shape"), nb::arg("k_shape"), nb::arg("alibi_shape"), nb::arg("has_sinks"),
        nb::arg("causal"), nb::arg("scale").none(), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("softcap"), nb::arg("backend"),
        nb::arg("deterministic"));
}
