// flashtile.jax's XLA FFI handlers: attention and attention_varlen as XLA custom calls.
//
// python/flashtile/jax.py calls them through jax.ffi.ffi_call, so they run inside jitted
// programs: on the CPU in XLA's thread, on CUDA on the stream XLA hands the handler. Each
// handler wraps XLA's buffers (dense, row-major) in flashtile TensorViews and calls
// flashtile::forward / forward_varlen; a flashtile::Error comes back to JAX as an FFI error
// carrying the library's message. Compiled into the nanobind module (as the submodule
// flashtile._flashtile.jax_ffi) only when the build found XLA's FFI headers (see
// python/CMakeLists.txt); they are header-only, so nothing of jaxlib is linked.
#include <nanobind/nanobind.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

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
};

}  // namespace

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    CallAttrs, ffi::StructMember<bool>("causal"), ffi::StructMember<bool>("has_scale"),
    ffi::StructMember<float>("scale"), ffi::StructMember<int64_t>("window_left"),
    ffi::StructMember<int64_t>("window_right"), ffi::StructMember<float>("softcap"),
    ffi::StructMember<bool>("has_alibi_slopes"), ffi::StructMember<bool>("has_sinks"),
    ffi::StructMember<bool>("has_seqused_k"), ffi::StructMember<int64_t>("max_seqlen_q"),
    ffi::StructMember<int64_t>("max_seqlen_k"), ffi::StructMember<std::string_view>("backend"));

namespace {

using flashtile::Error;
using flashtile::ErrorKind;

// Which entry point a handler serves: its name prefixes the handler's own messages.
struct Api {
  const char* name;  // "flashtile.jax.attention" or "flashtile.jax.attention_varlen"
  bool packed;       // varlen: 3-D (total_tokens, heads, head_dim) tensors and cu_seqlens
};
constexpr Api kDense{"flashtile.jax.attention", false};
constexpr Api kVarlen{"flashtile.jax.attention_varlen", true};

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

// One call, on `device`, with `stream` (a cudaStream_t; nullptr on the CPU). Operands after
// q, k, v, in this order and only when given: cu_seqlens_q, cu_seqlens_k (varlen),
// seqused_k, alibi_slopes, sinks. Results: out, then lse when asked for.
ffi::Error attention(const Api& api, flashtile::Device device, void* stream, ffi::AnyBuffer q,
                     ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::RemainingArgs extras,
                     ffi::Result<ffi::AnyBuffer> out, ffi::RemainingRets lse,
                     const CallAttrs& attrs) {
  try {
    const flashtile::TensorView q_view = tensor_view(api, q, "q", device);
    const flashtile::TensorView k_view = tensor_view(api, k, "k", device);
    const flashtile::TensorView v_view = tensor_view(api, v, "v", device);
    const flashtile::TensorView out_view = tensor_view(api, *out, "out", device);

    flashtile::Options options;
    options.causal = attrs.causal;
    if (attrs.has_scale) options.scale = attrs.scale;
    options.window = {attrs.window_left, attrs.window_right};
    options.softcap = attrs.softcap;
    options.backend = to_backend(api, attrs.backend);
    options.stream = stream;

    size_t next = 0;
    flashtile::Varlen varlen;
    if (api.packed) {
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
      options.alibi_slopes = param_view(api, extra(extras, next++), "alibi_slopes", device);
    if (attrs.has_sinks) options.sinks = param_view(api, extra(extras, next++), "sinks", device);
    if (next != extras.size())
      fail(api, ErrorKind::invalid_argument,
           "expected " + std::to_string(next) + " operands after q, k, v, got " +
               std::to_string(extras.size()));

    if (lse.size() > 1)
      fail(api, ErrorKind::invalid_argument,
           "expected out and at most one lse result, got " + std::to_string(lse.size() + 1));
    if (lse.size() == 1) {
      ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> lse_buffer = lse.get<ffi::AnyBuffer>(0);
      if (lse_buffer.has_error()) return lse_buffer.error();
      ffi::AnyBuffer lse_out = **lse_buffer;
      // Options::lse is contiguous fp32 [batch, heads_q, seqlen_q] ([heads_q, total_q] varlen).
      const int64_t expected = q_view.batch() * q_view.heads() * q_view.seqlen();
      if (lse_out.element_type() != ffi::DataType::F32 ||
          static_cast<int64_t>(lse_out.element_count()) != expected)
        fail(api, ErrorKind::invalid_argument,
             "lse must be float32 with " + std::to_string(expected) + " elements");
      options.lse = static_cast<float*>(lse_out.untyped_data());
    }

    if (api.packed)
      flashtile::forward_varlen(q_view, k_view, v_view, out_view, varlen, options);
    else
      flashtile::forward(q_view, k_view, v_view, out_view, options);
    return ffi::Error::Success();
  } catch (const Error& e) {
    // A packed caller passed 3-D tensors: the library's 4-D view indices are shifted back.
    return ffi::Error(to_error_code(e.kind()),
                      api.packed ? flashtile::bindings::packed_message(e.what()) : e.what());
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string(api.name) + ": " + e.what());
  }
}

template <const Api& kApi>
ffi::Error attention_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                         ffi::RemainingArgs extras, ffi::Result<ffi::AnyBuffer> out,
                         ffi::RemainingRets lse, CallAttrs attrs) {
  return attention(kApi, flashtile::Device::cpu(), nullptr, q, k, v, extras, out, lse, attrs);
}

#if FLASHTILE_WITH_CUDA
template <const Api& kApi>
ffi::Error attention_cuda(cudaStream_t stream, int32_t device_ordinal, ffi::AnyBuffer q,
                          ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::RemainingArgs extras,
                          ffi::Result<ffi::AnyBuffer> out, ffi::RemainingRets lse,
                          CallAttrs attrs) {
  return attention(kApi, flashtile::Device::cuda(device_ordinal), stream, q, k, v, extras, out,
                   lse, attrs);
}
#endif

}  // namespace

namespace {
// What every handler takes after its context: q, k, v, then the optional operands; out,
// then the optional lse; the attributes.
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(flashtile_attention_cpu, attention_cpu<kDense>,
                              with_call_operands(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashtile_attention_varlen_cpu, attention_cpu<kVarlen>,
                              with_call_operands(ffi::Ffi::Bind()));
#if FLASHTILE_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashtile_attention_cuda, attention_cuda<kDense>, cuda_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashtile_attention_varlen_cuda, attention_cuda<kVarlen>,
                              cuda_binding());
#endif

namespace {

nb::capsule handler_capsule(XLA_FFI_Handler* handler) {
  return nb::capsule(reinterpret_cast<void*>(handler));
}

}  // namespace

// Fills flashtile._flashtile.jax_ffi: registrations() -> {platform: {target: capsule}}, for
// jax.ffi.register_ffi_target, and the jax version whose headers the build used.
void define_jax_ffi(nb::module_& m) {
  m.attr("built_with_jax") = FLASHTILE_JAX_VERSION;
  m.def("registrations", [] {
    nb::dict platforms;
    nb::dict cpu;
    cpu["flashtile_attention"] = handler_capsule(flashtile_attention_cpu);
    cpu["flashtile_attention_varlen"] = handler_capsule(flashtile_attention_varlen_cpu);
    platforms["cpu"] = cpu;
#if FLASHTILE_WITH_CUDA
    nb::dict cuda;
    cuda["flashtile_attention"] = handler_capsule(flashtile_attention_cuda);
    cuda["flashtile_attention_varlen"] = handler_capsule(flashtile_attention_varlen_cuda);
    platforms["CUDA"] = cuda;
#endif
    return platforms;
  });
}
