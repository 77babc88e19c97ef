// flashtile._flashtile: the nanobind binding under the Python package.
//
// It takes any array nanobind can import (numpy through the buffer protocol or DLPack;
// torch, CuPy, JAX and others through DLPack) as a non-owning view, so nothing is copied.
// Allocation of outputs and the choice of CUDA stream are the Python layer's job
// (python/flashtile/_api.py); this file only turns arrays into TensorViews, releases the
// GIL and calls flashtile::forward, whose flashtile::Error becomes ValueError/TypeError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "flashtile/device.hpp"
#include "flashtile/flashtile.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using flashtile::DType;
using flashtile::Error;
using flashtile::ErrorKind;

// Errors raised by this binding read like those of the library, with its prefix.
template <class... Parts>
[[noreturn]] void fail(ErrorKind kind, const Parts&... parts) {
  std::string message = "flashtile.attention: ";
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

// numpy has no bfloat16: the Python layer passes ml_dtypes.bfloat16 arrays as uint16 views
// and sets `uint16_is_bf16` (it refuses genuine uint16 arrays itself).
DType to_dtype(nb::dlpack::dtype dt, const char* name, bool uint16_is_bf16) {
  const auto code = static_cast<nb::dlpack::dtype_code>(dt.code);
  if (dt.lanes == 1) {
    if (code == nb::dlpack::dtype_code::Float && dt.bits == 32) return DType::f32;
    if (code == nb::dlpack::dtype_code::Float && dt.bits == 16) return DType::f16;
    if (code == nb::dlpack::dtype_code::Bfloat && dt.bits == 16) return DType::bf16;
    if (uint16_is_bf16 && code == nb::dlpack::dtype_code::UInt && dt.bits == 16) return DType::bf16;
  }
  fail(ErrorKind::dtype, name, ".dtype must be float32, float16 or bfloat16, got ",
       dtype_string(dt));
}

flashtile::Device to_device(int device_type, int device_id, const char* name) {
  if (device_type == nb::device::cpu::value) return flashtile::Device::cpu();
  if (device_type == nb::device::cuda::value) return flashtile::Device::cuda(device_id);
  fail(ErrorKind::invalid_argument, name,
       " must live in CPU memory or CUDA device memory, got DLPack device type ",
       std::to_string(device_type));
}

// A non-owning BSHD view of `a`. nanobind reports strides in elements, as TensorView wants;
// the validator in flashtile::forward checks the rest (last stride 1, no negatives, shapes).
template <class Array>
flashtile::TensorView to_view(const Array& a, const char* name, bool uint16_is_bf16) {
  if (a.ndim() != 4)
    fail(ErrorKind::invalid_argument, name,
         " must be 4-D (batch, seqlen, heads, head_dim), got ", std::to_string(a.ndim()), "-D");
  flashtile::TensorView view;
  view.data = const_cast<void*>(static_cast<const void*>(a.data()));
  view.dtype = to_dtype(a.dtype(), name, uint16_is_bf16);
  view.device = to_device(a.device_type(), a.device_id(), name);
  for (int i = 0; i < 4; ++i) {
    view.shape[i] = static_cast<int64_t>(a.shape(i));
    view.strides[i] = a.stride(i);
  }
  // A stride of a size-1 dimension is never used; frameworks are free to report anything.
  if (view.shape[3] == 1) view.strides[3] = 1;
  return view;
}

// lse must be the fp32, C-contiguous [batch, heads_q, seqlen_q] buffer Options::lse points to.
float* lse_pointer(const nb::ndarray<>& lse, const flashtile::TensorView& q) {
  if (lse.ndim() != 3)
    fail(ErrorKind::invalid_argument, "lse must be 3-D (batch, heads, seqlen_q), got ",
         std::to_string(lse.ndim()), "-D");
  const auto dt = lse.dtype();
  if (!(dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && dt.bits == 32 &&
        dt.lanes == 1))
    fail(ErrorKind::dtype, "lse.dtype must be float32, got ", dtype_string(dt));
  const int64_t expected[3] = {q.batch(), q.heads(), q.seqlen()};
  int64_t contiguous_stride = 1;
  for (int i = 2; i >= 0; --i) {
    if (static_cast<int64_t>(lse.shape(i)) != expected[i])
      fail(ErrorKind::invalid_argument, "lse.shape must be (", std::to_string(expected[0]), ", ",
           std::to_string(expected[1]), ", ", std::to_string(expected[2]), "), got (",
           std::to_string(lse.shape(0)), ", ", std::to_string(lse.shape(1)), ", ",
           std::to_string(lse.shape(2)), ")");
    if (expected[i] > 1 && lse.stride(i) != contiguous_stride)
      fail(ErrorKind::invalid_argument, "lse must be C-contiguous");
    contiguous_stride *= expected[i];
  }
  if (!(to_device(lse.device_type(), lse.device_id(), "lse") == q.device))
    fail(ErrorKind::invalid_argument, "lse must be on the device of q (",
         flashtile::device_name(q.device), ")");
  return static_cast<float*>(lse.data());
}

flashtile::Backend to_backend(std::string_view name) {
  if (std::optional<flashtile::Backend> backend = flashtile::parse_backend(name)) return *backend;
  std::string names = "auto";
  for (flashtile::Backend b : flashtile::all_backends())
    names += std::string(", ") + std::string(flashtile::backend_name(b));
  fail(ErrorKind::invalid_argument, "backend must be one of ", names, "; got '",
       std::string(name), "'");
}

void forward(nb::ndarray<nb::ro> q, nb::ndarray<nb::ro> k, nb::ndarray<nb::ro> v,
             nb::ndarray<> out, std::optional<nb::ndarray<>> lse, bool causal,
             std::optional<float> scale, std::string_view backend, uintptr_t stream,
             bool uint16_is_bf16) {
  flashtile::Options options;
  options.causal = causal;
  options.scale = scale;
  options.backend = to_backend(backend);
  options.stream = reinterpret_cast<void*>(stream);
  const flashtile::TensorView qv = to_view(q, "q", uint16_is_bf16);
  const flashtile::TensorView kv = to_view(k, "k", uint16_is_bf16);
  const flashtile::TensorView vv = to_view(v, "v", uint16_is_bf16);
  const flashtile::TensorView ov = to_view(out, "out", uint16_is_bf16);
  if (lse) options.lse = lse_pointer(*lse, qv);
  // CPU backends compute here, in this thread: let other Python threads run meanwhile.
  nb::gil_scoped_release release;
  flashtile::forward(qv, kv, vv, ov, options);
}

std::string plan(nb::ndarray<nb::ro> q, nb::ndarray<nb::ro> k, nb::ndarray<nb::ro> v,
                 nb::ndarray<nb::ro> out, bool causal, std::optional<float> scale,
                 std::string_view backend, bool uint16_is_bf16) {
  flashtile::Options options;
  options.causal = causal;
  options.scale = scale;
  options.backend = to_backend(backend);
  return std::string(flashtile::backend_name(
      flashtile::plan(to_view(q, "q", uint16_is_bf16), to_view(k, "k", uint16_is_bf16),
                      to_view(v, "v", uint16_is_bf16), to_view(out, "out", uint16_is_bf16),
                      options)
          .backend));
}

// A C-contiguous array that owns its memory (cudaMalloc on a CUDA device, else 64-byte
// aligned host memory), for frameworks whose arrays cannot be allocated empty and written
// (JAX). It is returned as an object with __dlpack__/__dlpack_device__, which the caller's
// framework imports without a copy (from_dlpack).
nb::ndarray<nb::array_api> empty(std::vector<size_t> shape, std::string_view dtype_name,
                                 std::string_view device_type, int device) {
  const std::optional<DType> dtype = flashtile::parse_dtype(dtype_name);
  if (!dtype) fail(ErrorKind::dtype, "unknown dtype '", std::string(dtype_name), "'");
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

NB_MODULE(_flashtile, m) {
  m.doc() = "flashtile's C++ core; use the functions of the flashtile package instead.";
  m.attr("__version__") = FLASHTILE_VERSION;
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

  m.def("forward", &forward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "causal"_a,
        "scale"_a.none(), "backend"_a, "stream"_a, "uint16_is_bf16"_a,
        "Writes attention(q, k, v) into out (and lse); all BSHD views, nothing copied.");
  m.def("plan", &plan, "q"_a, "k"_a, "v"_a, "out"_a, "causal"_a, "scale"_a.none(), "backend"_a,
        "uint16_is_bf16"_a, "Name of the backend forward would run (or the error it would raise).");
  m.def("empty", &empty, "shape"_a, "dtype"_a, "device_type"_a, "device"_a);
  m.def("backends", &backends);
  m.def("cuda_device_count", &flashtile::cuda_device_count);
  m.def("cuda_synchronize", &flashtile::cuda_synchronize, "device"_a,
        nb::call_guard<nb::gil_scoped_release>());
}
