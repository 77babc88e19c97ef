// Where sequence b lives and how long it is, for dense and packed varlen batches alike
// (the idea of FlashAttention-2's block_info.h and FlashAttention-3's seqlen.h). Every
// element offset and LSE index a kernel computes comes from here.
//
// Dense: every sequence has seqlen_q queries and seqlen_k keys, and starts at row 0 of its
// batch entry. Varlen: sequence b owns packed rows [cu_seqlens[b], cu_seqlens[b+1]) (batch
// strides are 0), and seqused_k, when given, shortens its keys.
#pragma once

#include <cstdint>

#include "api/params.hpp"
#include "attn/mask.hpp"

namespace flashtile::detail {

// Int: the position type of the kernel (int on the GPU, int64_t on the CPU).
template <class Int>
struct SeqlenInfo {
  Int q_start = 0, k_start = 0;  // first packed row of the sequence (0 when dense)
  Int seqlen_q = 0, seqlen_k = 0;

  FT_HOST_DEVICE SeqlenInfo(const AttentionParams& p, int64_t b) {
    if (p.cu_seqlens_q != nullptr) {
      q_start = static_cast<Int>(p.cu_seqlens_q[b]);
      k_start = static_cast<Int>(p.cu_seqlens_k[b]);
      seqlen_q = static_cast<Int>(p.cu_seqlens_q[b + 1]) - q_start;
      seqlen_k = p.seqused_k != nullptr ? static_cast<Int>(p.seqused_k[b])
                                        : static_cast<Int>(p.cu_seqlens_k[b + 1]) - k_start;
    } else {
      seqlen_q = static_cast<Int>(p.seqlen_q);
      seqlen_k = static_cast<Int>(p.seqlen_k);
    }
  }

  // The causal/window mask of this sequence (aligned to its own lengths).
  FT_HOST_DEVICE Mask<Int> mask(const AttentionParams& p) const {
    return Mask<Int>(p.window_left, p.window_right, seqlen_q, seqlen_k);
  }

  // Element offsets of query row i / key row j (positions inside the sequence) of head h.
  FT_HOST_DEVICE int64_t q_offset(const AttentionParams& p, int64_t b, Int i, int64_t h) const {
    return b * p.q_batch_stride + int64_t(q_start + i) * p.q_row_stride + h * p.q_head_stride;
  }
  FT_HOST_DEVICE int64_t k_offset(const AttentionParams& p, int64_t b, Int j, int64_t hk) const {
    return b * p.k_batch_stride + int64_t(k_start + j) * p.k_row_stride + hk * p.k_head_stride;
  }
  FT_HOST_DEVICE int64_t v_offset(const AttentionParams& p, int64_t b, Int j, int64_t hk) const {
    return b * p.v_batch_stride + int64_t(k_start + j) * p.v_row_stride + hk * p.v_head_stride;
  }
  FT_HOST_DEVICE int64_t o_offset(const AttentionParams& p, int64_t b, Int i, int64_t h) const {
    return b * p.o_batch_stride + int64_t(q_start + i) * p.o_row_stride + h * p.o_head_stride;
  }
  // The same for another view shaped as q (dout, dq) or as k (dk, dv): its own strides.
  FT_HOST_DEVICE int64_t row_offset_q(const ViewStrides& s, int64_t b, Int i, int64_t h) const {
    return b * s.batch + int64_t(q_start + i) * s.row + h * s.head;
  }
  FT_HOST_DEVICE int64_t row_offset_k(const ViewStrides& s, int64_t b, Int j, int64_t hk) const {
    return b * s.batch + int64_t(k_start + j) * s.row + hk * s.head;
  }
  // Index into p.lse of query row i of head h.
  FT_HOST_DEVICE int64_t lse_index(const AttentionParams& p, int64_t b, int64_t h, Int i) const {
    return b * p.lse_batch_stride + h * p.lse_head_stride + int64_t(q_start + i);
  }
};

}  // namespace flashtile::detail
