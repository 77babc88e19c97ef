// Journey step 2c — cuda_tf32x3 on wgmma (sm_90a only): the 3xTF32 scheme of kernel.cuh
// (step 2b) with both products on Hopper's asynchronous warpgroup MMA, wgmma.mma_async
// m64nNk8 with tf32 operands, instead of mma.sync m16n8k8.
//
// Same arithmetic as step 2b: every operand x is split into big = tf32(x) and small =
// tf32(x - big) (ptx/tf32.cuh; Inf travels in the small part) and each product is
// small·big + big·small + big·big. S's big·big sum and its two corrections have accumulators
// of their own, added once in fp32 round-to-nearest; O's products are summed on the tensor
// cores over one key tile only and then added to O in fp32 (the tensor cores' accumulation
// rounds toward zero: step 2b measured 8.7e-4 at N = 131072 with O accumulated over every
// key). P is split after its exp, in registers.
//
// Layout (the PTX ISA offers no transpose for .tf32: A and B are both K-major):
//  - Q (kBlockM, d), K (kBlockN, d): K-major 128-byte-swizzle tiles, as cuda_sm90's
//    (04_sm90/kernel.cuh: swizzled_offset, k_major_descriptor, which count 16-byte chunks and
//    32-byte k-steps and so serve 32-bit columns unchanged: a swizzle block is 32 floats, a
//    k-step of m64nNk8 is 8 floats). Each plane comes twice: big and small.
//  - V is needed as B of P·V, K-major over the keys: Vᵀ (d, kBlockN) per plane, written
//    transposed by the split. Inside every 8 keys its columns run 0, 2, 4, 6, 1, 3, 5, 7, so
//    that S's accumulator, whose lane holds keys 2t and 2t+1 of each 8, is P·V's A operand
//    as it stands (A's k-indices t and t + 4).
//  - Raw fp32 rows of the next K and V tile land by cp.async in a staging area while the
//    tensor cores work on this tile, and are split into the planes by the threads.
//
// The CTA: kWarpgroups consumer warpgroups of 64 query rows each, no producer warpgroup
// (every thread loads and splits), each wgmma group waited for before its result is used.
// Two pipelines (Tf32Sm90Config::kOverlapSplit):
//  - tf32x3_sm90_forward_kernel (d=128: a second plane set does not fit): one set of
//    planes; per tile every thread splits K and V (a CTA-wide transpose) between two
//    __syncthreads, with the tensor cores idle; the two warpgroups' wgmma either together
//    or in ping-pong order (FLASHTILE_TF32X3_SM90_SCHEDULE).
//  - tf32x3_sm90_producer_kernel (d=128, the default schedule): the same planes, and a third
//    warpgroup that splits K(j + 1) under P·V(j) and V(j + 1) under S(j + 1), on mbarriers.
//  - tf32x3_sm90_overlap_kernel (d=64): two sets; each thread stages and splits only its own
//    chunks (V as a 4x4 block it transposes itself), so tile j + 1 is split into the other
//    set while S(j)'s wgmma run, and one __syncthreads per tile remains.
// The accumulator of m64nNk8 lays each warp's 16 rows out as mma.sync's m16n8 tiles (row
// g / g + 8, columns 2t, 2t + 1 of each 8), so the score passes of mma_fragment.cuh
// (transform, mask, quad max) and step 2b's softmax and epilogue apply as they stand.
//
// Served (backend.cu decides): fp32, head_dim 64 or 128 exactly, rows on 16 bytes, 3xTF32,
// dense and varlen, every mask and variant (through src/attn/ as step 2b). Split-KV (2c.3):
// CTA x = query block · splits + split walks its split's share of the key blocks
// (split_key_blocks) and writes a partial for split_kv_combine.cuh, as step 2b's kernel.
//
// Measured (H200, fp32 field grid, 16k tokens, seqlen 1k-16k; docs/JOURNEY.md step 2c):
// d=64 47.3-60.6 TFLOP/s (1.53-1.83x SDPA's memory-efficient kernel in the same run),
// d=128 50.2-64.0 (1.27-1.46x); 1.31-1.54x the mma.sync kernel. Normwise error against the
// double oracle 1.4e-7..2.5e-7, as step 2b's. d=128 on the producer pipeline (step 2c.6):
// 74.6-80.2 full, 59.2-79.6 causal, 1.50-1.83x SDPA-efficient in the same run.
#pragma once

#include <cooperative_groups.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attn/block_range.hpp"
#include "attn/features.hpp"
#include "attn/seqlen.hpp"
#include "attn/softmax_state.hpp"
#include "attn/variant.hpp"
#include "cuda/04_sm90/kernel.cuh"
#include "cuda/05_tf32x3/kernel.cuh"
#include "cuda/05_tf32x3/sm90.hpp"
#include "cuda/common.cuh"
#include "cuda/mma_fragment.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/tf32.cuh"
#include "cuda/ptx/wgmma.cuh"

namespace flashtile::detail::tf32x3 {

// One configuration of the wgmma path (Tf32Sm90Traits picks one per head dim).
//   kHeadDim head dim (exact), kBlockN keys per tile, kWarpgroups consumer warpgroups
//   (64 query rows each), kOverlapSplit: two sets of K/Vᵀ planes, the next tile split under
//   this tile's S (tf32x3_sm90_overlap_kernel), else one set split between barriers.
template <int kHeadDim_, int kBlockN_, int kWarpgroups_, bool kOverlapSplit_>
struct Tf32Sm90Config {
  static constexpr int kHeadDim = kHeadDim_, kBlockN = kBlockN_, kWarpgroups = kWarpgroups_;
  static constexpr bool kOverlapSplit = kOverlapSplit_;
  static constexpr int kPlaneSets = kOverlapSplit ? 2 : 1;
  static constexpr int kBlockM = sm90::kWarpgroupRows * kWarpgroups;
  static constexpr int kThreads = sm90::kWarpgroupThreads * kWarpgroups;
  static constexpr int kChunks = kHeadDim / 4;    // 16-byte chunks per fp32 row
  static constexpr int kQKSteps = kHeadDim / 8;   // k-steps of Q·Kᵀ (8 dims each)
  static constexpr int kPVSteps = kBlockN / 8;    // k-steps of P·V (8 keys each)
  static constexpr int kNTiles = kBlockN / 8;     // 8-key column tiles of S per warp
  static constexpr int kDTiles = kHeadDim / 8;    // 8-column tiles of O per warp
  static constexpr int kQPlaneBytes = kBlockM * kHeadDim * 4;  // one swizzled Q plane
  static constexpr int kKPlaneBytes = kBlockN * kHeadDim * 4;  // one K plane (or Vᵀ plane)
  static constexpr int kStagingBytes = kBlockN * kHeadDim * 4;  // raw K (or V) rows, pitch d
  // [ Q big | Q small | set 0: K big | K small | Vᵀ big | Vᵀ small | set 1 ... | raw K |
  // raw V ], from a 1024-byte boundary (kSmemBytes holds the slack to reach it).
  static constexpr int kSmemBytes = 2 * kQPlaneBytes + kPlaneSets * 4 * kKPlaneBytes +
                                    2 * kStagingBytes + sm90::kAtomBytes;
  // The staging load is step 2b's load_tile (kernel.cuh), which asks for these.
  static constexpr int kMinBlocks = 1;

  static_assert(kHeadDim % 32 == 0, "head dim: whole 32-float swizzle blocks");
  static_assert(kBlockN % 32 == 0, "Vᵀ rows: whole 32-key swizzle blocks");
  static_assert(kBlockN % 8 == 0 && kBlockM % 8 == 0, "tiles hold whole 8-row swizzle atoms");
  static_assert(kQPlaneBytes % sm90::kAtomBytes == 0 && kKPlaneBytes % sm90::kAtomBytes == 0 &&
                    kStagingBytes % 16 == 0,
                "every plane starts on a 1024-byte swizzle atom, the staging on 16 bytes");
  static_assert(kThreads % kChunks == 0, "a pass of the CTA covers whole rows (load_tile)");
  static_assert((kBlockM * kChunks) % kThreads == 0 && (kBlockN * kChunks) % kThreads == 0,
                "Q and K/V tiles are whole passes of the CTA's threads");
  static_assert(kSmemBytes <= sm90::kSmemLimit, "the CTA's shared memory fits 227 KB");
};

// Head dims served and their tiles, chosen by what fits (not yet swept):
//  d=64 : 128 query rows, 64-key tiles, two plane sets (the overlapped pipeline): 64 KB of
//         Q planes + 2 x 64 KB of K/Vᵀ planes + 32 KB of staging = 225 KB.
//  d=128: 128 query rows, 32-key tiles, one set: 128 + 64 + 32 = 225 KB (a second set
//         does not fit). One CTA (8 warps) per SM either way.
template <int kHeadDim>
struct Tf32Sm90Traits;
template <>
struct Tf32Sm90Traits<64> : Tf32Sm90Config<64, 64, 2, true> {};
template <>
struct Tf32Sm90Traits<128> : Tf32Sm90Config<128, 32, 2, false> {};

// Shared-memory addresses of one CTA's planes (the map in Tf32Sm90Config).
template <class Cfg>
struct Tf32Sm90Smem {
  uint32_t q_big, q_small, planes, k_raw, v_raw;
  float* q_big_ptr;  // generic pointers of what threads read and write as floats
  float* k_raw_ptr;
  float* v_raw_ptr;
  unsigned char* base;
  __device__ __forceinline__ explicit Tf32Sm90Smem(unsigned char* raw_ptr) {
    const uint32_t raw = ptx::smem_addr(raw_ptr);
    q_big = sm90::atom_aligned(raw);
    base = raw_ptr + (q_big - raw);
    q_small = q_big + Cfg::kQPlaneBytes;
    planes = q_small + Cfg::kQPlaneBytes;
    k_raw = planes + Cfg::kPlaneSets * 4 * Cfg::kKPlaneBytes;
    v_raw = k_raw + Cfg::kStagingBytes;
    q_big_ptr = reinterpret_cast<float*>(base);
    k_raw_ptr = reinterpret_cast<float*>(base + (k_raw - q_big));
    v_raw_ptr = reinterpret_cast<float*>(base + (v_raw - q_big));
  }
  __device__ __forceinline__ unsigned char* at(uint32_t address) const {
    return base + (address - q_big);
  }
  // The K and Vᵀ planes of set `set` (0 or 1).
  __device__ __forceinline__ uint32_t k_big(int set) const { return plane(set, 0); }
  __device__ __forceinline__ uint32_t k_small(int set) const { return plane(set, 1); }
  __device__ __forceinline__ uint32_t vt_big(int set) const { return plane(set, 2); }
  __device__ __forceinline__ uint32_t vt_small(int set) const { return plane(set, 3); }

 private:
  __device__ __forceinline__ uint32_t plane(int set, int which) const {
    return planes + (set * 4 + which) * Cfg::kKPlaneBytes;
  }
};

// The 3xTF32 split of one 16-byte chunk, written to the same offset of two planes.
__device__ __forceinline__ void split_chunk_to(unsigned char* big, unsigned char* small,
                                               const float (&x)[4]) {
  uint32_t b[4], s[4];
  split4(x, b, s);
  *reinterpret_cast<uint4*>(big) = make_uint4(b[0], b[1], b[2], b[3]);
  *reinterpret_cast<uint4*>(small) = make_uint4(s[0], s[1], s[2], s[3]);
}

// kCount chunks a thread has gathered (x), split behind one finiteness test and written to
// the shared addresses big_at / small_at of their two planes.
template <int kCount, class Smem>
__device__ __forceinline__ void split_chunks_to(const Smem& sm, const float (&x)[kCount][4],
                                                const uint32_t (&big_at)[kCount],
                                                const uint32_t (&small_at)[kCount]) {
  uint32_t b[kCount][4], s[kCount][4];
  split_tf32x3<kCount * 4>(flat(x), flat(b), flat(s));
#pragma unroll
  for (int c = 0; c < kCount; ++c) {
    *reinterpret_cast<uint4*>(sm.at(big_at[c])) = make_uint4(b[c][0], b[c][1], b[c][2], b[c][3]);
    *reinterpret_cast<uint4*>(sm.at(small_at[c])) = make_uint4(s[c][0], s[c][1], s[c][2], s[c][3]);
  }
}

// Q rows [0, kBlockM) (row 0 at src) straight into the swizzled big plane by cp.async,
// rows >= valid_rows zero-filled; split in place afterwards (split_q).
// Thread tid's chunk `pass` of a tile that kThreads threads cover, kChunks chunks a row: row
// row0 + pass · (kThreads / kChunks), chunk `chunk` (the same for every pass). From the
// unsigned thread index, so that the compiler sees the rows step by a constant.
template <class Cfg, int kThreads = Cfg::kThreads>
struct OwnChunks {
  static_assert(kThreads % Cfg::kChunks == 0, "a pass covers whole rows");
  static constexpr int kPassRows = kThreads / Cfg::kChunks;
  int row0, chunk;
  __device__ __forceinline__ explicit OwnChunks(int tid = static_cast<int>(threadIdx.x))
      : row0(static_cast<int>(static_cast<unsigned>(tid) / Cfg::kChunks)),
        chunk(static_cast<int>(static_cast<unsigned>(tid) % Cfg::kChunks)) {}
  __device__ __forceinline__ int row(int pass) const { return row0 + pass * kPassRows; }
};

template <class Cfg>
__device__ __forceinline__ void load_q_swizzled(uint32_t q_big, const float* src,
                                                int64_t row_stride, int valid_rows) {
  constexpr int kPasses = Cfg::kBlockM * Cfg::kChunks / Cfg::kThreads;
  const OwnChunks<Cfg> own;
  const float* from = src + own.row0 * row_stride + own.chunk * 4;
  const int64_t pass_stride = OwnChunks<Cfg>::kPassRows * row_stride;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const bool ok = own.row(pass) < valid_rows;
    ptx::cp_async_16(q_big + sm90::swizzled_offset<Cfg::kBlockM>(own.row(pass), own.chunk),
                     ok ? from : src, ok);
    from += pass_stride;
  }
}

// Q's big plane holds raw fp32 values: each thread splits the chunks it loaded itself (the
// same ids as load_q_swizzled), big back in place, small into the small plane, up to 8
// chunks behind one test.
template <class Cfg>
__device__ __forceinline__ void split_q(const Tf32Sm90Smem<Cfg>& sm) {
  constexpr int kPasses = Cfg::kBlockM * Cfg::kChunks / Cfg::kThreads;
  constexpr int kBatch = kPasses < 8 ? kPasses : 8;
  static_assert(kPasses % kBatch == 0, "whole batches of chunks");
  const OwnChunks<Cfg> own;
#pragma unroll
  for (int first = 0; first < kPasses; first += kBatch) {
    float x[kBatch][4];
    uint32_t big_at[kBatch], small_at[kBatch];
#pragma unroll
    for (int c = 0; c < kBatch; ++c) {
      const uint32_t offset = sm90::swizzled_offset<Cfg::kBlockM>(own.row(first + c), own.chunk);
      big_at[c] = sm.q_big + offset, small_at[c] = sm.q_small + offset;
      const float4 x4 = *reinterpret_cast<const float4*>(sm.at(big_at[c]));
      x[c][0] = x4.x, x[c][1] = x4.y, x[c][2] = x4.z, x[c][3] = x4.w;
    }
    split_chunks_to<kBatch>(sm, x, big_at, small_at);
  }
}

// The staged raw K rows (load_tile's layout, row-major, pitch d) of a tile into set `set`'s
// K planes: chunk c of key row r to swizzled_offset<kBlockN>(r, c). Each thread splits the
// very chunks load_tile gave it (the overlapped pipeline relies on it to reload the staging
// without a barrier).
// The chunks a thread splits when `kThreads` threads share a tile, thread `tid` among
// them (every consumer thread, or the producer warpgroup of tf32x3_sm90_producer_kernel):
// pass p is key row row0 + p·kPassRows, chunk `chunk`. The swizzle repeats every 8 rows, so
// passes kPeriod apart lie a constant distance apart: every offset is one of kPeriod
// registers plus an immediate.
template <class Cfg, int kThreads>
struct KChunksOf : OwnChunks<Cfg, kThreads> {
  using OwnChunks<Cfg, kThreads>::kPassRows;
  using OwnChunks<Cfg, kThreads>::row0;
  using OwnChunks<Cfg, kThreads>::chunk;
  static constexpr int kPasses = Cfg::kBlockN / kPassRows;
  static_assert(kPassRows % 8 == 0 || 8 % kPassRows == 0, "the swizzle period is whole passes");
  static constexpr int kPeriod = kPassRows % 8 == 0 ? 1 : 8 / kPassRows;
  __device__ __forceinline__ explicit KChunksOf(int tid) : OwnChunks<Cfg, kThreads>(tid) {}
  // Passes first .. first + kCount - 1 of the staged raw rows into slots kSlot onwards.
  template <int kCount, int kSlot, int kSlots>
  __device__ __forceinline__ void gather(const Tf32Sm90Smem<Cfg>& sm, int set, int first,
                                         float (&x)[kSlots][4], uint32_t (&big_at)[kSlots],
                                         uint32_t (&small_at)[kSlots]) const {
    constexpr int kD = Cfg::kHeadDim;
    static_assert(kSlot + kCount <= kSlots, "room for the K chunks");
    const float* raw = sm.k_raw_ptr + row0 * kD + chunk * 4;
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      const int pass = first + i;
      const float4 x4 = *reinterpret_cast<const float4*>(raw + pass * kPassRows * kD);
      const uint32_t offset =
          sm90::swizzled_offset<Cfg::kBlockN>(row0 + (pass % kPeriod) * kPassRows, chunk) +
          (pass / kPeriod) * kPeriod * kPassRows * sm90::kSwizzleBytes;
      float(&to)[4] = x[kSlot + i];
      to[0] = x4.x, to[1] = x4.y, to[2] = x4.z, to[3] = x4.w;
      big_at[kSlot + i] = sm.k_big(set) + offset;
      small_at[kSlot + i] = sm.k_small(set) + offset;
    }
  }
};
// Thread tid's K chunks split, kBatch of them behind one test (all at once by default; the
// producer warpgroup, short of registers, takes one at a time).
template <class Cfg, int kThreads, int kBatch = KChunksOf<Cfg, kThreads>::kPasses>
__device__ __forceinline__ void split_k_chunks(const Tf32Sm90Smem<Cfg>& sm, int set, int tid) {
  using Own = KChunksOf<Cfg, kThreads>;
  static_assert(Own::kPasses % kBatch == 0, "whole batches of chunks");
  const Own own(tid);
#pragma unroll
  for (int first = 0; first < Own::kPasses; first += kBatch) {
    float x[kBatch][4];
    uint32_t big_at[kBatch], small_at[kBatch];
    own.template gather<kBatch, 0>(sm, set, first, x, big_at, small_at);
    split_chunks_to<kBatch>(sm, x, big_at, small_at);
  }
}
template <class Cfg>
__device__ __forceinline__ void split_own_k(const Tf32Sm90Smem<Cfg>& sm, int set) {
  split_k_chunks<Cfg, Cfg::kThreads>(sm, set, static_cast<int>(threadIdx.x));
}

// The first pipeline's split: the staged raw K and V rows (row-major, pitch d) into the
// four planes of set 0:
//  K: as split_own_k;
//  V: Vᵀ row n (head-dim column n), chunk c = keys 8·(c / 2) + (c % 2) + {0, 2, 4, 6}
//     (the 0, 2, 4, 6, 1, 3, 5, 7 order of every 8 keys), to swizzled_offset<d>(n, c).
// Threads take consecutive n for V, so a warp's four column reads hit 32 banks each and a
// quarter-warp's 16-byte stores 8 distinct swizzle positions.
template <class Cfg>
__device__ __forceinline__ void split_kv(const Tf32Sm90Smem<Cfg>& sm) {
  constexpr int kD = Cfg::kHeadDim;
  constexpr int kPasses = Cfg::kBlockN * Cfg::kChunks / Cfg::kThreads;
  split_own_k<Cfg>(sm, 0);
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int id = static_cast<int>(threadIdx.x) + pass * Cfg::kThreads;
    const int n = id % kD, chunk = id / kD;  // chunk: 4 key positions of Vᵀ row n
    const int key0 = 8 * (chunk / 2) + chunk % 2;
    const float* column = sm.v_raw_ptr + n;
    const float x[4] = {column[(key0 + 0) * kD], column[(key0 + 2) * kD],
                        column[(key0 + 4) * kD], column[(key0 + 6) * kD]};
    const uint32_t offset = sm90::swizzled_offset<kD>(n, chunk);
    split_chunk_to(sm.at(sm.vt_big(0) + offset), sm.at(sm.vt_small(0) + offset), x);
  }
}

template <int kRegs>
__device__ __forceinline__ void fence_accumulator(float (&r)[kRegs]) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) ptx::fence_register(r[i]);
}

// An accumulator of m64nNk8 (N/2 registers) seen as this warp's mma.sync-shaped tiles
// [1][N/8][4] (the same registers: ptx/wgmma.cuh's layout), for mma_fragment.cuh.
template <int kTiles>
__device__ __forceinline__ float (&as_mma_tiles(float (&acc)[kTiles * 4]))[1][kTiles][4] {
  return *reinterpret_cast<float(*)[1][kTiles][4]>(&acc);
}

// One consumer warpgroup's per-tile math (both pipelines): S = Q·Kᵀ (3 products), the
// transform, mask and online softmax, O += P·V (3 products), the epilogue. The thread's
// 16 rows (warp_row0 + g, + 8) and their state live here.
template <class Cfg, class Logits>
struct Tf32Sm90Consumer {
  static constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kD = Cfg::kHeadDim;
  static constexpr int kNTiles = Cfg::kNTiles, kDTiles = Cfg::kDTiles;
  static constexpr int kSRegs = kBlockN / 2, kORegs = kD / 2;
  static constexpr float kLog2e = 1.4426950408889634f;
  using MmaQK = ptx::WgmmaTf32<kBlockN>;  // S (64, kBlockN) = Q (64, d) · Kᵀ
  using MmaPV = ptx::WgmmaTf32<kD>;       // pv (64, d) = P (64, kBlockN) · V

  int lane, warp_row0, group_row0;  // this warp's first row, this warpgroup's, in the block
  float o[kORegs];                  // (16 rows of this warp, d) fp32, as [1][kDTiles][4]
  float s[kSRegs], s_corr[kSRegs];  // (16 rows, kBlockN): big·big, corrections; then P
  SoftmaxState<float> state[2];     // rows g and g + 8

  __device__ __forceinline__ Tf32Sm90Consumer() {
    lane = static_cast<int>(threadIdx.x % 32);
    const int warp = static_cast<int>(threadIdx.x / 32);
    group_row0 = (warp / 4) * sm90::kWarpgroupRows;
    warp_row0 = group_row0 + (warp % 4) * 16;
#pragma unroll
    for (int r = 0; r < kORegs; ++r) o[r] = 0.0f;
    state[0] = state[1] = {-std::numeric_limits<float>::infinity(), 0.0f};
  }

  // Issues S's wgmma (big·big into s, the corrections into s_corr) and commits them.
  __device__ __forceinline__ void issue_scores(uint32_t q_big, uint32_t q_small, uint32_t k_big,
                                               uint32_t k_small) {
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Cfg::kQKSteps; ++ks)
      MmaQK::ss(s, sm90::k_major_descriptor<kBlockM>(q_big, group_row0, ks),
                sm90::k_major_descriptor<kBlockN>(k_big, 0, ks), ks > 0);
#pragma unroll
    for (int ks = 0; ks < Cfg::kQKSteps; ++ks) {
      MmaQK::ss(s_corr, sm90::k_major_descriptor<kBlockM>(q_small, group_row0, ks),
                sm90::k_major_descriptor<kBlockN>(k_big, 0, ks), ks > 0);
      MmaQK::ss(s_corr, sm90::k_major_descriptor<kBlockM>(q_big, group_row0, ks),
                sm90::k_major_descriptor<kBlockN>(k_small, 0, ks), true);
    }
    ptx::wgmma_commit();
  }

  // Waits for S, adds the corrections (fp32), applies softcap / ALiBi and the mask, and runs
  // the online softmax (as step 2b): P overwrites s, O is rescaled.
  __device__ __forceinline__ void softmax(const Mask<int>& mask, const KeyBlocks<int>& blocks,
                                          const LogitsTransform<float>& logits, int row_start,
                                          int last_row, int n_block) {
    wait_scores();
    softmax_waited(mask, blocks, logits, row_start, last_row, n_block);
  }
  // S's wgmma done: their reads of Q and K are over once this returns.
  __device__ __forceinline__ void wait_scores() {
    ptx::wgmma_wait<0>();
    fence_accumulator(s);
    fence_accumulator(s_corr);
  }
  // softmax() after wait_scores() (the producer pipeline releases K in between).
  __device__ __forceinline__ void softmax_waited(const Mask<int>& mask,
                                                 const KeyBlocks<int>& blocks,
                                                 const LogitsTransform<float>& logits,
                                                 int row_start, int last_row, int n_block) {
#pragma unroll
    for (int r = 0; r < kSRegs; ++r) s[r] += s_corr[r];
    float(&st)[1][kNTiles][4] = as_mma_tiles<kNTiles>(s);
    const int n0 = n_block * kBlockN;
    transform_scores<Logits>(st, lane, row_start, warp_row0, n0, logits, mask, PreciseTanh{});
    if (blocks.needs_mask(n_block))
      mask_scores(st, lane, row_start, warp_row0, n0, mask, n0 >= mask.first_key(last_row));
    float(&ot)[1][kDTiles][4] = as_mma_tiles<kDTiles>(o);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float row_max = quad_row_max(st[0], half);
      SoftmaxState<float>& sst = state[half];
      // Until a row has seen a key its O holds only zeros (or a NaN from 0 · Inf), which the
      // rescale leaves as they are: no multiply on a CTA's first tile (a one-tile split CTA
      // runs this code once, with a cold instruction cache: 2c.5).
      const bool saw_keys = sst.m != -std::numeric_limits<float>::infinity();
      const float alpha = online_softmax_rescale(sst, row_max);
      if (__any_sync(0xffffffffu, saw_keys && alpha != 1.0f)) {
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          ot[0][dt][2 * half] *= alpha;
          ot[0][dt][2 * half + 1] *= alpha;
        }
      }
      // exp(x - m) as 2^((x - m)·log2e): the difference first (no precision lost to a large m).
      const float shift = safe_shift(sst.m);
      float row_sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = st[0][nt][2 * half + e];
          x = ptx::exp2_approx((x - shift) * kLog2e);
          row_sum += x;
        }
      sst.l += row_sum;
    }
  }

  // O += P·V. k-step kk takes keys 8kk .. 8kk+7, key 2t as k-index t and 2t + 1 as t + 4
  // (Vᵀ's column order): A = (P[g][2t], P[g+8][2t], P[g][2t+1], P[g+8][2t+1]) = S tile kk's
  // registers 0, 2, 1, 3. The tile's three products are summed on the tensor cores in pv
  // (corrections first) and added to O in fp32 round-to-nearest.
  __device__ __forceinline__ void accumulate_pv(uint32_t vt_big, uint32_t vt_small) {
    float(&st)[1][kNTiles][4] = as_mma_tiles<kNTiles>(s);
    float pa[Cfg::kPVSteps][4];  // A's order, split with one test for the whole tile
#pragma unroll
    for (int kk = 0; kk < Cfg::kPVSteps; ++kk) {
      pa[kk][0] = st[0][kk][0], pa[kk][1] = st[0][kk][2];
      pa[kk][2] = st[0][kk][1], pa[kk][3] = st[0][kk][3];
    }
    uint32_t pa_big[Cfg::kPVSteps][4], pa_small[Cfg::kPVSteps][4];
    split_tf32x3<Cfg::kPVSteps * 4>(flat(pa), flat(pa_big), flat(pa_small));
    float pv[kORegs];
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kPVSteps; ++kk) {
      MmaPV::rs(pv, pa_small[kk], sm90::k_major_descriptor<kD>(vt_big, 0, kk), kk > 0);
      MmaPV::rs(pv, pa_big[kk], sm90::k_major_descriptor<kD>(vt_small, 0, kk), true);
    }
#pragma unroll
    for (int kk = 0; kk < Cfg::kPVSteps; ++kk)
      MmaPV::rs(pv, pa_big[kk], sm90::k_major_descriptor<kD>(vt_big, 0, kk), true);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    fence_accumulator(pv);
#pragma unroll
    for (int r = 0; r < kORegs; ++r) o[r] += pv[r];
  }

  // Step 2b's unsplit epilogue: NaN rule, sink, 1/l, the LSE; rows on 16 bytes.
  __device__ __forceinline__ void store(const AttentionParams& p, const SeqlenInfo<int>& seq,
                                        const Mask<int>& mask, int64_t b, int64_t h,
                                        int row_start) {
    const float sink = sink_logit<float>(p, h);
    float* o_tile = static_cast<float*>(p.o) + seq.o_offset(p, b, row_start, h);
    const int g = lane / 4, t = lane % 4;
    float(&ot)[1][kDTiles][4] = as_mma_tiles<kDTiles>(o);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      SoftmaxState<float> sst = state[half];
      sst.l += __shfl_xor_sync(0xffffffffu, sst.l, 1);
      sst.l += __shfl_xor_sync(0xffffffffu, sst.l, 2);
      const int local_row = warp_row0 + g + 8 * half;
      const int row = row_start + local_row;
      if (row >= seq.seqlen_q) continue;
      nan_if_no_finite_score(sst, mask.visible_keys(row) > 0);
      const float sink_factor = p.sinks != nullptr ? add_sink(sst, sink) : 1.0f;
      const float out_scale = sink_factor * output_scale(sst);  // 0 for a fully masked row
      float* to = o_tile + local_row * p.o_row_stride;
      if (p.lse != nullptr && t == 0) p.lse[seq.lse_index(p, b, h, row)] = log_sum_exp(sst);
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const int col = dt * 8 + 2 * t;  // this lane's column pair
        *reinterpret_cast<float2*>(to + col) =
            make_float2(ot[0][dt][2 * half] * out_scale, ot[0][dt][2 * half + 1] * out_scale);
      }
    }
  }

  // A split's partial (split-KV): O normalised by the split's own l, and its LSE, into the
  // workspace (pitch kD); the NaN rule and the sink are the combine's, over the whole row.
  __device__ __forceinline__ void store_partial(const SplitPartials& parts, int64_t tile_index,
                                                int split, int row_start, int seqlen_q) {
    const int g = lane / 4, t = lane % 4;
    float(&ot)[1][kDTiles][4] = as_mma_tiles<kDTiles>(o);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      SoftmaxState<float> sst = state[half];
      sst.l += __shfl_xor_sync(0xffffffffu, sst.l, 1);
      sst.l += __shfl_xor_sync(0xffffffffu, sst.l, 2);
      const int local_row = warp_row0 + g + 8 * half;
      if (row_start + local_row >= seqlen_q) continue;
      const float out_scale = output_scale(sst);  // 0 for a split that saw no key of the row
      float* to = parts.out_row(tile_index, split, local_row);
      if (t == 0) parts.lse[parts.row_index(tile_index, split, local_row)] = log_sum_exp(sst);
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const int col = dt * 8 + 2 * t;  // this lane's column pair
        *reinterpret_cast<float2*>(to + col) =
            make_float2(ot[0][dt][2 * half] * out_scale, ot[0][dt][2 * half + 1] * out_scale);
      }
    }
  }
};

// What a CTA computes: its query block of one (batch, head), heaviest blocks first in x, and
// the key tiles that block visits (its split's share of them), last-first (tile i is key
// block blocks.end - 1 - i).
struct Tf32Sm90Work {
  int64_t b, h, hk;
  SeqlenInfo<int> seq;
  Mask<int> mask;
  int split, query_block, row_start, last_row;
  KeyBlocks<int> blocks;
  // Everything but the key tiles (find_key_blocks), so that Q's load can be issued first.
  __device__ __forceinline__ Tf32Sm90Work(const AttentionParams& p, int splits, int block_m)
      : b(blockIdx.z), h(blockIdx.y), hk(int64_t(blockIdx.y) / p.heads_per_kv()), seq(p, b),
        mask(seq.mask(p)), split(static_cast<int>(blockIdx.x) % splits),
        query_block(heaviest_first_block(p.window_left, p.window_right,
                                         static_cast<int>(blockIdx.x) / splits,
                                         static_cast<int>(gridDim.x) / splits)),
        row_start(query_block * block_m) {
    last_row = min(row_start + block_m, seq.seqlen_q) - 1;
  }
  __device__ __forceinline__ Tf32Sm90Work(const AttentionParams& p, int splits, int block_m,
                                          int block_n)
      : Tf32Sm90Work(p, splits, block_m) {
    find_key_blocks(splits, block_n);
  }
  __device__ __forceinline__ void find_key_blocks(int splits, int block_n) {
    if (row_start < seq.seqlen_q)
      blocks = split_key_blocks(key_blocks(mask, row_start, last_row + 1, block_n), split, splits);
  }
  __device__ __forceinline__ bool idle() const { return row_start >= seq.seqlen_q; }
  __device__ __forceinline__ int key_block(int tile) const { return blocks.end - 1 - tile; }
  // Key 0 of this CTA's KV head in K and in V.
  __device__ __forceinline__ const float* k_head(const AttentionParams& p) const {
    return static_cast<const float*>(p.k) + seq.k_offset(p, b, 0, hk);
  }
  __device__ __forceinline__ const float* v_head(const AttentionParams& p) const {
    return static_cast<const float*>(p.v) + seq.v_offset(p, b, 0, hk);
  }
  // The epilogue: the finished rows, or with splits > 1 this split's partial (an empty
  // split's too: the combine reads every split).
  template <class Consumer>
  __device__ __forceinline__ void store(const AttentionParams& p, const SplitArgs& split_args,
                                        Consumer& consumer) const {
    if (split_args.splits > 1) {
      const SplitPartials& parts = split_args.partials;
      consumer.store_partial(parts, parts.tile(b, h, p.heads_q, query_block), split, row_start,
                             seq.seqlen_q);
    } else {
      consumer.store(p, seq, mask, b, h, row_start);
    }
  }
  // The in-kernel merge (split_args.merge_in_grid): once every CTA of the grid has written
  // its partial, the splits of this query block share its rows, split s taking rows
  // s·(block_m / splits) onwards, one warp a row, as the combine kernel would (combine_row).
  // Every CTA meets the grid barrier, an idle one too (with no rows: merge_rows = false).
  template <int kHeadDim>
  __device__ __forceinline__ void merge_in_grid(const AttentionParams& p,
                                                const SplitArgs& split_args,
                                                bool merge_rows) const {
    cooperative_groups::this_grid().sync();
    if (!merge_rows) return;
    // 16 splits (the write-up's case and every one-tile split plan of 128-row blocks) get a
    // copy with the count folded in; the other counts that divide 128 share one.
    if (split_args.partials.splits == kMaxSplits)
      merge_rows_of_split<kHeadDim, kMaxSplits>(p, split_args.partials);
    else
      merge_rows_of_split<kHeadDim, 0>(p, split_args.partials);
  }
  template <int kHeadDim, int kSplits>  // kSplits 0: parts.splits, at run time
  __device__ __forceinline__ void merge_rows_of_split(const AttentionParams& p,
                                                      const SplitPartials& parts) const {
    const int rows = parts.block_m / (kSplits > 0 ? kSplits : parts.splits);
    const int warp = static_cast<int>(threadIdx.x / 32), warps = static_cast<int>(blockDim.x / 32);
    for (int r = warp; r < rows; r += warps) {
      const int local_row = split * rows + r;
      if (row_start + local_row >= seq.seqlen_q) break;
      combine_row<float, (kHeadDim + 63) / 64, kSplits>(p, parts, seq, mask, b, h, query_block,
                                                        local_row, static_cast<int>(threadIdx.x % 32));
    }
  }
  // This block's Q rows into the big Q plane, swizzled (cp.async; the caller commits).
  template <class Cfg>
  __device__ __forceinline__ void load_q(const AttentionParams& p, uint32_t q_big) const {
    load_q_swizzled<Cfg>(q_big, static_cast<const float*>(p.q) + seq.q_offset(p, b, row_start, h),
                         p.q_row_stride, seq.seqlen_q - row_start);
  }
};

// Named barrier of the ping-pong schedule: warpgroup 0 meets it once its S wgmma are issued,
// warpgroup 1 before issuing its own (0 is __syncthreads). Both sides bar.sync: warpgroup 1
// reaches it straight from the tile's __syncthreads, so warpgroup 0 barely waits, and an
// arrive-only hand-over drew racecheck hazards (2c.4) that this form is to settle.
inline constexpr int kFirstScoresIssuedBarrier = 1;

// The first pipeline (d=128): one set of planes; per tile every thread splits K and
// (transposing) V between two __syncthreads, with the tensor cores idle, and the next
// tile's raw rows load while this one computes. kPingPong orders the two warpgroups'
// S wgmma (warpgroup 0's first, step 2c.4): warpgroup 0's S completes in half the time of
// both at once, so its softmax runs under warpgroup 1's S and warpgroup 1's under
// warpgroup 0's P·V, instead of both softmaxes with the tensor cores idle. Same products
// in the same order, so both schedules write the same bits.
template <class Cfg, class Logits, bool kPingPong>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    tf32x3_sm90_forward_kernel(const AttentionParams p, const SplitArgs split_args) {
  static_assert(!Cfg::kOverlapSplit, "the overlapped pipeline is tf32x3_sm90_overlap_kernel");
  static_assert(!kPingPong || Cfg::kWarpgroups == 2, "ping-pong orders two consumer warpgroups");
  constexpr int kBlockN = Cfg::kBlockN, kD = Cfg::kHeadDim;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const Tf32Sm90Smem<Cfg> sm(smem_raw);
  // The split-KV combine (a programmatic dependent launch on sm_90) may be scheduled once
  // every CTA of this grid has started; it still waits for the whole grid to finish.
  allow_dependent_launch();
  const Tf32Sm90Work work(p, split_args.splits, Cfg::kBlockM, kBlockN);
  if (work.idle()) return;
  const int n_tiles = work.blocks.count();
  const SeqlenInfo<int>& seq = work.seq;
  const float* k_head = work.k_head(p);
  const float* v_head = work.v_head(p);
  const int head_dim = static_cast<int>(p.head_dim);

  work.load_q<Cfg>(p, sm.q_big);
  ptx::cp_async_commit();
  // Raw rows of tile `tile` into the staging area (step 2b's load_tile, zero past the end).
  auto issue_tile = [&](int tile) {
    if (tile < n_tiles) {
      const int n0 = work.key_block(tile) * kBlockN;
      load_tile<Cfg, kBlockN, kD, true>(sm.k_raw_ptr, k_head + n0 * p.k_row_stride,
                                        p.k_row_stride, seq.seqlen_k - n0, head_dim);
      load_tile<Cfg, kBlockN, kD, true>(sm.v_raw_ptr, v_head + n0 * p.v_row_stride,
                                        p.v_row_stride, seq.seqlen_k - n0, head_dim);
    }
    ptx::cp_async_commit();
  };
  issue_tile(0);
  ptx::cp_async_wait<1>();  // Q (the older group) has landed for this thread
  split_q<Cfg>(sm);         // this thread's own chunks; the loop's barriers publish them

  const LogitsTransform<float> logits = logits_transform<float>(p, work.b, work.h);
  Tf32Sm90Consumer<Cfg, Logits> consumer;
  for (int tile = 0; tile < n_tiles; ++tile) {
    ptx::cp_async_wait<0>();  // this tile's raw rows have landed (for this thread)
    __syncthreads();          // ... for every thread; every wgmma of the last tile is done
    split_kv<Cfg>(sm);
    ptx::fence_proxy_async_shared();  // the planes (and Q's, once) are read by wgmma next
    __syncthreads();                  // planes written; the staging area is free
    issue_tile(tile + 1);
    if constexpr (kPingPong) {  // (the __syncthreads above keep one hand-over per tile)
      const bool first = threadIdx.x < sm90::kWarpgroupThreads;
      if (!first) ptx::named_barrier_sync(kFirstScoresIssuedBarrier, Cfg::kThreads);
      consumer.issue_scores(sm.q_big, sm.q_small, sm.k_big(0), sm.k_small(0));
      if (first) ptx::named_barrier_sync(kFirstScoresIssuedBarrier, Cfg::kThreads);
    } else {
      consumer.issue_scores(sm.q_big, sm.q_small, sm.k_big(0), sm.k_small(0));
    }
    consumer.softmax(work.mask, work.blocks, logits, work.row_start, work.last_row,
                     work.key_block(tile));
    consumer.accumulate_pv(sm.vt_big(0), sm.vt_small(0));
  }
  ptx::cp_async_wait<0>();  // only empty groups remain (or Q's, when no tile ran)
  work.store(p, split_args, consumer);
}

// V rows of a tile into the staging area as 4x4 blocks (the overlapped pipeline): thread i
// takes Vᵀ chunk cc = i % (kBlockN / 4) (keys 8·(cc / 2) + cc % 2 + {0, 2, 4, 6}, the
// column order of Vᵀ) of dims 4c .. 4c + 3, c = i / (kBlockN / 4); key j of its block is
// float4 j·kThreads + i of the staging area, so that a warp's loads and stores of it are
// conflict-free and the thread transposes its own block (no barrier before the split).
// With fewer threads than blocks (load_v_blocks_by), thread tid takes blocks tid + r·kThreads.
template <class Cfg>
inline constexpr int kVBlocks = Cfg::kBlockN * Cfg::kHeadDim / 16;  // 4x4 blocks of a V tile
template <class Cfg, int kThreads>
__device__ __forceinline__ void load_v_blocks_by(float* v_raw, const float* src,
                                                 int64_t row_stride, int valid_rows, int tid) {
  static_assert(kVBlocks<Cfg> % kThreads == 0, "whole 4x4 blocks of V per thread");
  constexpr int kVtChunks = Cfg::kBlockN / 4;
#pragma unroll
  for (int r = 0; r < kVBlocks<Cfg> / kThreads; ++r) {
    const int block = tid + r * kThreads;
    const int cc = block % kVtChunks, c = block / kVtChunks;
    const int key0 = 8 * (cc / 2) + cc % 2;
    const uint32_t to = ptx::smem_addr(v_raw) + block * 16;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int key = key0 + 2 * j;
      const bool ok = key < valid_rows;
      ptx::cp_async_16(to + j * kVBlocks<Cfg> * 16, ok ? src + key * row_stride + 4 * c : src, ok);
    }
  }
}
template <class Cfg>
__device__ __forceinline__ void load_v_blocks(float* v_raw, const float* src, int64_t row_stride,
                                              int valid_rows) {
  static_assert(kVBlocks<Cfg> == Cfg::kThreads, "one 4x4 block of V per thread");
  load_v_blocks_by<Cfg, Cfg::kThreads>(v_raw, src, row_stride, valid_rows,
                                       static_cast<int>(threadIdx.x));
}

// The split of a tile's V, each thread its own staged chunks (the overlapped pipeline): its
// 4x4 block (load_v_blocks) transposed into four Vᵀ chunks (rows 4c .. 4c + 3, chunk cc; a
// quarter-warp's stores fill one 128-byte row) of set `set`'s Vᵀ planes. VBlocksOf: the
// same for the blocks that load_v_blocks_by gave thread tid of kThreads.
template <class Cfg, int kThreads>
struct VBlocksOf {
  static constexpr int kVtChunks = Cfg::kBlockN / 4;
  static constexpr int kBlocks = kVBlocks<Cfg> / kThreads;  // 4x4 blocks of this thread
  // Block tid + r·kThreads has the same chunk cc and lies 4·kThreads / kVtChunks Vᵀ rows
  // further, whole swizzle periods (asserted): its offsets are block tid's plus r·kStep.
  static_assert(kThreads % kVtChunks == 0 && (4 * (kThreads / kVtChunks)) % 8 == 0,
                "the blocks of one thread share their swizzle phase");
  static constexpr uint32_t kStep = 4 * (kThreads / kVtChunks) * sm90::kSwizzleBytes;
  int tid, cc, c;
  __device__ __forceinline__ explicit VBlocksOf(int tid_)
      : tid(tid_), cc(static_cast<int>(static_cast<unsigned>(tid_) % kVtChunks)),
        c(static_cast<int>(static_cast<unsigned>(tid_) / kVtChunks)) {}
  // Block r, read once and transposed: dims[e] is Vᵀ chunk e (of four) of the block.
  __device__ __forceinline__ void load(const Tf32Sm90Smem<Cfg>& sm, int r,
                                       float (&dims)[4][4]) const {
    constexpr int kAll = kVBlocks<Cfg>;
    const float4* block = reinterpret_cast<const float4*>(sm.v_raw_ptr) + tid + r * kThreads;
    const float4 k0 = block[0], k1 = block[kAll], k2 = block[2 * kAll],
                 k3 = block[3 * kAll];  // keys key0 + 0, 2, 4, 6; dims 4c .. 4c + 3
    const float4 k[4] = {k0, k1, k2, k3};
#pragma unroll
    for (int j = 0; j < 4; ++j)
      dims[0][j] = k[j].x, dims[1][j] = k[j].y, dims[2][j] = k[j].z, dims[3][j] = k[j].w;
  }
  // Chunks e0 .. e0 + kCount - 1 of block r (loaded as dims) into slots kSlot on.
  template <int kCount, int kSlot, int kSlots>
  __device__ __forceinline__ void gather(const Tf32Sm90Smem<Cfg>& sm, int set, int r, int e0,
                                         const float (&dims)[4][4], float (&x)[kSlots][4],
                                         uint32_t (&big_at)[kSlots],
                                         uint32_t (&small_at)[kSlots]) const {
    constexpr int kD = Cfg::kHeadDim;
    static_assert(kSlot + kCount <= kSlots && kCount <= 4, "room for the Vᵀ chunks");
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      const int e = e0 + i;
      const uint32_t offset = sm90::swizzled_offset<kD>(4 * c + e, cc) + r * kStep;
#pragma unroll
      for (int k = 0; k < 4; ++k) x[kSlot + i][k] = dims[e][k];
      big_at[kSlot + i] = sm.vt_big(set) + offset;
      small_at[kSlot + i] = sm.vt_small(set) + offset;
    }
  }
};
// Thread tid's V blocks split, kBatch of a block's four chunks behind one test (all four by
// default; the producer warpgroup, short of registers, takes one at a time).
template <class Cfg, int kThreads, int kBatch = 4>
__device__ __forceinline__ void split_v_blocks_by(const Tf32Sm90Smem<Cfg>& sm, int set, int tid) {
  static_assert(4 % kBatch == 0, "whole batches of a block's chunks");
  const VBlocksOf<Cfg, kThreads> own(tid);
#pragma unroll
  for (int r = 0; r < VBlocksOf<Cfg, kThreads>::kBlocks; ++r) {
    float dims[4][4];
    own.load(sm, r, dims);
#pragma unroll
    for (int e0 = 0; e0 < 4; e0 += kBatch) {
      float x[kBatch][4];
      uint32_t big_at[kBatch], small_at[kBatch];
      own.template gather<kBatch, 0>(sm, set, r, e0, dims, x, big_at, small_at);
      split_chunks_to<kBatch>(sm, x, big_at, small_at);
    }
  }
}
template <class Cfg>
__device__ __forceinline__ void split_own_v(const Tf32Sm90Smem<Cfg>& sm, int set) {
  split_v_blocks_by<Cfg, Cfg::kThreads>(sm, set, static_cast<int>(threadIdx.x));
}

// The overlapped pipeline's split of the next tile: its K and V chunks behind one test.
template <class Cfg>
__device__ __forceinline__ void split_own_kv(const Tf32Sm90Smem<Cfg>& sm, int set) {
  using K = KChunksOf<Cfg, Cfg::kThreads>;
  using V = VBlocksOf<Cfg, Cfg::kThreads>;
  static_assert(V::kBlocks == 1, "one 4x4 block of V per thread");
  constexpr int kCount = K::kPasses + 4;
  float x[kCount][4];
  uint32_t big_at[kCount], small_at[kCount];
  const int tid = static_cast<int>(threadIdx.x);
  K(tid).template gather<K::kPasses, 0>(sm, set, 0, x, big_at, small_at);
  const V v(tid);
  float dims[4][4];
  v.load(sm, 0, dims);
  v.template gather<4, K::kPasses>(sm, set, 0, 0, dims, x, big_at, small_at);
  split_chunks_to<kCount>(sm, x, big_at, small_at);
}

// The overlapped pipeline (d=64): two sets of planes. While S(j) runs on the tensor cores,
// each thread splits its own staged chunks of tile j + 1 into the other set and reloads its
// staging chunks with tile j + 2; one __syncthreads per tile then publishes the new set and
// frees the old one (every S(j) and P·V(j) has been waited for).
template <class Cfg, class Logits>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    tf32x3_sm90_overlap_kernel(const AttentionParams p, const SplitArgs split_args) {
  static_assert(Cfg::kOverlapSplit, "the overlapped pipeline needs two sets of planes");
  constexpr int kBlockN = Cfg::kBlockN, kD = Cfg::kHeadDim;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const Tf32Sm90Smem<Cfg> sm(smem_raw);
  // The split-KV combine (a programmatic dependent launch on sm_90) may be scheduled once
  // every CTA of this grid has started; it still waits for the whole grid to finish.
  allow_dependent_launch();
  Tf32Sm90Work work(p, split_args.splits, Cfg::kBlockM);
  if (work.idle()) {
    if (split_args.merge_in_grid) work.merge_in_grid<kD>(p, split_args, false);
    return;
  }
  work.load_q<Cfg>(p, sm.q_big);  // first: its latency hides the key range's arithmetic
  ptx::cp_async_commit();
  work.find_key_blocks(split_args.splits, kBlockN);
  const int n_tiles = work.blocks.count();
  const SeqlenInfo<int>& seq = work.seq;
  const float* k_head = work.k_head(p);
  const float* v_head = work.v_head(p);
  const int head_dim = static_cast<int>(p.head_dim);

  // Raw rows of tile `tile` into this thread's staging chunks (zero past the end).
  auto issue_tile = [&](int tile) {
    if (tile < n_tiles) {
      const int n0 = work.key_block(tile) * kBlockN;
      load_tile<Cfg, kBlockN, kD, true>(sm.k_raw_ptr, k_head + n0 * p.k_row_stride,
                                        p.k_row_stride, seq.seqlen_k - n0, head_dim);
      load_v_blocks<Cfg>(sm.v_raw_ptr, v_head + n0 * p.v_row_stride, p.v_row_stride,
                         seq.seqlen_k - n0);
    }
    ptx::cp_async_commit();
  };
  issue_tile(0);
  ptx::cp_async_wait<1>();  // Q, this thread's chunks (split while tile 0 lands)
  split_q<Cfg>(sm);
  ptx::cp_async_wait<0>();  // tile 0
  if (n_tiles > 0) split_own_kv<Cfg>(sm, 0);
  issue_tile(1);  // into the chunks this thread has just split
  ptx::fence_proxy_async_shared();
  __syncthreads();

  const LogitsTransform<float> logits = logits_transform<float>(p, work.b, work.h);
  Tf32Sm90Consumer<Cfg, Logits> consumer;
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int set = tile % 2;
    consumer.issue_scores(sm.q_big, sm.q_small, sm.k_big(set), sm.k_small(set));
    if (tile + 1 < n_tiles) {  // under S(tile): tile + 1 into the other set
      ptx::cp_async_wait<0>();
      split_own_kv<Cfg>(sm, set ^ 1);
      issue_tile(tile + 2);
      ptx::fence_proxy_async_shared();
    }
    consumer.softmax(work.mask, work.blocks, logits, work.row_start, work.last_row,
                     work.key_block(tile));
    consumer.accumulate_pv(sm.vt_big(set), sm.vt_small(set));
    __syncthreads();  // set ^ 1 complete for S(tile + 1); every read of `set` is done
  }
  ptx::cp_async_wait<0>();  // only empty groups remain
  work.store(p, split_args, consumer);
  if (split_args.merge_in_grid) work.merge_in_grid<kD>(p, split_args, true);
}

// The producer pipeline (d=128, step 2c.6): one set of planes as tf32x3_sm90_forward_kernel,
// and a third warpgroup that loads and splits K and V while the two consumer warpgroups run
// S, the softmax and P·V (in ping-pong order), so the split leaves the tensor cores' path.
// The planes' two halves free up at different times: K once both consumer warpgroups have
// waited for S(j), Vᵀ once both have waited for P·V(j). So the producer splits K(j + 1)
// under P·V(j) and V(j + 1) under S(j + 1), and the four mbarriers below are the only
// hand-overs (no __syncthreads in the loop). Each producer thread loads and splits its own
// staging chunks (V as 4x4 blocks it transposes itself, two a thread), so a staging half is
// reloaded right after its split. Same products in the same order on the same plane values
// as the other d=128 schedules: the same bits.
inline constexpr int kSplitProducerThreads = sm90::kWarpgroupThreads;
// 128·56 + 256·224 = 64512 of the SM's 65536 registers (the consumers' code needs 218-226).
inline constexpr int kSplitProducerRegisters = 56;
inline constexpr int kSplitConsumerRegisters = 224;
// Named barrier over the consumer warpgroups: Q's planes split (the producer never reads Q).
inline constexpr int kQSplitBarrier = 2;

// The producer pipeline's mbarriers (8 bytes each, after the staging area):
//   k_ready / v_ready: every producer thread arrives once its K (Vᵀ) chunks of the tile are
//                      written and fenced for the async proxy; the consumers wait before S
//                      (before P·V);
//   k_free / v_free:   every consumer thread arrives once its warpgroup's S (P·V) wgmma are
//                      waited for; the producer waits before splitting the next tile's K (V).
// One phase per tile on each, so tile j waits on parity j & 1.
inline constexpr int kSplitBarrierBytes = 4 * 8;
struct Tf32Sm90SplitBarriers {
  uint32_t k_ready, k_free, v_ready, v_free;
  __device__ __forceinline__ explicit Tf32Sm90SplitBarriers(uint32_t at)
      : k_ready(at), k_free(at + 8), v_ready(at + 16), v_free(at + 24) {}
};
template <class Cfg>
constexpr int producer_pipeline_smem_bytes() {
  return Cfg::kSmemBytes + kSplitBarrierBytes;
}

// Raw K rows of a tile into the staging area (row-major, pitch d; rows >= valid_rows zero)
// by kThreads threads, chunk id tid + pass·kThreads as split_k_chunks reads it.
template <class Cfg, int kThreads>
__device__ __forceinline__ void load_k_rows_by(float* k_raw, const float* src,
                                               int64_t row_stride, int valid_rows, int tid) {
  constexpr int kD = Cfg::kHeadDim, kChunks = Cfg::kChunks;
  static_assert(kThreads % kChunks == 0, "a pass covers whole rows");
  constexpr int kPassRows = kThreads / kChunks;
  const int row0 = tid / kChunks, col = (tid % kChunks) * 4;
  const uint32_t to = ptx::smem_addr(k_raw + row0 * kD + col);
  const float* from = src + row0 * row_stride + col;
#pragma unroll
  for (int pass = 0; pass < Cfg::kBlockN / kPassRows; ++pass) {
    const bool ok = row0 + pass * kPassRows < valid_rows;
    ptx::cp_async_16(to + pass * kPassRows * kD * 4, ok ? from : src, ok);
    from += kPassRows * row_stride;
  }
}

// The producer warpgroup's loop (thread tid of kSplitProducerThreads). cp.async groups go K(0),
// V(0), K(1), V(1), ...: "all but the newest" is always the half about to be split.
template <class Cfg>
__device__ __forceinline__ void run_split_producer(const AttentionParams& p,
                                                   const Tf32Sm90Work& work,
                                                   const Tf32Sm90Smem<Cfg>& sm,
                                                   const Tf32Sm90SplitBarriers& bars, int tid) {
  constexpr int kBlockN = Cfg::kBlockN, kThreads = kSplitProducerThreads;
  const int n_tiles = work.blocks.count();
  const float* k_head = work.k_head(p);
  const float* v_head = work.v_head(p);
  auto issue_k = [&](int tile) {
    if (tile < n_tiles) {
      const int n0 = work.key_block(tile) * kBlockN;
      load_k_rows_by<Cfg, kThreads>(sm.k_raw_ptr, k_head + n0 * p.k_row_stride, p.k_row_stride,
                                    work.seq.seqlen_k - n0, tid);
    }
    ptx::cp_async_commit();
  };
  auto issue_v = [&](int tile) {
    if (tile < n_tiles) {
      const int n0 = work.key_block(tile) * kBlockN;
      load_v_blocks_by<Cfg, kThreads>(sm.v_raw_ptr, v_head + n0 * p.v_row_stride,
                                      p.v_row_stride, work.seq.seqlen_k - n0, tid);
    }
    ptx::cp_async_commit();
  };
  issue_k(0);
  issue_v(0);
  for (int tile = 0; tile < n_tiles; ++tile) {
    const uint32_t last_parity = (tile + 1) & 1;  // tile - 1's phase
    ptx::cp_async_wait<1>();                      // K(tile), this thread's chunks
    if (tile > 0) ptx::mbarrier_wait(bars.k_free, last_parity);
    split_k_chunks<Cfg, kThreads, 1>(sm, 0, tid);
    ptx::fence_proxy_async_shared();
    ptx::mbarrier_arrive(bars.k_ready);
    issue_k(tile + 1);
    ptx::cp_async_wait<1>();  // V(tile)
    if (tile > 0) ptx::mbarrier_wait(bars.v_free, last_parity);
    split_v_blocks_by<Cfg, kThreads, 1>(sm, 0, tid);
    ptx::fence_proxy_async_shared();
    ptx::mbarrier_arrive(bars.v_ready);
    issue_v(tile + 1);
  }
  ptx::cp_async_wait<0>();  // only empty groups remain
}

template <class Cfg, class Logits>
__global__ void __launch_bounds__(Cfg::kThreads + kSplitProducerThreads, 1)
    tf32x3_sm90_producer_kernel(const AttentionParams p, const SplitArgs split_args) {
  static_assert(!Cfg::kOverlapSplit && Cfg::kWarpgroups == 2,
                "one plane set, two consumer warpgroups in ping-pong");
  static_assert(producer_pipeline_smem_bytes<Cfg>() <= sm90::kSmemLimit, "the barriers fit");
  static_assert(kSplitProducerThreads * kSplitProducerRegisters +
                        Cfg::kThreads * kSplitConsumerRegisters <= 65536,
                "the register split fits the SM");
  constexpr int kBlockN = Cfg::kBlockN;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const Tf32Sm90Smem<Cfg> sm(smem_raw);
  // The split-KV combine (a programmatic dependent launch on sm_90) may be scheduled once
  // every CTA of this grid has started; it still waits for the whole grid to finish.
  allow_dependent_launch();
  const Tf32Sm90Work work(p, split_args.splits, Cfg::kBlockM, kBlockN);
  if (work.idle()) return;
  const Tf32Sm90SplitBarriers bars(sm.v_raw + Cfg::kStagingBytes);
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(bars.k_ready, kSplitProducerThreads);
    ptx::mbarrier_init(bars.v_ready, kSplitProducerThreads);
    ptx::mbarrier_init(bars.k_free, Cfg::kThreads);
    ptx::mbarrier_init(bars.v_free, Cfg::kThreads);
    ptx::mbarrier_init_fence();
  }
  __syncthreads();  // the last CTA-wide barrier: the producer leaves the loop on its own
  if (threadIdx.x >= Cfg::kThreads) {
    ptx::setmaxnreg_dec<kSplitProducerRegisters>();
    run_split_producer<Cfg>(p, work, sm, bars, static_cast<int>(threadIdx.x) - Cfg::kThreads);
    return;
  }
  ptx::setmaxnreg_inc<kSplitConsumerRegisters>();
  // Q: the consumers' own load and split, while the producer stages and splits tile 0.
  work.load_q<Cfg>(p, sm.q_big);
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  split_q<Cfg>(sm);
  ptx::fence_proxy_async_shared();
  ptx::named_barrier_sync(kQSplitBarrier, Cfg::kThreads);

  const LogitsTransform<float> logits = logits_transform<float>(p, work.b, work.h);
  Tf32Sm90Consumer<Cfg, Logits> consumer;
  const bool first = threadIdx.x < sm90::kWarpgroupThreads;
  const int n_tiles = work.blocks.count();
  for (int tile = 0; tile < n_tiles; ++tile) {
    const uint32_t parity = tile & 1;
    ptx::mbarrier_wait(bars.k_ready, parity);
    // Ping-pong as tf32x3_sm90_forward_kernel<.., true>: warpgroup 0's S first.
    if (!first) ptx::named_barrier_sync(kFirstScoresIssuedBarrier, Cfg::kThreads);
    consumer.issue_scores(sm.q_big, sm.q_small, sm.k_big(0), sm.k_small(0));
    if (first) ptx::named_barrier_sync(kFirstScoresIssuedBarrier, Cfg::kThreads);
    consumer.wait_scores();
    ptx::mbarrier_arrive(bars.k_free);
    consumer.softmax_waited(work.mask, work.blocks, logits, work.row_start, work.last_row,
                            work.key_block(tile));
    ptx::mbarrier_wait(bars.v_ready, parity);
    consumer.accumulate_pv(sm.vt_big(0), sm.vt_small(0));
    ptx::mbarrier_arrive(bars.v_free);
  }
  work.store(p, split_args, consumer);
}

// One kernel's launch: its shared memory raised once per device, one CTA of kThreads per
// (split, query block) of each (head, batch).
template <class Cfg, auto kKernel, int kThreads = Cfg::kThreads, int kSmemBytes = Cfg::kSmemBytes>
void launch_tf32x3_sm90(const AttentionParams& p, const SplitArgs& split_args,
                        cudaStream_t stream, const char* name) {
  static std::atomic<uint64_t> smem_raised{0};  // one per kernel
  raise_smem_limit_once(kKernel, kSmemBytes, p.device_index, smem_raised);
  const int query_blocks = static_cast<int>((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM);
  const dim3 grid(static_cast<unsigned>(query_blocks * split_args.splits),
                  static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
  if (split_args.merge_in_grid) {  // every CTA resident at once, for the grid barrier
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kSmemBytes;
    config.stream = stream;
    cudaLaunchAttribute cooperative = {};
    cooperative.id = cudaLaunchAttributeCooperative;
    cooperative.val.cooperative = 1;
    config.attrs = &cooperative;
    config.numAttrs = 1;
    check_cuda(cudaLaunchKernelEx(&config, kKernel, p, split_args), name);
  } else {
    kKernel<<<grid, kThreads, kSmemBytes, stream>>>(p, split_args);
  }
  check_launch(name);
}

// One head dim's kernels (instantiated in sm90_hdim<D>.cu): one per LogitsFlags and, with
// one set of planes (d=128), per schedule (FLASHTILE_TF32X3_SM90_SCHEDULE, sm90.hpp).
template <int kHeadDim>
void run_tf32x3_sm90_forward(const AttentionParams& p, const SplitArgs& split_args,
                             Tf32Sm90Schedule schedule, cudaStream_t stream) {
  using Cfg = Tf32Sm90Traits<kHeadDim>;
  with_logits_flags(p, [&](auto flags) {
    using Logits = decltype(flags);
    if constexpr (Cfg::kOverlapSplit) {
      (void)schedule;  // two plane sets: the overlapped pipeline, whatever the setting
      launch_tf32x3_sm90<Cfg, &tf32x3_sm90_overlap_kernel<Cfg, Logits>>(
          p, split_args, stream, "tf32x3_sm90_overlap_kernel");
    } else if (schedule == Tf32Sm90Schedule::producer) {
      launch_tf32x3_sm90<Cfg, &tf32x3_sm90_producer_kernel<Cfg, Logits>,
                         Cfg::kThreads + kSplitProducerThreads, producer_pipeline_smem_bytes<Cfg>()>(
          p, split_args, stream, "tf32x3_sm90_producer_kernel");
    } else if (schedule == Tf32Sm90Schedule::pingpong) {
      launch_tf32x3_sm90<Cfg, &tf32x3_sm90_forward_kernel<Cfg, Logits, true>>(
          p, split_args, stream, "tf32x3_sm90_forward_kernel<pingpong>");
    } else {
      launch_tf32x3_sm90<Cfg, &tf32x3_sm90_forward_kernel<Cfg, Logits, false>>(
          p, split_args, stream, "tf32x3_sm90_forward_kernel");
    }
  });
}

template <int kHeadDim>
Tf32Sm90Tile tf32x3_sm90_tile() {
  using Cfg = Tf32Sm90Traits<kHeadDim>;
  static_assert(Cfg::kBlockM % 4 == 0, "the split-KV combine takes rows four at a time");
  return {Cfg::kBlockM, Cfg::kBlockN, Cfg::kSmemBytes};
}

}  // namespace flashtile::detail::tf32x3
