// Journey step 4 — cuda_sm90: Hopper warpgroup MMA (wgmma), fp16/bf16, sm_90a only.
//
// Step 4.1: wgmma with synchronous loads.
//  - Each consumer warpgroup (4 warps, 128 threads) owns 64 query rows; a CTA holds
//    kWarpgroups of them, which share every K/V tile.
//  - S = Q·Kᵀ is wgmma m64n{kBlockN}k16 with Q and K both read from shared memory through
//    descriptors (K-major, 128-byte swizzle); O += P·V is m64n{kHeadDim}k16 with P from
//    registers (the S accumulator, packed in place to 16-bit pairs) and V read MN-major
//    through its descriptor (the transpose costs nothing).
//  - K/V tiles come in through a kStages-deep cp.async ring (the next tile is in flight
//    while this one is computed), Q once; every wgmma waits for its own result
//    (wgmma.wait_group 0), so the softmax does not yet overlap the tensor cores.
// Step 4.2 (Pipeline::tma): Q once and every K/V tile by TMA (cp.async.bulk.tensor, maps
//    from tensor_map.cuh) into the same kStages ring, each stage completing on its mbarrier;
//    one thread of the CTA issues the copies, every thread waits on the stage's phase, and a
//    __syncthreads per tile frees the oldest stage.
// Step 4.3 (sm90_ws_forward_kernel): warp specialisation. A producer warpgroup (setmaxnreg
//    down to 24 registers; one thread issues every TMA copy) and the consumer warpgroups
//    (setmaxnreg up to 240) meet only on mbarriers: "full" per stage (TMA bytes landed) and
//    "empty" per stage (every consumer warp has finished its wgmma on it), K and V each
//    on their own pair, so no __syncthreads remains in the loop, the producer runs up to
//    kStages tiles ahead and refills a stage's K while its V still feeds a P·V.
// Varlen batches keep the cp.async path (tensor_map.cuh says why).
//  - Feature core: key tiles from key_blocks(), the mask from Mask (only needs_mask()
//    tiles evaluate it), offsets from SeqlenInfo (dense and varlen), the online softmax
//    through softmax_state.hpp, sinks through add_sink, the LSE index from
//    SeqlenInfo::lse_index.
//
// Step 4.4 (kOverlap) and 4.5 (kPingPong) are below. Each head dim's dense calls take the
// pipeline measured fastest for their length and mask (Sm90Traits::dense_pipeline), windows
// Sm90Traits::kWindowPipeline.
// Softcap and ALiBi run in a transformed kernel per pipeline (LogitsTransform::apply).
// Step 4.6 (sm90_persistent_forward_kernel, Pipeline::tma_persistent: d=256 full calls from
// 4k, d=128 full calls at 1k-2k, windows at d=64 and 256): persistent CTAs over a
// heaviest-first schedule (tile_schedule.hpp), the producer running ahead into the next work
// item. Next (issue 9): a TMA-store epilogue.
// Step 4.7 (Pipeline::tma_*_m192, d=64): three consumer warpgroups, 192 query rows a CTA
// (160 registers each), on 4.3's, 4.4's or 4.5's consumers; ping-pong turns go round the
// three. d=64's dense full calls from 4k and bf16 causal ones from 16k take its ping-pong.
//
// Step 4.12: O's rescale skipped when no row of a warp has a new max (d >= 128), and d=256
// on 80-key tiles (64 before); 176-key tiles at d=128 measured slower and were not kept.
// Step 4.13 (timeline.cuh): per-item clock stamps of the warp-specialised kernels, compiled
// in only with -DFLASHTILE_SM90_TIMELINE=ON (timeline_mark is empty otherwise).
//
// Measured (H200, bf16, seqlen 16k, TFLOP/s full / causal, one device call; docs/JOURNEY.md
// "Step 4 — cuda_sm90"): d=64 4.3 410 / 404, 4.7 ping-pong 467 / 426 (another call);
// d=128 4.3 544 / 534, 4.5 590 / 565; d=256 (64-key tiles) 4.3 587 / 570, 4.4 634 / 610.
//
// Shared-memory tiles (Q, K, V, and O in the epilogue) all use wgmma's K-major 128-byte-
// swizzle canonical layout: the 16-bit columns are cut into blocks of 64 (128 bytes); block
// c of a kRows-row tile occupies kRows·128 contiguous bytes, row r at r·128, and 16-byte
// chunk j of that row at (j ^ (r % 8))·16. Every tile starts on 1024 bytes (the swizzle is
// applied to address bits 4-6 from bits 7-9, so it must be aligned to the 8-row atom).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

#include "attn/block_range.hpp"
#include "attn/seqlen.hpp"
#include "attn/softmax_state.hpp"
#include "attn/split_kv.hpp"
#include "attn/variant.hpp"
#include "cuda/common.cuh"
#include "cuda/04_sm90/tensor_map.cuh"
#include "cuda/04_sm90/tile_schedule.hpp"
#include "cuda/04_sm90/timeline.cuh"
#include "cuda/mma_fragment.cuh"
#include "cuda/split_kv_combine.cuh"
#include "cuda/split_kv_launch.hpp"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/mma.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/ptx/wgmma.cuh"

namespace flashtile::detail::sm90 {

inline constexpr int kWarpgroupThreads = 128;
inline constexpr int kWarpgroupRows = 64;   // the M of every wgmma
inline constexpr int kSwizzleBytes = 128;   // one row of a swizzle atom
inline constexpr int kSwizzleCols = 64;     // 16-bit columns in kSwizzleBytes
inline constexpr int kAtomBytes = 1024;     // 8 rows of kSwizzleBytes
inline constexpr int kSmemLimit = 227 * 1024;  // dynamic shared memory a CTA may opt into (sm_90)

// One kernel configuration (Sm90Traits<head_dim> in traits.cuh picks one per head dim).
//   kHeadDim   : head dim, a multiple of 64 (whole swizzle blocks)
//   kBlockN    : keys per K/V tile (the N of S = Q·Kᵀ)
//   kWarpgroups: consumer warpgroups per CTA, 64 query rows each
//   kStages    : depth of the K/V cp.async ring
//   kMinBlocks : CTAs per SM asked of the register allocator
template <int kHeadDim_, int kBlockN_, int kWarpgroups_, int kStages_, int kMinBlocks_>
struct Sm90Config {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarpgroups = kWarpgroups_;
  static constexpr int kStages = kStages_;
  static constexpr int kMinBlocks = kMinBlocks_;

  static constexpr int kBlockM = kWarpgroupRows * kWarpgroups;
  static constexpr int kThreads = kWarpgroupThreads * kWarpgroups;
  static constexpr int kRowChunks = kHeadDim / 8;       // 16-byte chunks per row
  static constexpr int kQKSteps = kHeadDim / 16;        // k-steps of Q·Kᵀ
  static constexpr int kPVSteps = kBlockN / 16;         // k-steps of P·V
  static constexpr int kSRegs = kBlockN / 2;            // S accumulator registers per thread
  static constexpr int kORegs = kHeadDim / 2;           // O accumulator registers per thread
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kTileBytes = kBlockN * kHeadDim * 2;  // one K or one V tile
  // TMA paths: one mbarrier for Q and four per stage (K landed, V landed, K free, V free).
  static constexpr int kBarrierBytes = 8 * (1 + 4 * kStages);
  // Q, then kStages (K, V) pairs, the barriers, and the slack to align the start.
  static constexpr int kSmemBytes = kQBytes + kStages * 2 * kTileBytes + kBarrierBytes + kAtomBytes;
  // Step 4.6 (persistent): a second Q buffer where it fits, so the producer loads the next
  // item's Q while the consumers still read this one's (and stage O over it); each Q buffer
  // has a "full" and an "empty" barrier. d=64: 2 x 16 KB of Q + 64 KB of K/V; d=128:
  // 2 x 32 + 128 = 192 KB; d=256: 2 x 64 + 128 = 256 KB does not fit, one buffer (192 KB).
  static constexpr int kPersistentBarrierBytes = 8 * (2 * 2 + 4 * kStages);
  static constexpr int kPersistentQBuffers =
      2 * kQBytes + kStages * 2 * kTileBytes + kPersistentBarrierBytes + kAtomBytes <= kSmemLimit
          ? 2
          : 1;
  static constexpr int kPersistentSmemBytes = kPersistentQBuffers * kQBytes +
                                              kStages * 2 * kTileBytes + kPersistentBarrierBytes +
                                              kAtomBytes;

  // Step 4.7's 192-row configuration of the head dim, where it has one (Sm90Traits).
  using BlockM192 = void;

  static_assert(kHeadDim % kSwizzleCols == 0 && kHeadDim <= 256,
                "head dim: whole 64-column swizzle blocks, at most 256 (wgmma N)");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 256,
                "K/V tiles: whole 16-key k-steps of P·V, at most 256 keys (wgmma N)");
  static_assert(kBlockN % 8 == 0, "K tiles hold whole 8-row swizzle atoms");
  static_assert(kStages >= 2, "the cp.async ring needs at least two stages");
  static_assert(kQBytes % kAtomBytes == 0 && kTileBytes % kAtomBytes == 0,
                "every tile starts on a 1024-byte swizzle atom");
};

// The first kAtomBytes-aligned shared address at or after `raw` (dynamic shared memory is
// only 16-byte aligned; kSmemBytes holds the slack).
__device__ __forceinline__ uint32_t atom_aligned(uint32_t raw) {
  return (raw + kAtomBytes - 1) & ~uint32_t(kAtomBytes - 1);
}

// Byte offset of 16-byte chunk `chunk` (columns 8·chunk .. 8·chunk+7) of row `row` in a
// swizzled tile of kRows rows (the layout in the header comment).
template <int kRows>
__host__ __device__ __forceinline__ uint32_t swizzled_offset(int row, int chunk) {
  return static_cast<uint32_t>((chunk / 8) * (kRows * kSwizzleBytes) + row * kSwizzleBytes +
                               (((chunk % 8) ^ (row % 8)) * 16));
}

// Descriptor of the K-major operand that k-step `ks` (columns 16·ks .. 16·ks+15) of rows
// [row0, row0 + 64 or N) reads: Q as A of Q·Kᵀ, K as its B. Inside a swizzle block a k-step
// starts 32 bytes further (the hardware swizzles the address it forms); the 8-row groups
// lie kAtomBytes apart (stride offset); the leading offset is unused for this layout.
template <int kRows>
__device__ __forceinline__ uint64_t k_major_descriptor(uint32_t tile, int row0, int ks) {
  const uint32_t address = tile + (ks / 4) * (kRows * kSwizzleBytes) + row0 * kSwizzleBytes +
                           (ks % 4) * 32;
  return ptx::smem_descriptor_128b(address, /*leading_bytes=*/16, /*stride_bytes=*/kAtomBytes);
}

// Descriptor of the MN-major operand that k-step `kk` (keys 16·kk .. 16·kk+15) reads: V as
// B of P·V (N = head dim runs along the rows of the tile). The next 64 head-dim columns
// lie one swizzle block (kRows·128 bytes) further (leading offset); the next 8 keys one
// atom further (stride offset).
template <int kRows>
__device__ __forceinline__ uint64_t mn_major_descriptor(uint32_t tile, int kk) {
  const uint32_t address = tile + kk * 16 * kSwizzleBytes;
  return ptx::smem_descriptor_128b(address, /*leading_bytes=*/kRows * kSwizzleBytes,
                                   /*stride_bytes=*/kAtomBytes);
}

// Copies rows [0, kRows) of a strided tensor (row 0 at `src`, rows `row_stride` elements
// apart, 16-byte aligned) into a swizzled tile with every thread of the CTA; rows >=
// valid_rows are zero-filled (no garbage, e.g. 0·NaN, reaches the products).
template <class Cfg, int kRows, class T>
__device__ __forceinline__ void load_tile_async(uint32_t tile, const T* src, int64_t row_stride,
                                                int valid_rows) {
  constexpr int kChunks = kRows * Cfg::kRowChunks;
  static_assert(kChunks % Cfg::kThreads == 0, "a tile is a whole number of copy passes");
#pragma unroll
  for (int i = 0; i < kChunks / Cfg::kThreads; ++i) {
    const int id = static_cast<int>(threadIdx.x) + i * Cfg::kThreads;
    const int row = id / Cfg::kRowChunks, chunk = id % Cfg::kRowChunks;
    const bool ok = row < valid_rows;
    // A skipped copy still names a valid address (row 0 always exists) but reads nothing.
    const T* from = ok ? src + row * row_stride + chunk * 8 : src;
    ptx::cp_async_16(tile + swizzled_offset<kRows>(row, chunk), from, ok);
  }
}

// Where this thread's accumulator registers lie inside its warpgroup's 64-row tile.
struct FragmentCoords {
  int warp_in_group, lane;
  __device__ __forceinline__ FragmentCoords()
      : warp_in_group(static_cast<int>(threadIdx.x / 32) % 4),
        lane(static_cast<int>(threadIdx.x % 32)) {}
  __device__ __forceinline__ int thread_in_group() const { return 32 * warp_in_group + lane; }
  // Register r of a row half: rows g (half 0) and g + 8 (half 1).
  __device__ __forceinline__ int row(int half) const {
    return ptx::accumulator_row(warp_in_group, lane, 2 * half);
  }
  __device__ __forceinline__ int col(int r) const { return ptx::accumulator_col(lane, r); }
};

// Accumulator registers 8·kk .. 8·kk+7 (S columns 16·kk .. 16·kk+15) as the A operand of
// k-step kk of P·V: a[0] = row g, cols 2t..; a[1] = row g+8; a[2], a[3] = the same 8 columns
// further (ptx/wgmma.cuh).
template <class T, int kRegs>
__device__ __forceinline__ void pack_a_operand(uint32_t (&a)[4], const float (&s)[kRegs], int kk) {
  a[0] = ptx::pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
  a[1] = ptx::pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
  a[2] = ptx::pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
  a[3] = ptx::pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
}

template <int kRegs>
__device__ __forceinline__ void fence_registers(float (&r)[kRegs]) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) ptx::fence_register(r[i]);
}

// Which load/sync scheme a dense call runs (the journey's steps, kept side by side so each
// can be measured and tested; varlen calls always take cp_async).
enum class Pipeline {
  cp_async,                      // 4.1
  tma,                           // 4.2
  tma_warp_specialized,          // 4.3
  tma_warp_specialized_overlap,  // 4.4
  tma_ping_pong,                 // 4.5
  tma_persistent,                // 4.6: persistent CTAs on 4.3, 4.4 or 4.5's consumers (traits.cuh)
  // 4.7: three consumer warpgroups (192 query rows a CTA) on the consumers of 4.3, 4.4 and
  // 4.5, for the head dims whose traits name a BlockM192 configuration (d=64).
  tma_ws_m192,
  tma_ws_overlap_m192,
  tma_ping_pong_m192,
};

// Whether `pipeline` runs the head dim's 192-row configuration (step 4.7).
constexpr bool uses_block_m192(Pipeline pipeline) {
  return pipeline == Pipeline::tma_ws_m192 || pipeline == Pipeline::tma_ws_overlap_m192 ||
         pipeline == Pipeline::tma_ping_pong_m192;
}
// Whether `pipeline` can split a call's keys (split-KV, step 4.10): the warp-specialised
// one-block-per-CTA kernels (4.3-4.5, 4.7).
constexpr bool splits_keys(Pipeline pipeline) {
  return pipeline == Pipeline::tma_warp_specialized ||
         pipeline == Pipeline::tma_warp_specialized_overlap ||
         pipeline == Pipeline::tma_ping_pong || uses_block_m192(pipeline);
}

// Shared-memory map of one CTA: [ Q buffers (kBlockM, d) x kQBuffers | stage s: K (kBlockN,
// d), V (kBlockN, d) ... | barriers: Q full[kQBuffers], K full, V full, K empty, V empty
// [kStages each], Q empty[kQBuffers] ], every tile swizzled. Steps 4.1-4.5 have one Q
// buffer and never use Q's empty barrier (their Q is loaded once).
template <class Cfg, int kQBuffers = 1>
struct SmemMap {
  unsigned char* base;  // generic pointer to Q buffer 0
  uint32_t q, kv;       // shared addresses of Q buffer 0 and of stage 0
  __device__ __forceinline__ explicit SmemMap(unsigned char* raw_ptr) {
    const uint32_t raw = ptx::smem_addr(raw_ptr);
    q = atom_aligned(raw);
    base = raw_ptr + (q - raw);
    kv = q + kQBuffers * Cfg::kQBytes;
  }
  __device__ __forceinline__ uint32_t q_buffer(int buffer) const { return q + buffer * Cfg::kQBytes; }
  __device__ __forceinline__ unsigned char* q_buffer_ptr(int buffer) const {
    return base + buffer * Cfg::kQBytes;
  }
  __device__ __forceinline__ uint32_t k_stage(int stage) const {
    return kv + stage * 2 * Cfg::kTileBytes;
  }
  __device__ __forceinline__ uint32_t v_stage(int stage) const {
    return k_stage(stage) + Cfg::kTileBytes;
  }
  __device__ __forceinline__ uint32_t q_full(int buffer) const {
    return k_stage(Cfg::kStages) + 8u * buffer;
  }
  __device__ __forceinline__ uint32_t q_barrier() const { return q_full(0); }
  __device__ __forceinline__ uint32_t q_empty(int buffer) const {
    return ring_barrier(4, 0) + 8u * buffer;
  }
  // The ring's barriers, one of each per stage. K and V complete and are released apart,
  // so the producer can refill a stage's K while its V still feeds a P·V (step 4.4); step
  // 4.2 lands K and V together on k_full.
  __device__ __forceinline__ uint32_t k_full(int stage) const { return ring_barrier(0, stage); }
  __device__ __forceinline__ uint32_t v_full(int stage) const { return ring_barrier(1, stage); }
  __device__ __forceinline__ uint32_t k_empty(int stage) const { return ring_barrier(2, stage); }
  __device__ __forceinline__ uint32_t v_empty(int stage) const { return ring_barrier(3, stage); }

 private:
  __device__ __forceinline__ uint32_t ring_barrier(int kind, int stage) const {
    return q_full(0) + 8u * (kQBuffers + kind * Cfg::kStages + stage);
  }
};

// What one CTA computes (one work item, in the persistent kernel): its query block of one
// (batch, head), the key tiles that block visits (last-first: tile i is key block
// blocks.end - 1 - i) and where its rows live.
struct CtaWork {
  int64_t b, h, hk;
  SeqlenInfo<int> seq;
  Mask<int> mask;
  int row_start;
  KeyBlocks<int> blocks;

  // The non-persistent grid: (query block, head, batch entry), heaviest blocks first in x;
  // with heads_per_group > 1 (masked dense calls on steps 4.3-4.5 at d=128 and 256) the
  // linear block index runs over groups of heads, heaviest first inside each (grid_item).
  __device__ __forceinline__ CtaWork(const AttentionParams& p, int block_m, int block_n,
                                     int heads_per_group = 1)
      : CtaWork(p, block_m, block_n, grid_item(p, heads_per_group)) {}
  __device__ __forceinline__ CtaWork(const AttentionParams& p, int block_m, int block_n,
                                     const WorkItem& item)
      // Through uint32_t: the indices are never negative, and saying so spares the 64-bit
      // offsets their sign extensions (as blockIdx did).
      : b(static_cast<uint32_t>(item.batch)), h(static_cast<uint32_t>(item.head)),
        hk(int64_t(static_cast<uint32_t>(item.head)) / p.heads_per_kv()), seq(p, b),
        mask(seq.mask(p)), row_start(item.m_block * block_m) {
    // Past this sequence's end (varlen) the block is empty; callers return.
    if (row_start < seq.seqlen_q)
      blocks = key_blocks(mask, row_start, min(row_start + block_m, seq.seqlen_q), block_n);
  }
  __device__ __forceinline__ static WorkItem grid_item(const AttentionParams& p,
                                                      int heads_per_group) {
    const int x = static_cast<int>(blockIdx.x), m_blocks = static_cast<int>(gridDim.x);
    const int y = static_cast<int>(blockIdx.y), heads = static_cast<int>(gridDim.y);
    if (heads_per_group <= 1)
      return WorkItem{static_cast<int>(blockIdx.z), y,
                      heaviest_first_block(p.window_left, p.window_right, x, m_blocks)};
    const int heads_total = heads * static_cast<int>(gridDim.z);
    return grouped_heaviest_first_item(x + m_blocks * (y + heads * static_cast<int>(blockIdx.z)),
                                       heads, heads_total, m_blocks, heads_per_group,
                                       p.window_left, p.window_right);
  }
  // A split call's grid (step 4.10): x = query block rank · splits + split, in the plain
  // heaviest-first order (such a grid is small: no head groups); the CTA takes split
  // x % splits of its block's key blocks (split_key_blocks).
  __device__ __forceinline__ static CtaWork split_grid(const AttentionParams& p, int block_m,
                                                       int block_n, int splits) {
    const int x = static_cast<int>(blockIdx.x), m_blocks = static_cast<int>(gridDim.x) / splits;
    CtaWork work(p, block_m, block_n,
                 WorkItem{static_cast<int>(blockIdx.z), static_cast<int>(blockIdx.y),
                          heaviest_first_block(p.window_left, p.window_right, x / splits,
                                               m_blocks)});
    work.blocks = split_key_blocks(work.blocks, x % splits, splits);
    return work;
  }
  __device__ __forceinline__ bool idle() const { return row_start >= seq.seqlen_q; }
  __device__ __forceinline__ int n_tiles() const { return blocks.count(); }
  __device__ __forceinline__ int key_block(int tile) const { return blocks.end - 1 - tile; }
};

// One box per 64-column swizzle block of a tile: tiles hold block c at c·rows·128 bytes,
// which is where the map's 128-byte swizzle puts each box. One thread issues them.
template <class Cfg>
__device__ __forceinline__ void tma_load_tile(uint32_t dst, const CUtensorMap* map, uint32_t barrier,
                                              int rows, int row0, int64_t head, int64_t b) {
#pragma unroll
  for (int c = 0; c < Cfg::kHeadDim / kSwizzleCols; ++c)
    ptx::tma_load_4d(dst + c * rows * kSwizzleBytes, map, barrier, c * kSwizzleCols, row0,
                     static_cast<int>(head), static_cast<int>(b));
}

// A hook that does nothing (ConsumerWarpgroup::tile's default).
struct NoHook {
  __device__ __forceinline__ void operator()() const {}
};

// One consumer warpgroup: 64 query rows, their O accumulator and softmax state, and the
// per-tile math (S = Q·Kᵀ, mask, online softmax, O += P·V) every pipeline shares.
// kTransformed: softcap and/or ALiBi, through LogitsTransform::apply (the softcap's tanh on
// the SFU, tanh.approx); without it the logits are scale·q·k and the scale is folded into
// the exp2.
template <class T, class Cfg, bool kTransformed>
struct ConsumerWarpgroup {
  static constexpr int kBlockN = Cfg::kBlockN;
  static constexpr float kLog2e = 1.4426950408889634f;
  static constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  using MmaQK = ptx::Wgmma<T, kBlockN>;        // S (64, kBlockN) = Q (64, d) · Kᵀ
  using MmaPV = ptx::Wgmma<T, Cfg::kHeadDim>;  // O (64, d) += P (64, kBlockN) · V

  FragmentCoords frag;
  int row0;                 // first row of this warpgroup inside the CTA's block
  float o[Cfg::kORegs];     // O (64, d) accumulator
  float s[Cfg::kSRegs];     // S (64, kBlockN) accumulator, then P in fp32
  // Rows g and g + 8 of this thread: running max in natural units, and this thread's
  // partial sum l over its columns (the quad's four partials add up to the row's l).
  SoftmaxState<float> state[2];
  float scale, scale_log2;
  LogitsTransform<float> logits;  // this (batch, head)'s softcap and ALiBi slope
  bool softcap_on, alibi_on;      // which of the two kTransformed applies

  __device__ __forceinline__ ConsumerWarpgroup(int consumer_index, const AttentionParams& p,
                                               const CtaWork& work)
      : row0(consumer_index * kWarpgroupRows),
        logits(logits_transform<float>(p, work.b, work.h)),
        softcap_on(p.softcap != 0.0f),
        alibi_on(p.alibi_slopes != nullptr) {
#pragma unroll
    for (int r = 0; r < Cfg::kORegs; ++r) o[r] = 0.0f;
    state[0] = state[1] = {kNegInf, 0.0f};
    // The plain softmax folds the scale into its exp2, so the max of the raw scores must be
    // the max of the logits: a negative scale is moved into Q by flip_q_sign (exact).
    // scale_log2 stays above 0 so that a masked score (-inf) still gives 2^-inf = 0.
    scale = fabsf(p.scale);
    scale_log2 = fmaxf(scale * kLog2e, FLT_MIN);
  }

  // Whether the caller must flip Q's sign first (plain logits with a negative scale; the
  // transformed ones apply the scale, of either sign, themselves).
  __device__ __forceinline__ static bool needs_q_sign_flip(const AttentionParams& p) {
    return !kTransformed && p.scale < 0.0f;
  }

  // Flips the sign bits of this warpgroup's rows of Q (every thread of the warpgroup), then
  // publishes them to wgmma: fence.proxy.async and a barrier over the warpgroup.
  __device__ __forceinline__ void flip_q_sign(unsigned char* smem_q, int barrier_id) {
    constexpr int kWordsPerBlock = kWarpgroupRows * kSwizzleBytes / 4;
#pragma unroll 1
    for (int c = 0; c < Cfg::kHeadDim / kSwizzleCols; ++c) {
      auto* words = reinterpret_cast<uint32_t*>(smem_q + c * Cfg::kBlockM * kSwizzleBytes +
                                                row0 * kSwizzleBytes);
      for (int i = frag.thread_in_group(); i < kWordsPerBlock; i += kWarpgroupThreads)
        words[i] ^= 0x80008000u;
    }
    ptx::fence_proxy_async_shared();
    ptx::named_barrier_sync(barrier_id, kWarpgroupThreads);
  }

  // The per-tile pieces. S = Q·Kᵀ (64, kBlockN) of the K tile at k_tile, raw scores: issued
  // and committed as one wgmma group, not waited for.
  __device__ __forceinline__ void issue_scores(uint32_t smem_q, uint32_t k_tile) {
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Cfg::kQKSteps; ++ks)
      MmaQK::ss(s, k_major_descriptor<Cfg::kBlockM>(smem_q, row0, ks),
                k_major_descriptor<kBlockN>(k_tile, 0, ks), ks > 0);
    ptx::wgmma_commit();
  }

  // Once S has landed: the mask, then the online softmax; P (fp32) overwrites S, l and m
  // move on, and the factors by which O must be rescaled (rows g, g + 8) are returned in
  // alpha, for rescale_o (which may wait for a P·V still in flight).
  __device__ __forceinline__ void softmax(const CtaWork& work, int n_block, float (&alpha)[2]) {
    const int n0 = n_block * kBlockN;
    if constexpr (kTransformed) transform_scores(work, n0);
    // Only the tiles key_blocks() names hold keys some row must not see (the diagonal, the
    // window's edges, the end of K). Register r is row frag.row((r / 2) % 2), key col(r).
    if (work.blocks.needs_mask(n_block)) {
#pragma unroll
      for (int r = 0; r < Cfg::kSRegs; ++r) {
        const int row = work.row_start + row0 + frag.row((r / 2) % 2);
        if (!work.mask.visible(row, n0 + frag.col(r))) s[r] = kNegInf;
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float row_max = kNegInf;
#pragma unroll
      for (int c = 0; c < kBlockN / 8; ++c)
        row_max = fmaxf(row_max, fmaxf(s[4 * c + 2 * half], s[4 * c + 2 * half + 1]));
      // The quad's four lanes hold the row's columns.
      row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
      row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
      // Natural units: the logits' max (plain: scale · the raw scores' max).
      const float block_max = kTransformed || row_max == kNegInf ? row_max : row_max * scale;
      SoftmaxState<float>& st = state[half];
      alpha[half] = online_softmax_rescale(st, block_max);
      // P = exp(scale·s - m) = 2^(s·scale·log2e - m·log2e): one FFMA + one MUFU.EX2 (the
      // transformed logits are already scaled).
      const float to_log2 = kTransformed ? kLog2e : scale_log2;
      const float shift = safe_shift(st.m) * kLog2e;
      float row_sum = 0.0f;
#pragma unroll
      for (int c = 0; c < kBlockN / 8; ++c)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[4 * c + 2 * half + e];
          x = ptx::exp2_approx(fmaf(x, to_log2, -shift));
          row_sum += x;
        }
      st.l += row_sum;
    }
  }

  // Raw scores -> logits (kTransformed), before the mask: the feature pair is chosen once
  // per tile (uniform over the CTA) rather than per score.
  __device__ __forceinline__ void transform_scores(const CtaWork& work, int n0) {
    if (softcap_on)
      alibi_on ? apply_logits<true, true>(work, n0) : apply_logits<true, false>(work, n0);
    else
      alibi_on ? apply_logits<false, true>(work, n0) : apply_logits<false, false>(work, n0);
  }
  template <bool kSoftcap, bool kAlibi>
  __device__ __forceinline__ void apply_logits(const CtaWork& work, int n0) {
#pragma unroll
    for (int r = 0; r < Cfg::kSRegs; ++r) {
      const int row = work.row_start + row0 + frag.row((r / 2) % 2);
      s[r] = logits.template apply<kSoftcap, kAlibi>(s[r], work.mask, row, n0 + frag.col(r),
                                                     ptx::TanhApprox{});
    }
  }

  // alpha is exactly 1 for a row whose max did not grow (exp(0)), which after the first
  // tiles is most of them: when no row of the warp moved, the d/2 multiplies are skipped
  // (exact; a NaN alpha is not 1 and still reaches O). Warp-uniform, so no divergence.
  // Step 4.12a: d=256 +2-10%, d=128 level; at d=64 (32 multiplies, issue-bound) the vote
  // cost 1-2%, so it keeps the plain rescale.
  static constexpr bool kSkipUnitRescale = Cfg::kHeadDim >= 128;
  __device__ __forceinline__ void rescale_o(const float (&alpha)[2]) {
    if constexpr (kSkipUnitRescale)
      if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int c = 0; c < Cfg::kHeadDim / 8; ++c) {
        o[4 * c + 2 * half] *= alpha[half];
        o[4 * c + 2 * half + 1] *= alpha[half];
      }
  }

  // P (64, kBlockN) in 16-bit A fragments, one per k-step of P·V.
  __device__ __forceinline__ void pack_p(uint32_t (&p_frag)[Cfg::kPVSteps][4]) const {
#pragma unroll
    for (int kk = 0; kk < Cfg::kPVSteps; ++kk) pack_a_operand<T>(p_frag[kk], s, kk);
  }

  // O += P·V: P from registers, V (kBlockN, d) MN-major from shared memory; one committed
  // wgmma group, not waited for.
  __device__ __forceinline__ void issue_pv(const uint32_t (&p_frag)[Cfg::kPVSteps][4],
                                           uint32_t v_tile) {
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kPVSteps; ++kk)
      MmaPV::rs(o, p_frag[kk], mn_major_descriptor<kBlockN>(v_tile, kk), true);
    ptx::wgmma_commit();
  }

  // One K/V tile (key block n_block), both in shared memory, every wgmma waited for at
  // once: what steps 4.1-4.3 run. scores_done() runs once S has landed (K is no longer
  // read), values_needed() before P·V is issued (step 4.3 waits for V there).
  template <class ScoresDone = NoHook, class ValuesNeeded = NoHook>
  __device__ __forceinline__ void tile(uint32_t smem_q, uint32_t k_tile, uint32_t v_tile,
                                       const CtaWork& work, int n_block,
                                       ScoresDone&& scores_done = {},
                                       ValuesNeeded&& values_needed = {}) {
    issue_scores(smem_q, k_tile);
    ptx::wgmma_wait<0>();
    fence_registers(s);
    scores_done();
    float alpha[2];
    softmax(work, n_block, alpha);
    rescale_o(alpha);
    uint32_t p_frag[Cfg::kPVSteps][4];
    pack_p(p_frag);
    values_needed();
    issue_pv(p_frag, v_tile);
    ptx::wgmma_wait<0>();
    fence_registers(o);
  }

  // A split call's epilogue: this warpgroup's rows of O as fp32 partials of split `split`,
  // each normalised by its own denominator, and their LSEs, straight from the accumulators
  // (split_kv_combine.cuh merges them and applies the NaN rule and the sink to the row).
  __device__ __forceinline__ void store_partials(const AttentionParams& p, const CtaWork& work,
                                                 const SplitPartials& parts, int split) {
    const int64_t tile = parts.tile(work.b, work.h, p.heads_q, work.row_start / Cfg::kBlockM);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      SoftmaxState<float> st = quad_row_state(state[half]);
      const int local_row = row0 + frag.row(half);
      if (work.row_start + local_row < work.seq.seqlen_q)
        store_partial_row<Cfg::kHeadDim / 8>(parts, tile, split, local_row, frag.lane % 4, st,
                                             [&](int c) {
                                               return make_float2(o[4 * c + 2 * half],
                                                                  o[4 * c + 2 * half + 1]);
                                             });
    }
  }

  // Normalises O, writes the LSE, stages O through this warpgroup's rows of the Q tile (its
  // own wgmma no longer read them) and copies them out in 16-byte rows. barrier_id: a named
  // barrier over this warpgroup alone.
  __device__ __forceinline__ void epilogue(const AttentionParams& p, const CtaWork& work,
                                           unsigned char* smem_q, int barrier_id) {
    const float sink = sink_logit<float>(p, work.h);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      SoftmaxState<float> st = quad_row_state(state[half]);
      // add_sink would leave a state without sinks unchanged; the branch spares its exps.
      const float sink_factor = p.sinks != nullptr ? add_sink(st, sink) : 1.0f;
      const float out_scale = sink_factor * output_scale(st);  // 0 for a fully masked row
      const int local_row = row0 + frag.row(half);
#pragma unroll
      for (int c = 0; c < Cfg::kHeadDim / 8; ++c) {
        // Conflict-free: a quad writes one 16-byte chunk, the 8 rows 8 distinct bank groups.
        const uint32_t packed = ptx::pack2<T>(o[4 * c + 2 * half] * out_scale,
                                              o[4 * c + 2 * half + 1] * out_scale);
        *reinterpret_cast<uint32_t*>(smem_q + swizzled_offset<Cfg::kBlockM>(local_row, c) +
                                     4 * (frag.lane % 4)) = packed;
      }
      const int row = work.row_start + local_row;
      if (p.lse != nullptr && frag.lane % 4 == 0 && row < work.seq.seqlen_q)
        p.lse[work.seq.lse_index(p, work.b, work.h, row)] = log_sum_exp(st);
    }
    ptx::named_barrier_sync(barrier_id, kWarpgroupThreads);

    T* o_rows = static_cast<T*>(p.o) + work.seq.o_offset(p, work.b, work.row_start + row0, work.h);
    constexpr int kOutChunks = kWarpgroupRows * Cfg::kRowChunks;
    static_assert(kOutChunks % kWarpgroupThreads == 0, "the output is a whole number of passes");
#pragma unroll
    for (int i = 0; i < kOutChunks / kWarpgroupThreads; ++i) {
      const int id = frag.thread_in_group() + i * kWarpgroupThreads;
      const int row = id / Cfg::kRowChunks, chunk = id % Cfg::kRowChunks;
      if (work.row_start + row0 + row < work.seq.seqlen_q)
        *reinterpret_cast<uint4*>(o_rows + row * p.o_row_stride + chunk * 8) =
            *reinterpret_cast<const uint4*>(smem_q +
                                            swizzled_offset<Cfg::kBlockM>(row0 + row, chunk));
    }
  }
};

// Named barrier ids: 0 is __syncthreads; consumer warpgroup c of n syncs alone on 1 + c, and
// waits for its turn on the tensor cores (ping-pong) on 1 + n + c (two consumers: 3 and 4).
__device__ __forceinline__ int consumer_barrier_id(int consumer_index) { return 1 + consumer_index; }
__device__ __forceinline__ int turn_barrier_id(int consumer_index, int consumers) {
  return 1 + consumers + consumer_index;
}

// Steps 4.1 and 4.2: every thread computes; the ring is refilled by cp.async (every thread)
// or by TMA (one thread), with one __syncthreads per tile. Plain logits (scale·q·k) with
// any mask, sinks, dense or varlen (cp_async only).
template <class T, class Cfg, bool kTma, bool kTransformed>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    sm90_forward_kernel(const AttentionParams p, const __grid_constant__ TmaMaps maps) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  extern __shared__ unsigned char smem_raw[];
  const SmemMap<Cfg> smem(smem_raw);
  const CtaWork work(p, kBlockM, kBlockN);
  if (work.idle()) return;
  const int n_tiles = work.n_tiles();
  const int consumer = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  const bool tma_issuer = kTma && threadIdx.x == 0;

  if constexpr (kTma) {
    if (tma_issuer) {
      ptx::mbarrier_init(smem.q_barrier(), 1);
      for (int stage = 0; stage < kStages; ++stage) ptx::mbarrier_init(smem.k_full(stage), 1);
      ptx::mbarrier_init_fence();
      ptx::mbarrier_arrive_expect_tx(smem.q_barrier(), Cfg::kQBytes);
      tma_load_tile<Cfg>(smem.q, &maps.q, smem.q_barrier(), kBlockM,
                         work.seq.q_start + work.row_start, work.h, work.b);
    }
    __syncthreads();  // the barriers are initialised before anyone waits on them
  } else {
    const T* q_rows = static_cast<const T*>(p.q) + work.seq.q_offset(p, work.b, work.row_start, work.h);
    load_tile_async<Cfg, kBlockM>(smem.q, q_rows, p.q_row_stride, work.seq.seqlen_q - work.row_start);
    ptx::cp_async_commit();
  }
  const T* k_head = static_cast<const T*>(p.k) + work.seq.k_offset(p, work.b, 0, work.hk);
  const T* v_head = static_cast<const T*>(p.v) + work.seq.v_offset(p, work.b, 0, work.hk);
  auto issue_tile = [&](int tile) {
    const int n0 = work.key_block(tile) * kBlockN;
    const int stage = tile % kStages;
    if constexpr (kTma) {
      if (tma_issuer && tile < n_tiles) {
        ptx::mbarrier_arrive_expect_tx(smem.k_full(stage), 2 * Cfg::kTileBytes);
        tma_load_tile<Cfg>(smem.k_stage(stage), &maps.k, smem.k_full(stage), kBlockN,
                           work.seq.k_start + n0, work.hk, work.b);
        tma_load_tile<Cfg>(smem.v_stage(stage), &maps.v, smem.k_full(stage), kBlockN,
                           work.seq.k_start + n0, work.hk, work.b);
      }
    } else {
      if (tile < n_tiles) {
        const int valid_rows = work.seq.seqlen_k - n0;
        load_tile_async<Cfg, kBlockN>(smem.k_stage(stage), k_head + n0 * p.k_row_stride,
                                      p.k_row_stride, valid_rows);
        load_tile_async<Cfg, kBlockN>(smem.v_stage(stage), v_head + n0 * p.v_row_stride,
                                      p.v_row_stride, valid_rows);
      }
      ptx::cp_async_commit();  // empty groups keep the wait counts uniform
    }
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue_tile(s);

  using Consumer = ConsumerWarpgroup<T, Cfg, kTransformed>;
  Consumer wg(consumer, p, work);
  if constexpr (kTma)
    ptx::mbarrier_wait(smem.q_barrier(), 0);
  else
    ptx::cp_async_wait<kStages - 1>();  // the Q group is the oldest
  // A cp.async thread has waited for its own part of Q only. The sign flip needs all of it,
  // and so does the epilogue when no tile's __syncthreads comes first (n_tiles == 0): it
  // stages O over Q's rows, which other warpgroups' copies could still be filling.
  const bool flip_q = Consumer::needs_q_sign_flip(p);
  if (flip_q || (!kTma && n_tiles == 0)) __syncthreads();
  if (flip_q) wg.flip_q_sign(smem.base, consumer_barrier_id(consumer));

  for (int tile = 0; tile < n_tiles; ++tile) {
    if constexpr (kTma) {
      __syncthreads();  // every warpgroup is done with the oldest stage
      issue_tile(tile + kStages - 1);
      // This tile's K and V have landed: phase tile / kStages of its stage's barrier.
      ptx::mbarrier_wait(smem.k_full(tile % kStages), (tile / kStages) % 2);
    } else {
      ptx::cp_async_wait<kStages - 2>();  // this tile's K and V have landed (this thread's)
      ptx::fence_proxy_async_shared();    // ... visible to wgmma
      __syncthreads();                    // ... for every thread; the oldest stage is free
      issue_tile(tile + kStages - 1);
    }
    wg.tile(smem.q, smem.k_stage(tile % kStages), smem.v_stage(tile % kStages), work,
            work.key_block(tile));
  }
  // Every copy issued was waited for, but for the cp.async path's empty groups.
  if constexpr (!kTma) ptx::cp_async_wait<0>();
  wg.epilogue(p, work, smem.base, consumer_barrier_id(consumer));
}

// Step 4.3: warp specialisation (dense calls, TMA). Warpgroup 0 is the producer, warpgroups
// 1..kWarpgroups the consumers; they meet only on the full / empty mbarriers of the ring.
inline constexpr int kProducerRegisters = 24;  // one thread issues copies; the rest idle
// Two consumers: 128·24 + 256·240 = 62464; three (step 4.7): 128·24 + 384·160 = 64512 of the
// 64K registers per SM (168 would need 67584).
template <class Cfg>
inline constexpr int kConsumerRegisters = Cfg::kWarpgroups == 2 ? 240 : 160;

template <class Cfg>
inline constexpr int kWsThreads = Cfg::kThreads + kWarpgroupThreads;
template <class Cfg>
inline constexpr bool kRegisterSplitFits =
    (Cfg::kWarpgroups == 2 || Cfg::kWarpgroups == 3) &&
    kWarpgroupThreads * kProducerRegisters +
            Cfg::kWarpgroups * kWarpgroupThreads * kConsumerRegisters<Cfg> <= 65536;
// Each consumer warp arrives once on an "empty" barrier when it is done with the buffer.
template <class Cfg>
inline constexpr int kConsumerWarps = Cfg::kWarpgroups * 4;

// The warp-specialised kernels' barriers (thread 0 initialises them; the CTA syncs before
// anyone waits). Who arrives on each, per phase:
//   Q full[i]    : the producer's expect_tx (1 arrival) and Q's TMA bytes;
//   K/V full[s]  : the producer's expect_tx (1 arrival) and the tile's TMA bytes;
//   K/V empty[s] : each consumer warp, once its wgmma have read the tile (K after S, V
//                  after P·V);
//   Q empty[i]   : (step 4.6 only) each consumer warp, once its epilogue has copied O,
//                  staged over the buffer, out to global memory.
// Waits: consumers on the full barriers, the producer on the empty ones, each with the
// parity RingSlot gives for its use of the buffer (tile_schedule.hpp).
template <class Cfg, int kQBuffers>
__device__ __forceinline__ void init_ws_barriers(const SmemMap<Cfg, kQBuffers>& smem,
                                                 bool q_released) {
  for (int i = 0; i < kQBuffers; ++i) {
    ptx::mbarrier_init(smem.q_full(i), 1);
    if (q_released) ptx::mbarrier_init(smem.q_empty(i), kConsumerWarps<Cfg>);
  }
  for (int stage = 0; stage < Cfg::kStages; ++stage) {
    ptx::mbarrier_init(smem.k_full(stage), 1);
    ptx::mbarrier_init(smem.v_full(stage), 1);
    ptx::mbarrier_init(smem.k_empty(stage), kConsumerWarps<Cfg>);
    ptx::mbarrier_init(smem.v_empty(stage), kConsumerWarps<Cfg>);
  }
  ptx::mbarrier_init_fence();
}

// The producer thread: work's Q tile into Q buffer `buffer`, completing on its full barrier.
template <class Cfg, int kQBuffers>
__device__ __forceinline__ void produce_q(const SmemMap<Cfg, kQBuffers>& smem, const TmaMaps& maps,
                                          const CtaWork& work, int buffer) {
  ptx::mbarrier_arrive_expect_tx(smem.q_full(buffer), Cfg::kQBytes);
  tma_load_tile<Cfg>(smem.q_buffer(buffer), &maps.q, smem.q_full(buffer), Cfg::kBlockM,
                     work.seq.q_start + work.row_start, work.h, work.b);
}

// The producer thread: work's key tiles, which are the CTA's tiles tile_base, tile_base + 1,
// ... over its lifetime. Before a stage is refilled its previous lap is released: K is
// waited for alone, so it lands while V still feeds the previous tile's P·V. load_q() runs
// after the first tiles_before_q tiles (0 <= tiles_before_q <= the tile count).
template <class Cfg, int kQBuffers, class LoadQ>
__device__ __forceinline__ void produce_item_tiles(const SmemMap<Cfg, kQBuffers>& smem,
                                                   const TmaMaps& maps, const CtaWork& work,
                                                   uint32_t tile_base, int tiles_before_q,
                                                   LoadQ&& load_q) {
  auto issue_tile = [&](int tile) {
    const RingSlot<Cfg::kStages> ring{tile_base + tile};
    const int stage = ring.slot();
    const int n0 = work.key_block(tile) * Cfg::kBlockN;
    if (ring.reused()) ptx::mbarrier_wait(smem.k_empty(stage), ring.released_parity());
    ptx::mbarrier_arrive_expect_tx(smem.k_full(stage), Cfg::kTileBytes);
    tma_load_tile<Cfg>(smem.k_stage(stage), &maps.k, smem.k_full(stage), Cfg::kBlockN,
                       work.seq.k_start + n0, work.hk, work.b);
    if (ring.reused()) ptx::mbarrier_wait(smem.v_empty(stage), ring.released_parity());
    ptx::mbarrier_arrive_expect_tx(smem.v_full(stage), Cfg::kTileBytes);
    tma_load_tile<Cfg>(smem.v_stage(stage), &maps.v, smem.v_full(stage), Cfg::kBlockN,
                       work.seq.k_start + n0, work.hk, work.b);
  };
  for (int tile = 0; tile < tiles_before_q; ++tile) issue_tile(tile);
  load_q();
  for (int tile = tiles_before_q; tile < work.n_tiles(); ++tile) issue_tile(tile);
}

// One consumer warpgroup's key tiles of one work item, the CTA's tiles tile_base, ... over
// its lifetime, against the Q tile at smem_q (this warpgroup's rows); every wgmma is waited
// for on return.
// kOverlap (step 4.4): the softmax of tile j runs while the tensor cores compute P·V of
// tile j-1: S_j = Q·K_jᵀ and O += P_{j-1}·V_{j-1} are issued back to back, the warpgroup
// waits for S_j alone, runs the softmax, and only then waits for O, rescales it and packs
// P_j.
// kPingPong (step 4.5, with kOverlap): the two consumer warpgroups take turns to issue
// their GEMMs (named barriers, 3 + c), so one's softmax runs under the other's GEMMs.
template <bool kOverlap, bool kPingPong, class Consumer, class Cfg, int kQBuffers>
__device__ __forceinline__ void consume_item_tiles(Consumer& wg, const SmemMap<Cfg, kQBuffers>& smem,
                                                   uint32_t smem_q, const CtaWork& work,
                                                   int consumer, uint32_t tile_base) {
  constexpr int kStages = Cfg::kStages;
  const int n_tiles = work.n_tiles();
  const auto ring = [&](int tile) { return RingSlot<kStages>{tile_base + tile}; };
  const auto k_tile = [&](int tile) { return smem.k_stage(ring(tile).slot()); };
  const auto v_tile = [&](int tile) { return smem.v_stage(ring(tile).slot()); };
  auto wait_k = [&](int tile) {
    ptx::mbarrier_wait(smem.k_full(ring(tile).slot()), ring(tile).full_parity());
  };
  auto wait_v = [&](int tile) {
    ptx::mbarrier_wait(smem.v_full(ring(tile).slot()), ring(tile).full_parity());
  };
  // One arrival per consumer warp, once its wgmma have finished reading the tile.
  auto release_k = [&](int tile) {
    if (wg.frag.lane == 0) ptx::mbarrier_arrive(smem.k_empty(ring(tile).slot()));
  };
  auto release_v = [&](int tile) {
    if (wg.frag.lane == 0) ptx::mbarrier_arrive(smem.v_empty(ring(tile).slot()));
  };
  if constexpr (!kOverlap) {
    for (int tile = 0; tile < n_tiles; ++tile) {
      wait_k(tile);
      wg.tile(smem_q, k_tile(tile), v_tile(tile), work, work.key_block(tile),
              [&] { release_k(tile); }, [&] { wait_v(tile); });
      release_v(tile);
    }
  } else if (n_tiles > 0) {
    // GEMM phases: S_0; then S_j with P_{j-1}·V_{j-1}; then P_{n-1}·V_{n-1}. Under
    // ping-pong the consumers take turns round the ring 0, 1, .., kConsumers - 1: consumer c
    // waits for its turn before each phase and hands it to c + 1 once the phase is issued;
    // the last consumer lets consumer 0 go first and skips its last hand-over, so every
    // arrival is matched by a wait within the item (all consumers run the same items and
    // tiles, so the turns start afresh on the next one). A turn barrier joins the consumer
    // that waits and the one that hands over.
    constexpr int kConsumers = Cfg::kWarpgroups;
    constexpr int kTurnThreads = 2 * kWarpgroupThreads;
    const bool last_consumer = consumer == kConsumers - 1;
    // 1 - c for two consumers, as steps 4.5/4.6 were built (their SASS unchanged).
    const int next_consumer = kConsumers == 2 ? 1 - consumer : last_consumer ? 0 : consumer + 1;
    auto take_turn = [&] {
      if constexpr (kPingPong)
        ptx::named_barrier_sync(turn_barrier_id(consumer, kConsumers), kTurnThreads);
    };
    auto hand_over = [&](bool last_phase) {
      if constexpr (kPingPong)
        if (!(last_phase && last_consumer))
          ptx::named_barrier_arrive(turn_barrier_id(next_consumer, kConsumers), kTurnThreads);
    };
    if constexpr (kPingPong)
      if (last_consumer) ptx::named_barrier_arrive(turn_barrier_id(0, kConsumers), kTurnThreads);
    uint32_t p_frag[Cfg::kPVSteps][4];  // P of the previous tile, the A operand of its P·V
    // The previous softmax's rescale factors: O is rescaled just before the P·V that adds
    // that tile, under the S GEMM in flight, so that after the last wait only the packing
    // of P remains (on the first tile O is 0 and alpha 0 or 1).
    float alpha[2];
    wait_k(0);
    take_turn();
    wg.issue_scores(smem_q, k_tile(0));
    hand_over(false);
    ptx::wgmma_wait<0>();
    fence_registers(wg.s);
    release_k(0);
    wg.softmax(work, work.key_block(0), alpha);
    wg.pack_p(p_frag);
    if (n_tiles > 1) wait_k(1);
    for (int tile = 1; tile < n_tiles; ++tile) {
      take_turn();
      wg.issue_scores(smem_q, k_tile(tile));
      wg.rescale_o(alpha);
      wait_v(tile - 1);
      wg.issue_pv(p_frag, v_tile(tile - 1));
      hand_over(false);
      ptx::wgmma_wait<1>();  // S of this tile (the older group) has landed
      fence_registers(wg.s);
      release_k(tile);
      wg.softmax(work, work.key_block(tile), alpha);
      // The next K is waited for here rather than at the top of the loop: its wait loop
      // keeps ptxas from scheduling the second row half's exp2 after the wait below, out
      // from under the P·V (it does without it, cuobjdump; a bar.sync does not stop it).
      if (tile + 1 < n_tiles) wait_k(tile + 1);
      ptx::wgmma_wait<0>();  // ... and O += P·V of the previous tile
      fence_registers(wg.o);
      release_v(tile - 1);
      wg.pack_p(p_frag);
    }
    take_turn();
    wg.rescale_o(alpha);
    wait_v(n_tiles - 1);
    wg.issue_pv(p_frag, v_tile(n_tiles - 1));
    hand_over(true);
    ptx::wgmma_wait<0>();
    fence_registers(wg.o);
    release_v(n_tiles - 1);
  }
}

// Steps 4.3-4.5: one query block per CTA (the grid of launch_sm90_kernel), in the order
// heads_per_group gives (CtaWork::grid_item); with parts.splits > 1 (step 4.10) one split of
// a block's keys per CTA (CtaWork::split_grid), its partial written to the workspace.
template <class T, class Cfg, bool kOverlap, bool kPingPong, bool kTransformed>
__global__ void __launch_bounds__(kWsThreads<Cfg>, 1)
    sm90_ws_forward_kernel(const AttentionParams p, const __grid_constant__ TmaMaps maps,
                           const int heads_per_group, const SplitPartials parts) {
  static_assert(kRegisterSplitFits<Cfg>, "the register split fits the multiprocessor's 64K registers");
  extern __shared__ unsigned char smem_raw[];
  const SmemMap<Cfg> smem(smem_raw);
  // 4.13's stamps (timeline.cuh; nothing unless FLASHTILE_SM90_TIMELINE): consumers only.
  timeline_mark(kItemStart, linear_cta(), static_cast<int>(threadIdx.x) / kWarpgroupThreads - 1,
                Cfg::kWarpgroups);
  const bool split_kv = parts.splits > 1;
  const CtaWork work = split_kv ? CtaWork::split_grid(p, Cfg::kBlockM, Cfg::kBlockN, parts.splits)
                                : CtaWork(p, Cfg::kBlockM, Cfg::kBlockN, heads_per_group);
  if (work.idle()) return;
  // The combine (a programmatic dependent launch) may be scheduled from here on.
  if (split_kv) allow_dependent_launch();
  const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  if (threadIdx.x == 0) init_ws_barriers(smem, /*q_released=*/false);
  __syncthreads();  // the barriers are initialised before anyone waits on them

  if (warpgroup == 0) {  // producer: Q (phase 0 of its full barrier), then every tile
    ptx::setmaxnreg_dec<kProducerRegisters>();
    if (threadIdx.x == 0)
      produce_item_tiles(smem, maps, work, /*tile_base=*/0, /*tiles_before_q=*/0,
                         [&] { produce_q(smem, maps, work, 0); });
    return;
  }

  ptx::setmaxnreg_inc<kConsumerRegisters<Cfg>>();
  const int consumer = warpgroup - 1;
  using Consumer = ConsumerWarpgroup<T, Cfg, kTransformed>;
  Consumer wg(consumer, p, work);
  ptx::mbarrier_wait(smem.q_full(0), 0);
  timeline_mark(kQLanded, linear_cta(), consumer, Cfg::kWarpgroups);
  if (Consumer::needs_q_sign_flip(p)) wg.flip_q_sign(smem.base, consumer_barrier_id(consumer));
  consume_item_tiles<kOverlap, kPingPong>(wg, smem, smem.q, work, consumer, /*tile_base=*/0);
  timeline_mark(kTilesDone, linear_cta(), consumer, Cfg::kWarpgroups, work.n_tiles());
  if (split_kv)  // the split of split_grid, from the grid (not kept across the loop)
    wg.store_partials(p, work, parts, static_cast<int>(blockIdx.x) % parts.splits);
  else
    wg.epilogue(p, work, smem.base, consumer_barrier_id(consumer));
  timeline_mark(kEpilogueDone, linear_cta(), consumer, Cfg::kWarpgroups);
}

// Step 4.6 (Pipeline::tma_persistent): the consumers of 4.3 (kOverlap false), 4.4
// (kOverlap) or 4.5 (kOverlap, kPingPong) in a persistent CTA. The grid is one CTA per
// resident slot; CTA x computes one work item per round, TileSchedule::item_index(x, grid,
// round) (heaviest first, snaking: tile_schedule.hpp), and every thread walks that sequence
// itself. The producer runs ahead across items: once an item's last tile is issued it
// issues the next item's Q and first tiles while the consumers finish this item's last
// tiles and epilogue. Counted over the CTA's lifetime (RingSlot): the key tiles
// (tile_base), for the K/V ring; the items (items_done), for the Q buffers: the CTA's k-th
// item uses Q buffer k % kQBuffers, whose full barrier completes phase k / kQBuffers when
// its Q lands, and whose empty barrier completes one when both consumers have copied O
// (staged over it by the epilogue) out; the producer refills a buffer only after that, so
// the epilogue never stages O over a Q tile being loaded. With two buffers the next Q
// loads while this item computes; with one (d=256), after the next item's first tiles
// (tiles_before_q).
template <class T, class Cfg, bool kOverlap, bool kPingPong, bool kTransformed>
__global__ void __launch_bounds__(kWsThreads<Cfg>, 1)
    sm90_persistent_forward_kernel(const AttentionParams p, const __grid_constant__ TmaMaps maps,
                                   const TileSchedule schedule) {
  static_assert(kRegisterSplitFits<Cfg>, "the register split fits the multiprocessor's 64K registers");
  static_assert(Cfg::kPersistentSmemBytes <= kSmemLimit,
                "the Q buffers and the K/V ring fit the 227 KB of shared memory");
  constexpr int kQBuffers = Cfg::kPersistentQBuffers;
  extern __shared__ unsigned char smem_raw[];
  const SmemMap<Cfg, kQBuffers> smem(smem_raw);
  const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  const int cta = static_cast<int>(blockIdx.x), grid = static_cast<int>(gridDim.x);
  if (threadIdx.x == 0) init_ws_barriers(smem, /*q_released=*/true);
  __syncthreads();  // the barriers are initialised before anyone waits on them

  if (warpgroup == 0) {  // producer
    ptx::setmaxnreg_dec<kProducerRegisters>();
    if (threadIdx.x == 0) {
      uint32_t tile_base = 0, items_done = 0;
      for (int round = 0; round < schedule.rounds(grid); ++round) {
        const int index = TileSchedule::item_index(cta, grid, round);
        if (index >= schedule.items()) continue;  // the last round, partial
        const CtaWork work(p, Cfg::kBlockM, Cfg::kBlockN, schedule.item(index));
        const RingSlot<kQBuffers> q_use{items_done++};
        // The buffer's previous item is released (its epilogue is done), then this Q.
        auto load_q = [&] {
          if (q_use.reused())
            ptx::mbarrier_wait(smem.q_empty(q_use.slot()), q_use.released_parity());
          produce_q(smem, maps, work, q_use.slot());
        };
        produce_item_tiles(smem, maps, work, tile_base,
                           tiles_before_q<Cfg::kStages, kQBuffers>(work.n_tiles()), load_q);
        tile_base += work.n_tiles();
      }
    }
    return;
  }

  ptx::setmaxnreg_inc<kConsumerRegisters<Cfg>>();
  const int consumer = warpgroup - 1;
  using Consumer = ConsumerWarpgroup<T, Cfg, kTransformed>;
  uint32_t tile_base = 0, items_done = 0;
  for (int round = 0; round < schedule.rounds(grid); ++round) {
    const int index = TileSchedule::item_index(cta, grid, round);
    if (index >= schedule.items()) continue;  // the last round, partial
    const CtaWork work(p, Cfg::kBlockM, Cfg::kBlockN, schedule.item(index));
    const RingSlot<kQBuffers> q_use{items_done++};
    const int buffer = q_use.slot();
    const auto item = static_cast<uint32_t>(index);
    timeline_mark(kItemStart, item, consumer, Cfg::kWarpgroups);
    Consumer wg(consumer, p, work);  // O, m and l start afresh for each item
    ptx::mbarrier_wait(smem.q_full(buffer), q_use.full_parity());
    timeline_mark(kQLanded, item, consumer, Cfg::kWarpgroups);
    if (Consumer::needs_q_sign_flip(p))
      wg.flip_q_sign(smem.q_buffer_ptr(buffer), consumer_barrier_id(consumer));
    consume_item_tiles<kOverlap, kPingPong>(wg, smem, smem.q_buffer(buffer), work, consumer,
                                            tile_base);
    timeline_mark(kTilesDone, item, consumer, Cfg::kWarpgroups, work.n_tiles());
    // The epilogue's shared-memory offsets depend on the lane alone, so ptxas hoisted them
    // out of the item loop, and at d=256 the 15 it kept live across the tiles spilled (STL
    // before the loop, LDL in each epilogue). An opaque copy of the lane keeps them here.
    uint32_t lane = static_cast<uint32_t>(wg.frag.lane);
    ptx::fence_register(lane);
    wg.frag.lane = static_cast<int>(lane);
    wg.epilogue(p, work, smem.q_buffer_ptr(buffer), consumer_barrier_id(consumer));
    // Every warp of the warpgroup has read the staged O before any of them moves on. With one
    // Q buffer (d=256) the next item's staging writes were ordered after these reads only
    // through the Q empty/full mbarriers and the TMA between them, and racecheck reported
    // them (192 errors, d=256 only); with two buffers the next item's epilogue barrier
    // already stood between them.
    ptx::named_barrier_sync(consumer_barrier_id(consumer), kWarpgroupThreads);
    // Release the buffer: this thread's generic accesses to it are ordered before the TMA
    // (async proxy) refill, the warp's reads are done, then one arrival per warp.
    ptx::fence_proxy_async_shared();
    __syncwarp();
    if (wg.frag.lane == 0) ptx::mbarrier_arrive(smem.q_empty(buffer));
    timeline_mark(kEpilogueDone, item, consumer, Cfg::kWarpgroups);
    tile_base += work.n_tiles();
  }
}

// FLASHTILE_SM90_PERSISTENT_CTAS=n (n >= 1): at most n CTAs in step 4.6's grid, so that
// small shapes give each CTA many work items (tests, compute-sanitizer runs); 0 when unset.
// Defined in dispatch.cu, which reads the pipeline pin the same way.
int persistent_cta_cap();

template <class Kernel>
void set_smem_limit(Kernel* kernel, int bytes, int device) {
  raise_smem_limit_once(reinterpret_cast<const void*>(kernel), bytes, device);
}

// Heads per group of the warp-specialised kernels' grid (CtaWork::grid_item): under a mask
// as many as one wave of resident CTAs covers (heads_per_launch_group); 1, the plain grid,
// where the head dim keeps it (`grouped`: Sm90Traits::kGroupedMaskedGrid), without a mask
// (every block weighs the same) or when the linear block index passes 2^31.
template <class Kernel>
int ws_heads_per_group(const AttentionParams& p, bool grouped, Kernel* kernel, int threads,
                       int smem_bytes, const dim3& grid) {
  if (!grouped || !p.has_mask() || int64_t(grid.x) * grid.y * grid.z > INT_MAX) return 1;
  int per_sm = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor(cuda_sm90 kernel)");
  const int64_t resident = int64_t(device_facts(p.device_index).sms) * (per_sm > 0 ? per_sm : 1);
  return heads_per_launch_group(resident, static_cast<int>(grid.x));
}

// The grid of the one-block-per-CTA kernels: (query blocks x splits, heads, batch entries);
// it covers the longest sequence (p.seqlen_q) of every (head, batch entry).
template <class Cfg>
dim3 block_grid(const AttentionParams& p, int splits) {
  return dim3(static_cast<unsigned>((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM * splits),
              static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
}

// Launches a warp-specialised one-block-per-CTA kernel (4.3-4.5, 4.7), split or not.
template <class Cfg, class Kernel>
void launch_ws_kernel(Kernel* kernel, const AttentionParams& p, const TmaMaps& maps,
                      bool grouped_grid, const SplitPartials& parts, cudaStream_t stream) {
  set_smem_limit(kernel, Cfg::kSmemBytes, p.device_index);
  const dim3 grid = block_grid<Cfg>(p, parts.splits);
  const int heads_per_group =
      parts.splits > 1
          ? 1
          : ws_heads_per_group(p, grouped_grid, kernel, kWsThreads<Cfg>, Cfg::kSmemBytes, grid);
  kernel<<<grid, kWsThreads<Cfg>, Cfg::kSmemBytes, stream>>>(p, maps, heads_per_group, parts);
}

// Launches one pipeline on `stream`; parts.splits > 1 only for those that splits_keys().
template <class T, class Cfg, bool kTransformed>
void launch_sm90_kernel(const AttentionParams& p, const TmaMaps& maps, Pipeline pipeline,
                        bool grouped_grid, const SplitPartials& parts, cudaStream_t stream) {
  if (parts.splits > 1 && !splits_keys(pipeline))
    throw Error(ErrorKind::runtime, "cuda_sm90: a key split reached a pipeline that takes none");
  const dim3 grid = block_grid<Cfg>(p, 1);
  auto launch = [&](auto* kernel, int threads) {
    set_smem_limit(kernel, Cfg::kSmemBytes, p.device_index);
    kernel<<<grid, threads, Cfg::kSmemBytes, stream>>>(p, maps);
  };
  auto launch_ws = [&](auto* kernel) {
    launch_ws_kernel<Cfg>(kernel, p, maps, grouped_grid, parts, stream);
  };
  // Step 4.6: as many CTAs as stay resident at once (SMs x CTAs per SM), at most one per item.
  auto launch_persistent = [&](auto* kernel) {
    set_smem_limit(kernel, Cfg::kPersistentSmemBytes, p.device_index);
    const TileSchedule schedule{static_cast<int>(p.batch), static_cast<int>(p.heads_q),
                                static_cast<int>(grid.x), p.window_left, p.window_right};
    const int sms = device_facts(p.device_index).sms;
    int per_sm = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWsThreads<Cfg>,
                                                             Cfg::kPersistentSmemBytes),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor(cuda_sm90 persistent kernel)");
    const int cap = persistent_cta_cap();
    const int64_t resident = int64_t(sms) * (per_sm > 0 ? per_sm : 1);
    const int64_t slots = cap > 0 && cap < resident ? cap : resident;
    const int64_t items = schedule.items_64();
    if (items == 0) return;
    const int ctas = static_cast<int>(items < slots ? items : slots);
    if (!schedule.fits_int32(ctas))
      throw Error(ErrorKind::unsupported,
                  "cuda_sm90 tma_persistent: batch x heads x query blocks must stay below 2^31; got " +
                      std::to_string(items));
    kernel<<<ctas, kWsThreads<Cfg>, Cfg::kPersistentSmemBytes, stream>>>(p, maps, schedule);
  };
  switch (pipeline) {
    case Pipeline::cp_async:
      launch(&sm90_forward_kernel<T, Cfg, false, kTransformed>, Cfg::kThreads);
      break;
    case Pipeline::tma:
      launch(&sm90_forward_kernel<T, Cfg, true, kTransformed>, Cfg::kThreads);
      break;
    case Pipeline::tma_warp_specialized:
      launch_ws(&sm90_ws_forward_kernel<T, Cfg, false, false, kTransformed>);
      break;
    case Pipeline::tma_warp_specialized_overlap:
      launch_ws(&sm90_ws_forward_kernel<T, Cfg, true, false, kTransformed>);
      break;
    case Pipeline::tma_ping_pong:
      launch_ws(&sm90_ws_forward_kernel<T, Cfg, true, true, kTransformed>);
      break;
    case Pipeline::tma_persistent:
      launch_persistent(&sm90_persistent_forward_kernel<T, Cfg, Cfg::kPersistentOverlap,
                                                        Cfg::kPersistentPingPong, kTransformed>);
      break;
    case Pipeline::tma_ws_m192:
    case Pipeline::tma_ws_overlap_m192:
    case Pipeline::tma_ping_pong_m192:
      throw Error(ErrorKind::runtime, "cuda_sm90: a 192-row pipeline reached the 128-row launcher");
  }
  check_launch("cuda_sm90 forward kernel");
}

// Step 4.7: the warp-specialised kernel with three consumer warpgroups (Cfg::kWarpgroups 3,
// 192 query rows), on 4.3's, 4.4's or 4.5's consumers; only these kernels are instantiated
// for such a configuration (the cp.async copy loops of 4.1/4.2 divide a tile among the
// CTA's threads, and 128-key tiles do not divide among 384).
template <class T, class Cfg, bool kTransformed>
void launch_sm90_m192_kernel(const AttentionParams& p, const TmaMaps& maps, Pipeline pipeline,
                             bool grouped_grid, const SplitPartials& parts, cudaStream_t stream) {
  static_assert(Cfg::kWarpgroups == 3, "the 192-row pipelines run three consumer warpgroups");
  auto launch = [&](auto* kernel) {
    launch_ws_kernel<Cfg>(kernel, p, maps, grouped_grid, parts, stream);
  };
  switch (pipeline) {
    case Pipeline::tma_ws_m192:
      launch(&sm90_ws_forward_kernel<T, Cfg, false, false, kTransformed>);
      break;
    case Pipeline::tma_ws_overlap_m192:
      launch(&sm90_ws_forward_kernel<T, Cfg, true, false, kTransformed>);
      break;
    case Pipeline::tma_ping_pong_m192:
      launch(&sm90_ws_forward_kernel<T, Cfg, true, true, kTransformed>);
      break;
    default:
      throw Error(ErrorKind::runtime, "cuda_sm90: a 128-row pipeline reached the 192-row launcher");
  }
  check_launch("cuda_sm90 forward kernel (192 rows)");
}

// What a call runs: the pipeline, whether on the head dim's 192-row configuration (step
// 4.7), its TMA maps, and its key split (step 4.10).
struct Sm90Call {
  Pipeline pipeline = Pipeline::cp_async;
  bool block_m192 = false;
  TmaMaps maps{};
  SplitPlan split;
};

// FLASHTILE_SM90_SPLITS=N pins the key splits of the pipelines that split_keys() (1: never
// split); the others always run unsplit.
inline constexpr const char* kPinSm90Splits = "FLASHTILE_SM90_SPLITS";


// The fastest measured pipeline that serves p (TMA needs encodable maps: dense calls),
// unless `pinned` names one (the journey's measurements and the tests of each step), and its
// key split. Cfg is the head dim's traits: its 128-row configuration, and Cfg::BlockM192 the
// 192-row one of step 4.7 where the head dim has one (void elsewhere).
// Split-KV (4.10): a call whose blocks cannot fill the GPU splits its keys on the
// warp-specialised pipelines; an unpinned persistent choice (4.6: full calls at d=256 from
// 4k and at d=128 from 1k to 2k, windows at d=64 and 256) then takes the one-block kernel on
// the same consumers, which splits (a persistent CTA has one block at most anyway).
template <class Cfg>
Sm90Call plan_sm90_call(const AttentionParams& p, std::optional<Pipeline> pinned) {
  // Dense calls: full and causal ones, and windows, take the head dim's measured choice
  // (traits.cuh).
  const bool window = p.has_mask() && !p.is_causal();
  const Pipeline wanted = pinned ? *pinned
                          : window ? Cfg::kWindowPipeline
                                   : Cfg::dense_pipeline(p);
  Sm90Call call;
  if (uses_block_m192(wanted)) {
    using Wide = typename Cfg::BlockM192;
    if constexpr (std::is_void_v<Wide>) {
      throw Error(ErrorKind::unsupported,
                  "cuda_sm90: the 192-row pipelines (step 4.7) serve head_dim 64; got head_dim " +
                      std::to_string(p.head_dim));
    } else {
      if (encode_dense_maps(p, Wide::kBlockM, Wide::kBlockN, call.maps)) {
        call.pipeline = wanted;
        call.block_m192 = true;
        call.split = split_plan(p, split_tile_of<Wide>(), kPinSm90Splits);
        return call;
      }
    }
  }
  const bool tma = !uses_block_m192(wanted) && wanted != Pipeline::cp_async &&
                   encode_dense_maps(p, Cfg::kBlockM, Cfg::kBlockN, call.maps);
  if (pinned && *pinned != Pipeline::cp_async && !tma)
    throw Error(ErrorKind::unsupported, "cuda_sm90: the TMA maps of this call cannot be encoded");
  call.pipeline = tma ? wanted : Pipeline::cp_async;
  const bool may_split = splits_keys(call.pipeline) ||
                         (!pinned && call.pipeline == Pipeline::tma_persistent);
  if (may_split) {
    call.split = split_plan(p, split_tile_of<Cfg>(), kPinSm90Splits);
    if (call.pipeline == Pipeline::tma_persistent && call.split.splits > 1)
      call.pipeline = Cfg::kPersistentPingPong ? Pipeline::tma_ping_pong
                      : Cfg::kPersistentOverlap ? Pipeline::tma_warp_specialized_overlap
                                                : Pipeline::tma_warp_specialized;
    if (!splits_keys(call.pipeline)) call.split.splits = 1;
  }
  return call;
}

template <class T, class Cfg>
void launch_sm90_forward(const AttentionParams& p, cudaStream_t stream,
                         std::optional<Pipeline> pinned = std::nullopt) {
  const Sm90Call call = plan_sm90_call<Cfg>(p, pinned);
  const bool transformed = p.softcap != 0.0f || p.alibi_slopes != nullptr;
  constexpr bool grouped = Cfg::kGroupedMaskedGrid;  // step 4.9, per head dim
#if FLASHTILE_SM90_TIMELINE
  // A slot per consumer warpgroup (at most 3) of every item (64 rows or more, every split).
  auto timeline = TimelineSession::arm((p.seqlen_q + 63) / 64 * p.heads_q * p.batch *
                                           (call.split.splits > 1 ? call.split.splits : 1) * 3,
                                       stream);
#endif
  run_split_forward(p, call.split, stream, [&](const SplitPartials& parts) {
    if (call.block_m192) {
      using Wide = typename Cfg::BlockM192;
      if constexpr (!std::is_void_v<Wide>) {
        if (transformed)
          launch_sm90_m192_kernel<T, Wide, true>(p, call.maps, call.pipeline, grouped, parts, stream);
        else
          launch_sm90_m192_kernel<T, Wide, false>(p, call.maps, call.pipeline, grouped, parts, stream);
      }
      return;
    }
    if (transformed)
      launch_sm90_kernel<T, Cfg, true>(p, call.maps, call.pipeline, grouped, parts, stream);
    else
      launch_sm90_kernel<T, Cfg, false>(p, call.maps, call.pipeline, grouped, parts, stream);
  });
#if FLASHTILE_SM90_TIMELINE
  auto u32 = [](int64_t x) { return static_cast<uint32_t>(x); };
  uint32_t block_m = Cfg::kBlockM, block_n = Cfg::kBlockN, warpgroups = Cfg::kWarpgroups;
  if constexpr (!std::is_void_v<typename Cfg::BlockM192>) {
    if (call.block_m192) {
      using Wide = typename Cfg::BlockM192;
      block_m = Wide::kBlockM, block_n = Wide::kBlockN, warpgroups = Wide::kWarpgroups;
    }
  }
  TimelineHeader header = {{'F', 'T', 'S', 'M', '9', '0', 'T', '1'},
                           u32(Cfg::kHeadDim), block_m, block_n, warpgroups,
                           u32(static_cast<int>(call.pipeline)),
                           0, u32(p.batch), u32(p.heads_q), u32(p.seqlen_q), u32(p.seqlen_k),
                           u32(p.is_causal() ? 1 : 0), 0};
  timeline.write(header);
#endif
}

}  // namespace flashtile::detail::sm90
