// The one plain parameter struct every kernel reads (as FlashAttention's flash.h). Every
// feature is a field with an "off" value (null pointer, -1, 0), built by the validator
// after every check has passed and consumed in exactly one shared piece of src/attn/.
// Offsets are int64 throughout so that B·S·H·D > 2^31 stays correct.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"
#include "flashtile/flashtile.hpp"

namespace flashtile::detail {

struct AttentionParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // see lse_batch_stride / lse_head_stride, or null

  DType dtype = DType::f32;
  int device_index = 0;
  void* stream = nullptr;

  // Dense: the tensors' batch and lengths. Varlen: batch = number of sequences and
  // seqlen_q/seqlen_k = the longest sequence (per-sequence lengths: attn/seqlen.hpp).
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0;

  // Strides in elements, BSH order (the head_dim stride is 1). Varlen: batch strides are 0
  // and rows are packed positions.
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  // LSE element of (batch b, head h, packed query row r) is
  // b·lse_batch_stride + h·lse_head_stride + r: [batch, heads, seqlen_q], or
  // [heads, total_q] for varlen (lse_batch_stride 0).
  int64_t lse_batch_stride = 0, lse_head_stride = 0;

  float scale = 1.0f;

  // ---- the variant (attn/mask.hpp, attn/variant.hpp) --------------------------------
  // Sliding window, normalised by the validator: -1 = unbounded side; causal => right = 0.
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.0f;  // 0 = off
  // ALiBi slope of (b, h) = alibi_slopes[b·alibi_batch_stride + h·alibi_head_stride].
  const float* alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0, alibi_head_stride = 0;
  // Sink logit of head h = sinks[h·sinks_stride].
  const float* sinks = nullptr;
  int64_t sinks_stride = 0;

  // ---- varlen (attn/seqlen.hpp) --------------------------------------------------------
  // Device (or host, for CPU backends) int32 arrays of batch + 1 (seqused_k: batch).
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* seqused_k = nullptr;
  int64_t total_q = 0, total_k = 0;  // packed rows of q and of k/v (dense: 0)

  FT_HOST_DEVICE int64_t heads_per_kv() const { return heads_q / heads_kv; }
  FT_HOST_DEVICE bool is_varlen() const { return cu_seqlens_q != nullptr; }
  FT_HOST_DEVICE bool is_causal() const { return window_right == 0 && window_left < 0; }
  // Any mask beyond "every key": causal or a window.
  FT_HOST_DEVICE bool has_mask() const { return window_left >= 0 || window_right >= 0; }
  // Features beyond dense, causal-or-full attention: what the journey kernels refuse.
  bool has_variant() const {
    return (has_mask() && !is_causal()) || softcap != 0.0f || alibi_slopes != nullptr ||
           sinks != nullptr || is_varlen();
  }
};

// Strides in elements of one more BSHD view with the shape of q (or of k), BSH order; batch
// 0 for varlen. SeqlenInfo turns them into offsets (row_offset_q / row_offset_k).
struct ViewStrides {
  int64_t batch = 0, row = 0, head = 0;
};

// The backward pass: the forward's parameters (o and lse are inputs here) and the gradients.
struct BackwardParams {
  AttentionParams fwd;
  const void* dout = nullptr;  // shape and dtype of q
  void* dq = nullptr;          // shape and dtype of q
  void* dk = nullptr;          // shape and dtype of k
  void* dv = nullptr;          // shape and dtype of v
  ViewStrides dout_strides, dq_strides, dk_strides, dv_strides;
  float* dsinks = nullptr;     // (heads_q) contiguous fp32, or null
  // ∂loss/∂lse: fp32 at fwd.lse's indices (SeqlenInfo::lse_index), or null (no gradient).
  const float* dlse = nullptr;
  bool deterministic = false;
};

// The gradient arguments of a backward call.
struct BackwardArgs {
  const TensorView& dout;
  const float* lse;
  const TensorView& dq;
  const TensorView& dk;
  const TensorView& dv;
};

// Which call is being validated: forward() (out given), the oracle (no out) or
// forward_varlen() (varlen given).
struct CallArgs {
  const TensorView& q;
  const TensorView& k;
  const TensorView& v;
  const TensorView* out;     // null for the oracle
  const Varlen* varlen;      // null for dense calls
  const Options& options;
  const char* api = "flashtile::forward";  // prefix of every error message
};

// Checks every argument (sizes with overflow-checked arithmetic, devices, dtypes, overlaps,
// variant parameters, cu_seqlens) and builds the params; throws flashtile::Error naming the
// argument on any problem.
AttentionParams validate(const CallArgs& call);
// The same for backward(): call.out is forward's output (an input here), call.options.lse
// must be null, and `grads` is checked in the same style (shapes, dtypes, devices, every
// output against every input and every other output).
BackwardParams validate_backward(const CallArgs& call, const BackwardArgs& grads);

// One-line description of the variant, for unsupported_reason messages ("window (128, 0)").
std::string describe_variant(const AttentionParams& p);

}  // namespace flashtile::detail
