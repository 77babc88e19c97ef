// The one plain parameter struct every kernel reads (as FlashAttention's flash.h).
// Built by the validator after every check has passed; offsets are int64 throughout
// so that B·S·H·D > 2^31 stays correct.
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
  float* lse = nullptr;  // contiguous [batch, heads_q, seqlen_q] or null

  DType dtype = DType::f32;
  int device_index = 0;
  void* stream = nullptr;

  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0;

  // Strides in elements, BSH order (the head_dim stride is 1).
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;

  float scale = 1.0f;
  bool causal = false;

  FT_HOST_DEVICE int64_t heads_per_kv() const { return heads_q / heads_kv; }
  // Bottom-right causal alignment: query row i sees keys j <= i + causal_offset().
  FT_HOST_DEVICE int64_t causal_offset() const { return seqlen_k - seqlen_q; }
};

// Checks every argument of forward() (out may be null for the oracle, which has none)
// and builds the params; throws flashtile::Error naming the argument on any problem.
AttentionParams validate(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView* out, const Options& options);

}  // namespace flashtile::detail
