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
  // A C-order packed varlen tensor (total_tokens, heads, head_dim), as the 4-D view
  // (1, total_tokens, heads, head_dim) that forward_varlen takes.
  static TensorView packed(void* data, DType dtype, Device device, std::array<int64_t, 3> shape) {
    return contiguous(data, dtype, device, {1, shape[0], shape[1], shape[2]});
  }
};

enum class Backend {
  automatic,      // the selector picks the fastest backend that supports the call
  cpu_reference,  // double-precision standard attention (the oracle); slow, any dtype
  cpu_standard,   // the write-up's baseline: materialised S, three-pass softmax, fp32
  cpu_flash,      // tiled online-softmax on the CPU (SIMD + threads)
  cuda_naive,     // journey step 1: one thread per query row
  cuda_tiled,     // journey step 2: shared-memory tiles, scores in registers
  cuda_tf32x3,    // journey step 2b: fp32 on tensor cores, split TF32 (3xTF32), sm_80+
  cuda_mma,       // journey step 3: tensor cores (mma.sync), fp16/bf16, sm_80+
  cuda_sm90,      // journey step 4: Hopper wgmma, fp16/bf16, sm_90a (built for 90a only)
};

std::string_view backend_name(Backend backend);
std::optional<Backend> parse_backend(std::string_view name);
// Every named backend (not `automatic`), in journey order.
const std::vector<Backend>& all_backends();

// A sliding window (FlashAttention's window_size). Query i sees key j when
// j - (i + seqlen_k - seqlen_q) lies in [-left, right], per sequence; -1 leaves that side
// unbounded. Causal is right = 0 (Options::causal sets it, whatever `right` says).
struct Window {
  int64_t left = -1;
  int64_t right = -1;
  bool bounded() const { return left >= 0 || right >= 0; }
};

// A small fp32 tensor of per-head parameters (ALiBi slopes, sinks): 1-D (heads) or 2-D
// (batch, heads), strides in elements, on the device of q. A null `data` means "not given".
struct ParamView {
  const float* data = nullptr;
  Device device{};
  int ndim = 1;
  std::array<int64_t, 2> shape{};    // (n) or (rows, cols)
  std::array<int64_t, 2> strides{};  // in elements

  bool given() const { return data != nullptr; }
  static ParamView vector(const float* data, Device device, int64_t n) {
    return {data, device, 1, {n, 0}, {1, 0}};
  }
  static ParamView matrix(const float* data, Device device, int64_t rows, int64_t cols) {
    return {data, device, 2, {rows, cols}, {cols, 1}};
  }
};

struct Options {
  std::optional<float> scale;  // default 1/sqrt(head_dim)
  // Causal mask aligned bottom-right (FlashAttention >= 2.1): query i sees key j when
  // j <= i + seqlen_k - seqlen_q. The same as window.right = 0.
  bool causal = false;
  Window window;
  // Logits, in this order: S = scale·q·k; S <- softcap·tanh(S/softcap) when softcap > 0;
  // S <- S - slope_h·|i + seqlen_k - seqlen_q - j| with ALiBi slopes (fp32, shaped
  // (heads_q) or (batch, heads_q)).
  float softcap = 0.0f;
  ParamView alibi_slopes;
  // Attention sinks (gpt-oss): one fp32 logit per query head, shaped (heads_q). Each joins
  // every row's softmax denominator, contributes no value, and is included in the LSE.
  ParamView sinks;
  // A row that sees no key (and has no sink) outputs 0 with LSE = -inf.
  // Optional log-sum-exp output: fp32, natural log, contiguous [batch, heads_q, seqlen_q]
  // ([heads_q, total_q] for a varlen batch), on the same device as q.
  float* lse = nullptr;
  Backend backend = Backend::automatic;
  void* stream = nullptr;  // cudaStream_t for CUDA backends; nullptr = default stream

  // ---- backward only (forward ignores these) ----------------------------------------
  // Bitwise-equal gradients run to run (any accumulation order fixed). Backends whose
  // gradients are deterministic by construction (cpu_reference, cpu_flash) honour it always.
  bool deterministic = false;
  // Optional gradient of the sink logits: fp32, contiguous (heads_q), on the device of q;
  // only with `sinks`. backward() overwrites it (it is a sum over every query row).
  float* dsinks = nullptr;
  // Optional gradient of the loss with respect to the LSE forward returned (when the loss
  // uses the LSE: merging partial attention results, z-losses): fp32, contiguous, the LSE's
  // shape ([batch, heads_q, seqlen_q], [heads_q, total_q] varlen), on the device of q;
  // read only. Null: no gradient flows into the LSE.
  const float* dlse = nullptr;
};

// A packed variable-length batch, as flash_attn_varlen_func takes it. q, k, v and out are
// TensorViews with batch dimension 1 whose rows are the sequences one after another:
// sequence b owns query rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) and key rows
// [cu_seqlens_k[b], cu_seqlens_k[b+1]). The cu_seqlens are int32 of length batch + 1 on the
// device of q; they must be non-decreasing, cu_seqlens_q must run from 0 to total_q and
// cu_seqlens_k must stay inside k (the library reads them
// on the host to check this before anything runs, which synchronises the stream).
struct Varlen {
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  // Optional (batch) int32: sequence b uses only its first seqused_k[b] keys.
  const int32_t* seqused_k = nullptr;
  int64_t batch = 0;  // number of sequences
  // Optional upper bounds on the sequence lengths (flash_attn's max_seqlen_q/k); when
  // given they must hold, else they are computed from cu_seqlens.
  std::optional<int64_t> max_seqlen_q, max_seqlen_k;
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
// The same over a packed variable-length batch (see Varlen); masks align per sequence.
void forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const Varlen& varlen, const Options& options = {});

// What `forward` would do with these arguments (or the Error it would raise): the backend
// it runs and the scratch memory that backend allocates beyond the inputs and outputs.
struct Plan {
  Backend backend;
  int64_t workspace_bytes;
};
Plan plan(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
          const Options& options = {});
Plan plan_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& out, const Varlen& varlen, const Options& options = {});

// The backward pass: given dout = ∂L/∂out, writes dq, dk, dv (= ∂L/∂q, ∂L/∂k, ∂L/∂v, in the
// dtype and shape of q, k, v, any strides) and options.dsinks when given. `out` and `lse`
// are what forward() returned for these inputs and options (lse: fp32, contiguous
// [batch, heads_q, seqlen_q], [heads_q, total_q] varlen); P is recomputed from them, so no
// N×N matrix is stored. GQA/MQA: dk and dv sum over the query heads of each kv head.
// options.lse must be null (lse is an argument here); options.dlse, when given, is the
// LSE's own gradient, added to the gradients through out. Everything is validated on the
// host first; on error no gradient is written. The formulas are in docs/BACKWARD.md.
void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
              const TensorView& dout, const float* lse, const TensorView& dq, const TensorView& dk,
              const TensorView& dv, const Options& options = {});
// The same over a packed variable-length batch (see Varlen and forward_varlen).
void backward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const TensorView& dout, const float* lse,
                     const TensorView& dq, const TensorView& dk, const TensorView& dv,
                     const Varlen& varlen, const Options& options = {});
// What backward would do (or the Error it would raise): its backend and workspace, the fp32
// dQ accumulators and the row sums D = rowsum(dout∘out) included.
Plan plan_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const TensorView& dout, const float* lse,
                   const TensorView& dq, const TensorView& dk, const TensorView& dv,
                   const Options& options = {});
Plan plan_backward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const TensorView& dout, const float* lse,
                          const TensorView& dq, const TensorView& dk, const TensorView& dv,
                          const Varlen& varlen, const Options& options = {});

// The library's version (the one in CMakeLists.txt; flashtile.__version__ and
// `flashtile --version` report the same).
std::string_view version();

// How this build was configured, and what it finds on this machine (`flashtile info`).
struct BuildInfo {
  std::string version;
  std::string build_type;   // CMake's, e.g. "Release"
  std::string compiler;     // e.g. "GCC 12.2.0"
  std::string cuda;         // "off", or the CUDA runtime version and architectures built
  std::string cpu_simd;     // "off", or the Google Highway version
  std::string simd_target;  // the SIMD target cpu_flash runs on this CPU ("" without)
  std::string sanitizers;   // FLASHTILE_SANITIZE ("" when none)
};
BuildInfo build_info();

// Where a backend runs.
DeviceType backend_device(Backend backend);
// Whether a backend is compiled in and has its hardware here (for CUDA: a device).
bool backend_available(Backend backend);
// Why a backend is unavailable ("" when it is available).
std::string backend_unavailable_reason(Backend backend);

}  // namespace flashtile
