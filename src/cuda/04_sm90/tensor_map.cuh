// Host side of cuda_sm90's TMA loads: the tensor maps (CUtensorMap) of q, k and v, encoded
// with the driver's cuTensorMapEncodeTiled fetched through cudaGetDriverEntryPointByVersion,
// so the library needs no libcuda link. Each map views a BSHD tensor as 4-D (head_dim,
// rows, heads, batch) with its own strides, in boxes of 64 columns (one 128-byte swizzle
// block, the kernel's shared layout) by `box_rows` rows; rows past the tensor read as zeros.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "api/params.hpp"

namespace flashtile::detail::sm90 {

// The three maps a TMA kernel reads (kernel parameter, __grid_constant__).
struct TmaMaps {
  CUtensorMap q, k, v;
};

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return PFN_cuTensorMapEncodeTiled_v12000{nullptr};
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// Encodes one 4-D map (dims innermost first, byte strides of dims 1..3) in boxes of
// box_cols x box_rows x 1 x 1 with the 128-byte swizzle; false when the driver refuses it.
inline bool encode_4d_map(CUtensorMap& map, CUtensorMapDataType type, int64_t element_bytes,
                          const void* data, const int64_t (&dims)[4], const int64_t (&strides)[3],
                          int box_cols, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t sizes[4] = {cuuint64_t(dims[0]), cuuint64_t(dims[1]), cuuint64_t(dims[2]),
                               cuuint64_t(dims[3])};
  const cuuint64_t byte_strides[3] = {cuuint64_t(strides[0] * element_bytes),
                                      cuuint64_t(strides[1] * element_bytes),
                                      cuuint64_t(strides[2] * element_bytes)};
  const cuuint32_t box[4] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  return encode(&map, type, 4, const_cast<void*>(data), sizes, byte_strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A 16-bit BSHD tensor as (head_dim, rows, heads, batch), boxes of 64 columns (one swizzle
// block of the kernels' tiles) by box_rows.
inline bool encode_bshd_map(CUtensorMap& map, DType dtype, const void* data, int64_t head_dim,
                            int64_t rows, int64_t heads, int64_t batch, int64_t row_stride,
                            int64_t head_stride, int64_t batch_stride, int box_rows) {
  const CUtensorMapDataType type = dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                        : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode_4d_map(map, type, 2, data, {head_dim, rows, heads, batch},
                       {row_stride, head_stride, batch_stride}, 64, box_rows);
}

// The maps of a dense call (Q in boxes of block_m rows, K and V of block_n); false when any
// cannot be encoded. Varlen batches are not served by TMA: past a sequence's end the box
// would hold the next sequence's rows instead of zeros.
inline bool encode_dense_maps(const AttentionParams& p, int block_m, int block_n, TmaMaps& maps) {
  if (p.is_varlen()) return false;
  return encode_bshd_map(maps.q, p.dtype, p.q, p.head_dim, p.seqlen_q, p.heads_q, p.batch,
                         p.q_row_stride, p.q_head_stride, p.q_batch_stride, block_m) &&
         encode_bshd_map(maps.k, p.dtype, p.k, p.head_dim, p.seqlen_k, p.heads_kv, p.batch,
                         p.k_row_stride, p.k_head_stride, p.k_batch_stride, block_n) &&
         encode_bshd_map(maps.v, p.dtype, p.v, p.head_dim, p.seqlen_k, p.heads_kv, p.batch,
                         p.v_row_stride, p.v_head_stride, p.v_batch_stride, block_n);
}

}  // namespace flashtile::detail::sm90
