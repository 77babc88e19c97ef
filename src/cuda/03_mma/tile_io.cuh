// How cuda_mma moves rows of Q, K, V and O between global and shared memory.
//
// Shared tiles are swizzled rows of 16-byte chunks (8 elements). Two ways to fill them:
//  - the aligned path (every row of q, k, v and out starts on 16 bytes and head_dim is a
//    multiple of 8): one 16-byte cp.async per chunk, zero-filled past the end, and 16-byte
//    output stores. This is the fast path every framework layout takes.
//  - the narrow path (odd head dims, odd strides, offset pointers): each chunk is read with
//    the widest plain load the tensor's alignment allows (2, 4, 8 or 16 bytes), zero-filled
//    past head_dim, and written to shared memory as one 16-byte store; the output goes out
//    the same way. Nothing is refused for its alignment beyond the element size.
#pragma once

#include <cstdint>

#include "cuda/ptx/mma.cuh"

namespace flashtile::detail::mma {

// Elements per access that a 16-bit tensor allows: the largest power of two up to 8
// (8 = 16 bytes) dividing its address (in elements) and every stride. The address must
// be 2-byte aligned (checked on the host).
__host__ __device__ __forceinline__ int access_granule(const void* data, int64_t batch_stride,
                                                       int64_t row_stride, int64_t head_stride) {
  const uint64_t bits = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(data) / 2) |
                        static_cast<uint64_t>(batch_stride) | static_cast<uint64_t>(row_stride) |
                        static_cast<uint64_t>(head_stride) | 8u;
  return static_cast<int>(bits & (~bits + 1));  // lowest set bit
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile: the chunk index is
// XORed with row % 8, so the 8 rows one ldmatrix phase reads (same logical chunk) land in
// 8 different 16-byte bank groups. kRowChunks is a multiple of 8, so the XOR stays in-row.
template <class Cfg>
__device__ __forceinline__ uint32_t swizzle(int row, int chunk) {
  return static_cast<uint32_t>(row * Cfg::kRowChunks + (chunk ^ (row & 7))) * 16u;
}

// ---- the aligned path ------------------------------------------------------------------

// Copies rows [0, kRows) of a strided tensor (row 0 at `src`, `row_stride` elements apart)
// into a swizzled shared tile; rows >= valid_rows and chunks >= valid_chunks (past the true
// head_dim) are zero-filled, so padding never injects garbage (0·NaN) into the products.
template <class Cfg, int kRows, class T>
__device__ __forceinline__ void load_tile_async(uint32_t tile, const T* src, int64_t row_stride,
                                                int valid_rows, int valid_chunks) {
  const int chunk = threadIdx.x % Cfg::kRowChunks;
  const int row0 = threadIdx.x / Cfg::kRowChunks;
  if (chunk >= Cfg::kDataChunks) return;  // pitch padding (head_dim 96 only)
  const bool chunk_ok = chunk < valid_chunks;
#pragma unroll
  for (int i = 0; i < kRows / Cfg::kRowsPerPass; ++i) {
    const int row = row0 + i * Cfg::kRowsPerPass;
    const bool ok = chunk_ok && row < valid_rows;
    // A skipped copy still names a valid address (row 0 always exists) but reads nothing.
    const T* from = ok ? src + row * row_stride + chunk * 8 : src;
    ptx::cp_async_16(tile + swizzle<Cfg>(row, chunk), from, ok);
  }
}

// The same for a tile known to be whole (every row < seqlen): no per-row predicate and
// addresses that advance by a fixed stride, so each chunk costs a 64-bit add and a copy.
template <class Cfg, int kRows, class T>
__device__ __forceinline__ void load_full_tile_async(uint32_t tile, const T* src,
                                                     int64_t row_stride, int valid_chunks) {
  const int chunk = threadIdx.x % Cfg::kRowChunks;
  const int row0 = threadIdx.x / Cfg::kRowChunks;
  if (chunk >= Cfg::kDataChunks || chunk >= valid_chunks) {
    // Padding columns (head_dim below the specialisation) stay zero.
    if (chunk < Cfg::kDataChunks)
#pragma unroll
      for (int i = 0; i < kRows / Cfg::kRowsPerPass; ++i)
        ptx::cp_async_16(tile + swizzle<Cfg>(row0 + i * Cfg::kRowsPerPass, chunk), src, false);
    return;
  }
  const T* from = src + row0 * row_stride + chunk * 8;
  const int64_t pass_stride = Cfg::kRowsPerPass * row_stride;
  // Not unrolled up to head_dim 128 on purpose: unrolled, nvcc keeps every pass's 64-bit
  // offset live across the main loop, which costs the kernel its spare registers (spills at
  // head_dim 128). At 256 (4 rows per pass, short key tiles) the loop overhead shows more.
  constexpr int kUnroll = Cfg::kHeadDim > 128 ? kRows / Cfg::kRowsPerPass : 1;
#pragma unroll kUnroll
  for (int i = 0; i < kRows / Cfg::kRowsPerPass; ++i, from += pass_stride)
    ptx::cp_async_16(tile + swizzle<Cfg>(row0 + i * Cfg::kRowsPerPass, chunk), from);
}

// ---- the narrow path -------------------------------------------------------------------

// Reads the first `valid` (0..8) elements of the chunk at `src` into a 16-byte value, the
// rest zero, with accesses of kGranule elements (src is aligned to kGranule elements).
template <int kGranule>
__device__ __forceinline__ uint4 load_chunk_pieces(const uint16_t* src, int valid) {
  static_assert(kGranule == 1 || kGranule == 2 || kGranule == 4 || kGranule == 8,
                "a piece is 2, 4, 8 or 16 bytes");
  uint32_t w[4] = {0u, 0u, 0u, 0u};  // the chunk as 4 pairs of elements
#pragma unroll
  for (int at = 0; at < 8; at += kGranule) {
    if (at + kGranule <= valid) {
      if constexpr (kGranule == 8) {
        const uint4 x = *reinterpret_cast<const uint4*>(src);
        w[0] = x.x, w[1] = x.y, w[2] = x.z, w[3] = x.w;
      } else if constexpr (kGranule == 4) {
        const uint2 x = *reinterpret_cast<const uint2*>(src + at);
        w[at / 2] = x.x, w[at / 2 + 1] = x.y;
      } else if constexpr (kGranule == 2) {
        w[at / 2] = *reinterpret_cast<const uint32_t*>(src + at);
      } else {
        w[at / 2] |= static_cast<uint32_t>(src[at]) << (16 * (at % 2));
      }
    } else if constexpr (kGranule > 1) {
      // The tail of the row's last chunk: element by element.
#pragma unroll
      for (int e = at; e < at + kGranule; ++e)
        if (e < valid) w[e / 2] |= static_cast<uint32_t>(src[e]) << (16 * (e % 2));
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ uint4 load_chunk_narrow(const uint16_t* src, int valid, int granule) {
  switch (granule) {
    case 8: return load_chunk_pieces<8>(src, valid);
    case 4: return load_chunk_pieces<4>(src, valid);
    case 2: return load_chunk_pieces<2>(src, valid);
    default: return load_chunk_pieces<1>(src, valid);
  }
}

// Writes the first `valid` (0..8) elements of a 16-byte chunk to `dst` with accesses of
// kGranule elements (dst is aligned to kGranule elements).
template <int kGranule>
__device__ __forceinline__ void store_chunk_pieces(uint16_t* dst, uint4 value, int valid) {
  const uint32_t w[4] = {value.x, value.y, value.z, value.w};
#pragma unroll
  for (int at = 0; at < 8; at += kGranule) {
    if (at + kGranule <= valid) {
      if constexpr (kGranule == 8) {
        *reinterpret_cast<uint4*>(dst) = value;
      } else if constexpr (kGranule == 4) {
        *reinterpret_cast<uint2*>(dst + at) = make_uint2(w[at / 2], w[at / 2 + 1]);
      } else if constexpr (kGranule == 2) {
        *reinterpret_cast<uint32_t*>(dst + at) = w[at / 2];
      } else {
        dst[at] = static_cast<uint16_t>(w[at / 2] >> (16 * (at % 2)));
      }
    } else if constexpr (kGranule > 1) {
#pragma unroll
      for (int e = at; e < at + kGranule; ++e)
        if (e < valid) dst[e] = static_cast<uint16_t>(w[e / 2] >> (16 * (e % 2)));
    }
  }
}

__device__ __forceinline__ void store_chunk_narrow(uint16_t* dst, uint4 value, int valid,
                                                   int granule) {
  switch (granule) {
    case 8: store_chunk_pieces<8>(dst, value, valid); break;
    case 4: store_chunk_pieces<4>(dst, value, valid); break;
    case 2: store_chunk_pieces<2>(dst, value, valid); break;
    default: store_chunk_pieces<1>(dst, value, valid); break;
  }
}

// Elements of chunk `chunk` that lie inside a row of head_dim elements (0..8).
__device__ __forceinline__ int chunk_elements(int chunk, int head_dim) {
  const int left = head_dim - chunk * 8;
  return left < 0 ? 0 : (left > 8 ? 8 : left);
}

// The narrow counterpart of load_tile_async: synchronous loads (the fallback layouts give
// up the cp.async overlap), zero-filled past valid_rows and head_dim.
template <class Cfg, int kRows, class T>
__device__ __forceinline__ void load_tile_narrow(unsigned char* tile, const T* src,
                                                 int64_t row_stride, int valid_rows, int head_dim,
                                                 int granule) {
  const int chunk = threadIdx.x % Cfg::kRowChunks;
  const int row0 = threadIdx.x / Cfg::kRowChunks;
  if (chunk >= Cfg::kDataChunks) return;  // pitch padding (head_dim 96 only)
  const int chunk_valid = chunk_elements(chunk, head_dim);
  const uint16_t* base = reinterpret_cast<const uint16_t*>(src) + chunk * 8;
  for (int i = 0; i < kRows / Cfg::kRowsPerPass; ++i) {
    const int row = row0 + i * Cfg::kRowsPerPass;
    const int valid = row < valid_rows ? chunk_valid : 0;
    const uint4 value = load_chunk_narrow(base + row * row_stride, valid, granule);
    *reinterpret_cast<uint4*>(tile + swizzle<Cfg>(row, chunk)) = value;
  }
}

}  // namespace flashtile::detail::mma
