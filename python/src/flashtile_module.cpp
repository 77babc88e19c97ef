// flashtile._flashtile: the nanobind binding under the Python package.
//
// It takes any array nanobind can import (numpy through the buffer protocol or DLPack;
// torch, CuPy, JAX and others through DLPack) as a non-owning view, so nothing is copied.
// Allocation of outputs and the choice of CUDA stream are the Python layer's job
// (python/flashtile/_api.py); this file only turns arrays into TensorViews, releases the
// GIL and calls flashtile::forward or forward_varlen (packed 3-D tensors with cu_seqlens),
// (or flashtile::backward / backward_varlen for the gradients), whose flashtile::Error becomes
// ValueError/TypeError. Variant parameters (ALiBi slopes,
// sinks) and cu_seqlens are arrays too, read in place on q's device.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "flashtile/device.hpp"
#include "flashtile/flashtile.hpp"
#include "packed_message.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using flashtile::DType;
using flashtile::Error;
using flashtile::ErrorKind;

// The Python entry point a call comes from. Its name prefixes the binding's own errors; a
// packed (varlen) call takes 3-D (total_tokens, heads, head_dim) tensors.
struct Api {
  std::string name;  // "flashtile.attention" or "flashtile.attention_varlen"
  bool packed = false;
};

template <class... Parts>
[[noreturn]] void fail(const Api& api, ErrorKind kind, const Parts&... parts) {
  std::string message = api.name + ": ";
  ((message += parts), ...);
  throw Error(kind, message);
}

std::string dtype_string(nb::dlpack::dtype dt) {
  const char* kind = "unknown";
  switch (static_cast<nb::dlpack::dtype_code>(dt.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    default: break;
  }
  return kind + std::to_string(dt.bits);
}

bool is_dtype(nb::dlpack::dtype dt, nb::dlpack::dtype_code code, int bits) {
  return dt.code == static_cast<uint8_t>(code) && dt.bits == bits && dt.lanes == 1;
}

// numpy has no bfloat16: the Python layer passes ml_dtypes.bfloat16 arrays as uint16 views
// and sets `uint16_is_bf16` (it refuses genuine uint16 arrays itself).
DType to_dtype(const Api& api, nb::dlpack::dtype dt, const char* name, bool uint16_is_bf16) {
  using Code = nb::dlpack::dtype_code;
  if (is_dtype(dt, Code::Float, 32)) return DType::f32;
  if (is_dtype(dt, Code::Float, 16)) return DType::f16;
  if (is_dtype(dt, Code::Bfloat, 16)) return DType::bf16;
  if (uint16_is_bf16 && is_dtype(dt, Code::UInt, 16)) return DType::bf16;
  fail(api, ErrorKind::dtype, name, ".dtype must be float32, float16 or bfloat16, got ",
       dtype_string(dt));
}

flashtile::Device to_device(const Api& api, int device_type, int device_id, const char* name) {
  if (device_type == nb::device::cpu::value) return flashtile::Device::cpu();
  if (device_type == nb::device::cuda::value) return flashtile::Device::cuda(device_id);
  fail(api, ErrorKind::invalid_argument, name,
       " must live in CPU memory or CUDA device memory, got DLPack device type ",
       std::to_string(device_type));
}

template <class NdArray>
flashtile::Device device_of(const Api& api, const NdArray& a, const char* name) {
  return to_device(api, a.device_type(), a.device_id(), name);
}

// A non-owning BSHD view of `a`: 4-D, or for a packed call the 3-D (total_tokens, heads,
// head_dim) tensor as the (1, total_tokens, heads, head_dim) view forward_varlen takes.
// nanobind reports strides in elements, as TensorView wants; the library's validator
// checks the rest (last stride 1, no negatives, shapes).
template <class NdArray>
flashtile::TensorView to_view(const Api& api, const NdArray& a, const char* name,
                              bool uint16_is_bf16) {
  const size_t ndim = api.packed ? 3 : 4;
  if (a.ndim() != ndim)
    fail(api, ErrorKind::invalid_argument, name, " must be ",
         api.packed ? "3-D (total_tokens, heads, head_dim)" : "4-D (batch, seqlen, heads, head_dim)",
         ", got ", std::to_string(a.ndim()), "-D");
  flashtile::TensorView view;
  view.data = const_cast<void*>(static_cast<const void*>(a.data()));
  view.dtype = to_dtype(api, a.dtype(), name, uint16_is_bf16);
  view.device = device_of(api, a, name);
  const size_t first = 4 - ndim;  // packed: dimension 0 is the batch of one
  view.shape[0] = 1;
  view.strides[0] = 0;
  for (size_t i = 0; i < ndim; ++i) {
    view.shape[first + i] = static_cast<int64_t>(a.shape(i));
    view.strides[first + i] = a.stride(i);
  }
  // A stride of a size-1 dimension is never used; frameworks are free to report anything.
  if (view.shape[3] == 1) view.strides[3] = 1;
  return view;
}

// lse must be the fp32, C-contiguous buffer Options::lse points to: [batch, heads_q,
// seqlen_q], or [heads_q, total_q] for a packed call; so must the backward's dlse (`name`).
template <class NdArray>
float* lse_pointer(const Api& api, const NdArray& lse, const flashtile::TensorView& q,
                   const std::string& name = "lse") {
  std::vector<int64_t> expected = {q.batch(), q.heads(), q.seqlen()};
  if (api.packed) expected = {q.heads(), q.seqlen()};
  const size_t ndim = expected.size();
  if (lse.ndim() != ndim)
    fail(api, ErrorKind::invalid_argument, name, " must be ",
         api.packed ? "2-D (heads, total_q)" : "3-D (batch, heads, seqlen_q)", ", got ",
         std::to_string(lse.ndim()), "-D");
  if (!is_dtype(lse.dtype(), nb::dlpack::dtype_code::Float, 32))
    fail(api, ErrorKind::dtype, name, ".dtype must be float32, got ", dtype_string(lse.dtype()));
  auto shape_string = [&](auto extent) {
    std::string s = "(";
    for (size_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(extent(i));
    return s + ")";
  };
  int64_t contiguous_stride = 1;
  for (size_t i = ndim; i-- > 0;) {
    if (static_cast<int64_t>(lse.shape(i)) != expected[i])
      fail(api, ErrorKind::invalid_argument, name, ".shape must be ",
           shape_string([&](size_t d) { return expected[d]; }), ", got ",
           shape_string([&](size_t d) { return lse.shape(d); }));
    if (expected[i] > 1 && lse.stride(i) != contiguous_stride)
      fail(api, ErrorKind::invalid_argument, name, " must be C-contiguous");
    contiguous_stride *= expected[i];
  }
  if (!(device_of(api, lse, name.c_str()) == q.device))
    fail(api, ErrorKind::invalid_argument, name, " must be on the device of q (",
         flashtile::device_name(q.device), ")");
  return static_cast<float*>(const_cast<void*>(static_cast<const void*>(lse.data())));
}

// ALiBi slopes or sinks: fp32, any strides. Shapes and the device are the library's to
// check (it names the expected shape); only the dtype is not visible to it.
flashtile::ParamView param_view(const Api& api, const nb::ndarray<nb::ro>& a, const char* name) {
  if (!is_dtype(a.dtype(), nb::dlpack::dtype_code::Float, 32))
    fail(api, ErrorKind::dtype, name, ".dtype must be float32, got ", dtype_string(a.dtype()));
  flashtile::ParamView view;
  view.data = static_cast<const float*>(a.data());
  view.device = device_of(api, a, name);
  view.ndim = static_cast<int>(a.ndim());
  for (size_t i = 0; i < std::min<size_t>(a.ndim(), 2); ++i) {
    view.shape[i] = static_cast<int64_t>(a.shape(i));
    view.strides[i] = a.stride(i);
  }
  return view;
}

// cu_seqlens_q / cu_seqlens_k / seqused_k: the library takes bare int32 pointers, so their
// dtype, length, layout and device are checked here.
const int32_t* int32_pointer(const Api& api, const nb::ndarray<nb::ro>& a, const char* name,
                             int64_t length, const char* length_name,
                             const flashtile::Device& device) {
  if (!is_dtype(a.dtype(), nb::dlpack::dtype_code::Int, 32))
    fail(api, ErrorKind::dtype, name, ".dtype must be int32, got ", dtype_string(a.dtype()));
  if (a.ndim() != 1)
    fail(api, ErrorKind::invalid_argument, name, " must be 1-D, got ", std::to_string(a.ndim()),
         "-D");
  if (static_cast<int64_t>(a.shape(0)) != length)
    fail(api, ErrorKind::invalid_argument, name, " must have ", length_name, " = ",
         std::to_string(length), " entries, got ", std::to_string(a.shape(0)));
  if (length > 1 && a.stride(0) != 1)
    fail(api, ErrorKind::invalid_argument, name, " must be contiguous (stride 1), got stride ",
         std::to_string(a.stride(0)));
  if (!(device_of(api, a, name) == device))
    fail(api, ErrorKind::invalid_argument, name, " must be on the device of q (",
         flashtile::device_name(device), "), got ",
         flashtile::device_name(device_of(api, a, name)));
  return static_cast<const int32_t*>(a.data());
}

flashtile::Backend to_backend(const Api& api, std::string_view name) {
  if (std::optional<flashtile::Backend> backend = flashtile::parse_backend(name)) return *backend;
  std::string names = "auto";
  for (flashtile::Backend b : flashtile::all_backends())
    names += std::string(", ") + std::string(flashtile::backend_name(b));
  fail(api, ErrorKind::invalid_argument, "backend must be one of ", names, "; got '",
       std::string(name), "'");
}

using Array = nb::ndarray<nb::ro>;
using OptionalArray = std::optional<Array>;

// Everything one call passes to the library.
struct Call {
  Api api;
  flashtile::TensorView q, k, v, out;
  flashtile::Options options;
  std::optional<flashtile::Varlen> varlen;
};

// The options of one call, as the Python layer sets them (_flashtile.CallArgs, by name).
struct CallArgs {
  bool causal = false;
  std::optional<float> scale;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  OptionalArray alibi_slopes, sinks;
  OptionalArray cu_seqlens_q, cu_seqlens_k, seqused_k;
  std::optional<int64_t> max_seqlen_q, max_seqlen_k;
  std::string backend = "auto";
  uintptr_t stream = 0;  // cudaStream_t; 0 = the default stream
  bool uint16_is_bf16 = false;
  bool deterministic = false;  // backward only
};

// `entry` names the Python function ("flashtile.attention", "flashtile.attention_backward");
// a packed call appends "_varlen".
Call make_call(const Array& q, const Array& k, const Array& v, const Array& out,
               const CallArgs& args, const std::string& entry = "flashtile.attention") {
  Call call;
  call.api.packed = args.cu_seqlens_q.has_value();
  call.api.name = call.api.packed ? entry + "_varlen" : entry;
  const Api& api = call.api;
  call.q = to_view(api, q, "q", args.uint16_is_bf16);
  call.k = to_view(api, k, "k", args.uint16_is_bf16);
  call.v = to_view(api, v, "v", args.uint16_is_bf16);
  call.out = to_view(api, out, "out", args.uint16_is_bf16);

  flashtile::Options& options = call.options;
  options.causal = args.causal;
  options.scale = args.scale;
  options.window = {args.window_left, args.window_right};
  options.softcap = args.softcap;
  if (args.alibi_slopes) options.alibi_slopes = param_view(api, *args.alibi_slopes, "alibi_slopes");
  if (args.sinks) options.sinks = param_view(api, *args.sinks, "sinks");
  options.backend = to_backend(api, args.backend);
  options.stream = reinterpret_cast<void*>(args.stream);
  options.deterministic = args.deterministic;

  if (call.api.packed) {
    if (!args.cu_seqlens_k)
      fail(api, ErrorKind::invalid_argument, "cu_seqlens_k is required with cu_seqlens_q");
    const Array& cu_q = *args.cu_seqlens_q;
    if (cu_q.ndim() != 1 || cu_q.shape(0) < 2)
      fail(api, ErrorKind::invalid_argument,
           "cu_seqlens_q must be 1-D with batch + 1 >= 2 entries, got ",
           cu_q.ndim() == 1 ? std::to_string(cu_q.shape(0)) + " entries"
                            : std::to_string(cu_q.ndim()) + "-D");
    flashtile::Varlen varlen;
    varlen.batch = static_cast<int64_t>(cu_q.shape(0)) - 1;
    varlen.cu_seqlens_q =
        int32_pointer(api, cu_q, "cu_seqlens_q", varlen.batch + 1, "batch + 1", call.q.device);
    varlen.cu_seqlens_k = int32_pointer(api, *args.cu_seqlens_k, "cu_seqlens_k", varlen.batch + 1,
                                        "batch + 1 (as cu_seqlens_q)", call.q.device);
    if (args.seqused_k)
      varlen.seqused_k = int32_pointer(api, *args.seqused_k, "seqused_k", varlen.batch,
                                       "batch (cu_seqlens_q has batch + 1)", call.q.device);
    varlen.max_seqlen_q = args.max_seqlen_q;
    varlen.max_seqlen_k = args.max_seqlen_k;
    call.varlen = varlen;
  } else if (args.cu_seqlens_k || args.seqused_k) {
    fail(api, ErrorKind::invalid_argument, "cu_seqlens_k and seqused_k need cu_seqlens_q");
  }
  return call;
}

using flashtile::bindings::packed_message;  // packed_message.hpp, shared with jax_ffi.cpp

template <class Fn>
auto call_library(const Call& call, Fn&& fn) {
  if (!call.api.packed) return fn();
  try {
    return fn();
  } catch (const Error& e) {
    throw Error(e.kind(), packed_message(e.what()));
  }
}

void forward(const Array& q, const Array& k, const Array& v, const nb::ndarray<>& out,
             const std::optional<nb::ndarray<>>& lse, const CallArgs& args) {
  Call call = make_call(q, k, v, Array(out), args);
  if (lse) call.options.lse = lse_pointer(call.api, *lse, call.q);
  // CPU backends compute here, in this thread: let other Python threads run meanwhile.
  nb::gil_scoped_release release;
  call_library(call, [&] {
    if (call.varlen)
      flashtile::forward_varlen(call.q, call.k, call.v, call.out, *call.varlen, call.options);
    else
      flashtile::forward(call.q, call.k, call.v, call.out, call.options);
  });
}

// Writes dq, dk, dv (and dsinks, fp32 (heads_q) C-contiguous, when given) for dout, from
// forward's out and lse (read only); dlse, when given, is the gradient into the LSE (lse's
// shape, dtype and layout).
void backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& dout,
              const Array& lse, const nb::ndarray<>& dq, const nb::ndarray<>& dk,
              const nb::ndarray<>& dv, const std::optional<nb::ndarray<>>& dsinks,
              const CallArgs& args, const OptionalArray& dlse) {
  Call call = make_call(q, k, v, out, args, "flashtile.attention_backward");
  const Api& api = call.api;
  const flashtile::TensorView dout_view = to_view(api, dout, "dout", args.uint16_is_bf16);
  const flashtile::TensorView dq_view = to_view(api, Array(dq), "dq", args.uint16_is_bf16);
  const flashtile::TensorView dk_view = to_view(api, Array(dk), "dk", args.uint16_is_bf16);
  const flashtile::TensorView dv_view = to_view(api, Array(dv), "dv", args.uint16_is_bf16);
  const float* lse_data = lse_pointer(api, lse, call.q);
  if (dlse) call.options.dlse = lse_pointer(api, *dlse, call.q, "dlse");
  if (dsinks) {
    const nb::ndarray<>& d = *dsinks;
    if (!is_dtype(d.dtype(), nb::dlpack::dtype_code::Float, 32))
      fail(api, ErrorKind::dtype, "dsinks.dtype must be float32, got ", dtype_string(d.dtype()));
    if (d.ndim() != 1 || static_cast<int64_t>(d.shape(0)) != call.q.heads())
      fail(api, ErrorKind::invalid_argument, "dsinks must be shaped (heads_q,) = (",
           std::to_string(call.q.heads()), ",)");
    if (d.shape(0) > 1 && d.stride(0) != 1)
      fail(api, ErrorKind::invalid_argument, "dsinks must be contiguous");
    if (!(device_of(api, d, "dsinks") == call.q.device))
      fail(api, ErrorKind::invalid_argument, "dsinks must be on the device of q (",
           flashtile::device_name(call.q.device), ")");
    call.options.dsinks = static_cast<float*>(d.data());
  }
  nb::gil_scoped_release release;
  call_library(call, [&] {
    if (call.varlen)
      flashtile::backward_varlen(call.q, call.k, call.v, call.out, dout_view, lse_data, dq_view,
                                 dk_view, dv_view, *call.varlen, call.options);
    else
      flashtile::backward(call.q, call.k, call.v, call.out, dout_view, lse_data, dq_view, dk_view,
                          dv_view, call.options);
  });
}

// (backend name, workspace bytes) that forward would use, or the error it would raise.
std::tuple<std::string, int64_t> plan(const Array& q, const Array& k, const Array& v,
                                      const Array& out, const CallArgs& args) {
  const Call call = make_call(q, k, v, out, args);
  nb::gil_scoped_release release;  // a varlen plan on CUDA waits for the stream
  const flashtile::Plan p = call_library(call, [&] {
    return call.varlen ? flashtile::plan_varlen(call.q, call.k, call.v, call.out, *call.varlen,
                                                call.options)
                       : flashtile::plan(call.q, call.k, call.v, call.out, call.options);
  });
  return {std::string(flashtile::backend_name(p.backend)), p.workspace_bytes};
}

// A C-contiguous array that owns its memory (cudaMalloc on a CUDA device, else 64-byte
// aligned host memory), for frameworks whose arrays cannot be allocated empty and written
// (JAX). It is returned as an object with __dlpack__/__dlpack_device__, which the caller's
// framework imports without a copy (from_dlpack).
nb::ndarray<nb::array_api> empty(std::vector<size_t> shape, std::string_view dtype_name,
                                 std::string_view device_type, int device) {
  const std::optional<DType> dtype = flashtile::parse_dtype(dtype_name);
  if (!dtype)
    fail(Api{"flashtile._flashtile.empty"}, ErrorKind::dtype, "unknown dtype '",
         std::string(dtype_name), "'");
  size_t bytes = flashtile::dtype_size(*dtype);
  for (size_t extent : shape) bytes *= extent;
  void* data = nullptr;
  nb::capsule owner;
  int dlpack_device = nb::device::cpu::value;
  if (device_type == "cuda") {
    auto* buffer = new flashtile::DeviceBuffer(bytes, device);
    data = buffer->data();
    owner = nb::capsule(buffer, [](void* p) noexcept {
      delete static_cast<flashtile::DeviceBuffer*>(p);
    });
    dlpack_device = nb::device::cuda::value;
  } else {
    constexpr size_t kAlign = 64;
    data = ::operator new((bytes + kAlign - 1) / kAlign * kAlign + kAlign, std::align_val_t(kAlign));
    owner = nb::capsule(data, [](void* p) noexcept {
      ::operator delete(p, std::align_val_t(kAlign));
    });
    device = 0;
  }
  nb::dlpack::dtype dt{};
  dt.code = static_cast<uint8_t>(*dtype == DType::bf16 ? nb::dlpack::dtype_code::Bfloat
                                                        : nb::dlpack::dtype_code::Float);
  dt.bits = static_cast<uint8_t>(8 * flashtile::dtype_size(*dtype));
  dt.lanes = 1;
  return nb::ndarray<nb::array_api>(data, shape.size(), shape.data(), owner, nullptr, dt,
                                    dlpack_device, device);
}

// (name, device, available, reason) for every backend, in journey order.
std::vector<std::tuple<std::string, std::string, bool, std::string>> backends() {
  std::vector<std::tuple<std::string, std::string, bool, std::string>> rows;
  for (flashtile::Backend b : flashtile::all_backends()) {
    std::string reason = flashtile::backend_unavailable_reason(b);
    rows.emplace_back(std::string(flashtile::backend_name(b)),
                      flashtile::backend_device(b) == flashtile::DeviceType::cpu ? "cpu" : "cuda",
                      reason.empty(), reason);
  }
  return rows;
}

}  // namespace

#if FLASHTILE_WITH_JAX
void define_jax_ffi(nb::module_& m);  // jax_ffi.cpp: flashtile.jax's XLA FFI handlers
#endif

NB_MODULE(_flashtile, m) {
  m.doc() = "flashtile's C++ core; use the functions of the flashtile package instead.";
  m.attr("__version__") = std::string(flashtile::version());
  m.attr("cuda_compiled") = bool(FLASHTILE_WITH_CUDA);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      PyObject* type = PyExc_ValueError;  // invalid_argument, unsupported
      if (e.kind() == ErrorKind::dtype) type = PyExc_TypeError;
      if (e.kind() == ErrorKind::runtime) type = PyExc_RuntimeError;
      PyErr_SetString(type, e.what());
    }
  });

  nb::class_<CallArgs>(m, "CallArgs", "The options of one forward/plan call, set by name.")
      .def(nb::init<>())
      .def_rw("causal", &CallArgs::causal)
      .def_rw("scale", &CallArgs::scale)
      .def_rw("window_left", &CallArgs::window_left)
      .def_rw("window_right", &CallArgs::window_right)
      .def_rw("softcap", &CallArgs::softcap)
      .def_rw("alibi_slopes", &CallArgs::alibi_slopes)
      .def_rw("sinks", &CallArgs::sinks)
      .def_rw("cu_seqlens_q", &CallArgs::cu_seqlens_q)
      .def_rw("cu_seqlens_k", &CallArgs::cu_seqlens_k)
      .def_rw("seqused_k", &CallArgs::seqused_k)
      .def_rw("max_seqlen_q", &CallArgs::max_seqlen_q)
      .def_rw("max_seqlen_k", &CallArgs::max_seqlen_k)
      .def_rw("backend", &CallArgs::backend)
      .def_rw("stream", &CallArgs::stream)
      .def_rw("uint16_is_bf16", &CallArgs::uint16_is_bf16)
      .def_rw("deterministic", &CallArgs::deterministic);
  m.def("forward", &forward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "args"_a,
        "Writes attention(q, k, v) into out (and lse); BSHD views (packed 3-D views when "
        "args.cu_seqlens_q is set), nothing copied.");
  m.def("backward", &backward, "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a, "lse"_a, "dq"_a, "dk"_a,
        "dv"_a, "dsinks"_a.none(), "args"_a, "dlse"_a.none() = nb::none(),
        "Writes the gradients dq, dk, dv (and dsinks) of attention for dout (and dlse, the "
        "gradient into the LSE), from forward's out and lse; views as forward's, nothing "
        "copied.");
  m.def("plan", &plan, "q"_a, "k"_a, "v"_a, "out"_a, "args"_a,
        "(backend name, workspace bytes) forward would use, or the error it would raise.");
  m.def("empty", &empty, "shape"_a, "dtype"_a, "device_type"_a, "device"_a);
  m.def("backends", &backends);
  m.def("cuda_device_count", &flashtile::cuda_device_count);
  m.def("cuda_synchronize", &flashtile::cuda_synchronize, "device"_a,
        nb::call_guard<nb::gil_scoped_release>());
  // Whether `a` imports as a writable array: a DLPack export flagged read-only does not,
  // so out= can be refused with a message instead of "incompatible function arguments".
  m.def("is_writable_array", [](nb::handle a) {
    nb::ndarray<> writable;
    return nb::try_cast(a, writable);
  });
#if FLASHTILE_WITH_JAX
  nb::module_ jax_ffi = m.def_submodule("jax_ffi", "XLA FFI handlers for flashtile.jax");
  define_jax_ffi(jax_ffi);
#endif
}
