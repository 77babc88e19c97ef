// flashtile public API: exact attention O = softmax(Q·Kᵀ·scale)·V without the N×N matrix.
//
// Layout follows flash_attn_func: every tensor is a 4-D BSHD view
// (batch, seqlen, heads, head_dim) with int64 strides in elements and a last stride of 1.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace flashtile {

enum class DType { f32, f16, bf16 };
enum class DeviceType { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // CUDA ordinal; ignored on the CPU

  static constexpr Device cpu() { return {DeviceType::cpu, 0}; }
  static constexpr Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  friend constexpr bool operator==(const Device&, const Device&) = default;
};

std::size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
std::optional<DType> parse_dtype(std::string_view name);
std::string device_name(Device device);

// Non-owning view of a BSHD tensor.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  std::array<int64_t, 4> shape{};    // (batch, seqlen, heads, head_dim)
  std::array<int64_t, 4> strides{};  // in elements; strides[3] must be 1

  int64_t batch() const { return shape[0]; }
  int64_t seqlen() const { return shape[1]; }
  int64_t heads() const { return shape[2]; }
  int64_t head_dim() const { return shape[3]; }
  int64_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }

  // A C-order (contiguous) view of `shape`.
  static TensorView contiguous(void* data, DType dtype, Device device, std::array<int64_t, 4> shape);
};

enum class Backend {
  automatic,      // the selector picks the fastest backend that supports the call
  cpu_reference,  // double-precision standard attention (the oracle); slow, any dtype
  cpu_standard,   // the write-up's baseline: materialised S, three-pass softmax, fp32
  cpu_flash,      // tiled online-softmax on the CPU (SIMD + threads)
  cuda_naive,     // journey step 1: one thread per query row
  cuda_tiled,     // journey step 2: shared-memory tiles, scores in registers
  cuda_mma,       // journey step 3: tensor cores (mma.sync), fp16/bf16, sm_80+
};

std::string_view backend_name(Backend backend);
std::optional<Backend> parse_backend(std::string_view name);
// Every named backend (not `automatic`), in journey order.
const std::vector<Backend>& all_backends();

struct Options {
  std::optional<float> scale;  // default 1/sqrt(head_dim)
  // Causal mask aligned bottom-right (FlashAttention >= 2.1): query i sees key j when
  // j <= i + seqlen_k - seqlen_q. Rows that see no key output 0 with LSE = -inf.
  bool causal = false;
  // Optional log-sum-exp output: fp32, natural log, contiguous [batch, heads_q, seqlen_q],
  // on the same device as q.
  float* lse = nullptr;
  Backend backend = Backend::automatic;
  void* stream = nullptr;  // cudaStream_t for CUDA backends; nullptr = default stream
};

enum class ErrorKind {
  invalid_argument,  // shapes, strides, pointers, overlap, values
  dtype,             // wrong or mismatched dtype
  unsupported,       // valid call that the chosen backend (or any backend) cannot serve
  runtime,           // CUDA or system failure while running
};

// The one exception type flashtile throws. The message names the argument and gives
// the expected and the given values.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Computes out = softmax(q·kᵀ·scale)·v. Everything is validated on the host before any
// write; on error `out` and `lse` are untouched. CUDA backends run asynchronously on
// options.stream. Supports GQA/MQA: query head h reads kv head h / (heads_q / heads_kv).
void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const Options& options = {});

// What `forward` would do with these arguments (or the Error it would raise): the backend
// it runs and the scratch memory that backend allocates beyond the inputs and outputs.
struct Plan {
  Backend backend;
  int64_t workspace_bytes;
};
Plan plan(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
          const Options& options = {});

// Where a backend runs.
DeviceType backend_device(Backend backend);
// Whether a backend is compiled in and has its hardware here (for CUDA: a device).
bool backend_available(Backend backend);
// Why a backend is unavailable ("" when it is available).
std::string backend_unavailable_reason(Backend backend);

}  // namespace flashtile
