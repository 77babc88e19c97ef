// Journey step 4b — the cuda_sm90 backward: FlashAttention-2's algorithm (the cuda_mma
// backward's, 03_mma/backward_kernel.cuh; formulas in docs/BACKWARD.md) on Hopper's
// warpgroup MMA, sm_90a only. Two main kernels, one per step of the journey still measured:
//  - 4b.5 (sm90_backward_kernel): wgmma with cp.async loads, every thread computing (the
//    next step's loads waited for before this step's dQ adds are issued); varlen calls, and
//    calls pinned with FLASHTILE_SM90_BACKWARD_PIPELINE=cp_async;
//  - 4b.6 (sm90_ws_backward_kernel): warp specialisation. A producer warpgroup (setmaxnreg
//    down) beside the two consumers: its warp 0 loads Q, dO (TMA) and the row stats into a
//    two-stage ring of mbarriers, its warp 1 adds the consumers' staged dQ tiles to the fp32
//    accumulator by the copy engine (tensor-map reductions). The consumers meet once a step,
//    when both have written dSᵀ; dense calls, under a mask in the grouped heaviest-first
//    order of the grid (backward_grid_item).
//
// The pre-pass (D, the sinks' partials), the dQ post-pass and the workspace are the cuda_mma
// backward's (03_mma/backward_passes.cuh). One CTA per (key block of kBlockN = 128 keys, kv
// head, batch entry), two consumer warpgroups of 64 keys each. K and V stay in shared memory,
// each warpgroup's dK and dV (64 keys x d, fp32) in its registers. The CTA walks the query
// heads of its kv head's group and, per head, the query blocks query_blocks() names; per
// (query block of kBlockM rows), in BackwardWarpgroup:
//   Sᵀ = K·Qᵀ, dPᵀ − D = V·dOᵀ − D   wgmma ss (K-major K, V as A; Q, dO as B), M = 64 keys
//   Pᵀ, dSᵀ                          registers (probability and ds, the shared per-score ops;
//                                    Pᵀ under dPᵀ's GEMM, dSᵀ under dV's at d=128)
//   dV += Pᵀ·dO, dK += dSᵀ·Q         wgmma rs: Pᵀ, dSᵀ packed from the accumulators as A,
//                                    dO and Q read MN-major (the forward's P·V form)
//   dQ (kBlockM x d) = dS·K          wgmma ss with both operands MN-major: dSᵀ as the
//                                    warpgroups wrote it to shared memory, K as it lies; one
//                                    64 x 64 tile per warpgroup, added to the fp32
//                                    accumulator (in key-block order when deterministic)
// Tiles use the forward's K-major 128-byte-swizzle layout (kernel.cuh's header); dSᵀ is a
// (kBlockN keys, kBlockM rows) tile of it, whose rows are keys.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/03_mma/backward_passes.cuh"
#include "cuda/04_sm90/kernel.cuh"
#include "cuda/04_sm90/tensor_map.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/tma.cuh"

namespace flashtile::detail::sm90 {

// One backward configuration: head dim kHeadDim (64 or 128; whole swizzle blocks) and
// kBlockM query rows a step. The offsets are 4b.5's shared memory.
template <int kHeadDim_, int kBlockM_>
struct Sm90BackwardConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kWarpgroups = 2;
  static constexpr int kBlockN = kWarpgroupRows * kWarpgroups;  // keys a CTA, 64 a warpgroup
  static constexpr int kThreads = kWarpgroupThreads * kWarpgroups;
  static constexpr int kRowChunks = kHeadDim / 8;  // 16-byte chunks a row (load_tile_async)
  static constexpr int kQKSteps = kHeadDim / 16;   // k-steps of K·Qᵀ and V·dOᵀ
  static constexpr int kRowSteps = kBlockM / 16;   // k-steps of Pᵀ·dO and dSᵀ·Q
  static constexpr int kKeySteps = kBlockN / 16;   // k-steps of dS·K
  static constexpr int kSRegs = kBlockM / 2;       // Sᵀ, dPᵀ: (64 keys, kBlockM rows)
  static constexpr int kDRegs = kHeadDim / 2;      // dK, dV: (64 keys, d)
  // dQ's 64 x 64 tiles, one a warpgroup: d=128 (64-row steps) splits the columns, d=64
  // (128-row steps) the rows.
  static constexpr int kDqRowTiles = kBlockM / 64;
  static constexpr int kDqColTiles = kHeadDim / 64;
  // dSᵀ computed under dV's GEMM, whose Pᵀ operand then stays live beside Sᵀ, dPᵀ and dSᵀ:
  // at d=64 (128-row steps, 32 more registers of Pᵀ) that spills, so there dV is waited for.
  static constexpr bool kDsUnderDv = kHeadDim > 64;

  static constexpr int kKeyTileBytes = kBlockN * kHeadDim * 2;
  static constexpr int kRowTileBytes = kBlockM * kHeadDim * 2;
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;
  // [ K | V | Q stage 0, 1 | dO stage 0, 1 | dSᵀ | lse·log2e stage 0, 1 | D stage 0, 1 ]
  // from the first 1024-aligned address (the slack is counted in kSmemBytes).
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKeyTileBytes;
  static constexpr int kQOffset = 2 * kKeyTileBytes;
  static constexpr int kDoOffset = kQOffset + 2 * kRowTileBytes;
  static constexpr int kDsOffset = kDoOffset + 2 * kRowTileBytes;
  static constexpr int kLseOffset = kDsOffset + kDsBytes;
  static constexpr int kDOffset = kLseOffset + 2 * kBlockM * 4;
  static constexpr int kSmemBytes = kDOffset + 2 * kBlockM * 4 + kAtomBytes;

  static_assert(kHeadDim % kSwizzleCols == 0 && kHeadDim <= 128,
                "backward head dim: whole swizzle blocks, <= 128 (dK and dV live in registers)");
  static_assert(kBlockM % 64 == 0 && kBlockM <= 128, "query rows: whole 64-row dQ tiles");
  static_assert(kDqRowTiles * kDqColTiles == kWarpgroups, "one dQ tile a warpgroup");
  static_assert(kThreads >= kBlockM, "one thread stages each query row's lse and D");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory of one CTA");
};

// 4b.6's CTA: a producer warpgroup before the two consumers, and its shared memory
//   [ K | V | Q stage 0, 1 | dO stage 0, 1 | dSᵀ buffer 0, 1 | dQ staging of warpgroup 0, 1 |
//     lse·log2e stage 0, 1 | D stage 0, 1 | barriers ]
// dSᵀ is double-buffered so that a warpgroup may write step s+1's while the other's dQ GEMM
// still reads step s's. A warpgroup's dQ tile is staged as the accumulator's map loads a box:
// two boxes of 32 fp32 columns, 64 rows of 128 bytes in the 128-byte swizzle.
template <class Cfg>
struct Sm90WsBackwardConfig : Cfg {
  static constexpr int kConsumerThreads = Cfg::kThreads;
  static constexpr int kThreads = Cfg::kThreads + kWarpgroupThreads;
  static constexpr int kDqBoxCols = 32;
  static constexpr int kDqStageBytes = 64 * 64 * 4;
  static constexpr int kDqStageOffset = Cfg::kDsOffset + 2 * Cfg::kDsBytes;
  static constexpr int kLseOffset = kDqStageOffset + Cfg::kWarpgroups * kDqStageBytes;
  static constexpr int kDOffset = kLseOffset + 2 * Cfg::kBlockM * 4;
  // Barriers: K and V landed; Q, dO and row stats landed (per stage); stage free (per stage).
  static constexpr int kBarrierOffset = kDOffset + 2 * Cfg::kBlockM * 4;
  static constexpr int kSmemBytes = kBarrierOffset + 8 * 5 + kAtomBytes;
  static_assert(kSmemBytes <= kSmemLimit, "shared memory of one CTA");
};

// The runtime-logits kernels' tag (softcap and ALiBi read per call; its own type so its
// symbols stay apart from cuda_mma's).
struct Sm90BackwardRuntimeLogits : RuntimeLogitsTag {};

// One consumer warpgroup's part of a step, 64 keys of the block against kBlockM query rows:
// the math both main kernels run. Its dK and dV live in its registers across the steps.
template <class T, class Cfg, class Logits>
struct BackwardWarpgroup {
  static constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  using MmaS = ptx::Wgmma<T, kBlockM>;         // Sᵀ, dPᵀ (64 keys, kBlockM rows)
  using MmaKV = ptx::Wgmma<T, Cfg::kHeadDim>;  // dV, dK (64 keys, d)
  using MmaQ = ptx::Wgmma<T, 64>;              // a dQ tile (64 rows, 64 columns)

  const FragmentCoords frag;
  const int t;
  // This thread's two keys (rows g and g + 8 of its warp's 16 in the warpgroup's 64).
  const int key_lo, key_hi;
  const int dq_row_tile, dq_col_tile;
  float dk[Cfg::kDRegs], dv[Cfg::kDRegs];
  // Pᵀ and dSᵀ as 16-bit A fragments (k-step kk = query rows 16kk..), read by the dV and
  // dK GEMMs until dq_tile() waits for them; the dQ tile.
  uint32_t pa[Cfg::kRowSteps][4], dsa[Cfg::kRowSteps][4];
  float dq[32];

  __device__ __forceinline__ explicit BackwardWarpgroup(int wg)
      : t(frag.lane % 4),
        key_lo(wg * kWarpgroupRows + frag.row(0)),
        key_hi(wg * kWarpgroupRows + frag.row(1)),
        dq_row_tile(wg % Cfg::kDqRowTiles),
        dq_col_tile(wg / Cfg::kDqRowTiles) {
#pragma unroll
    for (int r = 0; r < Cfg::kDRegs; ++r) dk[r] = dv[r] = 0.0f;
  }

  // Sᵀ and dPᵀ, then Pᵀ and dSᵀ in registers, dSᵀ stored into `ds_tile` (generic address
  // of a (kBlockN, kBlockM) tile), and dV += Pᵀ·dO, dK += dSᵀ·Q issued (not waited for).
  // lse_row / d_row: the step's lse·log2e and D by query row; masked: the mask is evaluated.
  __device__ __forceinline__ void scores_and_grads(uint32_t smem_k, uint32_t smem_v,
                                                   uint32_t smem_q, uint32_t smem_do,
                                                   const float* lse_row, const float* d_row,
                                                   unsigned char* ds_tile,
                                                   const LogitsTransform<float>& logits,
                                                   const Mask<int>& mask, float scale_log2,
                                                   int row0, int key0, bool masked) {
    const int wg_key0 = key_lo - frag.row(0);
    // Sᵀ = K·Qᵀ and dPᵀ − D = V·dOᵀ − D, raw scores; the dPᵀ accumulator starts at −D of
    // its column's row, so dS needs no D. Register 4c + 2·half + e is key row(half), query
    // row 8c + 2t + e of the block.
    float st[Cfg::kSRegs], dpt[Cfg::kSRegs];
#pragma unroll
    for (int c = 0; c < kBlockM / 8; ++c) {
      const float2 dd = *reinterpret_cast<const float2*>(d_row + 8 * c + 2 * t);
      dpt[4 * c] = dpt[4 * c + 2] = -dd.x;
      dpt[4 * c + 1] = dpt[4 * c + 3] = -dd.y;
    }
    // The row's lse·log2e by chunk c: at d=128 (8 chunks) read into registers here, before
    // the GEMMs, so that Pᵀ's first exp2s do not wait on shared memory; d=64's 16 would spill,
    // so it reads them as it goes.
    constexpr bool kLseAhead = kBlockM / 8 <= 8;
    float2 lse_ahead[kLseAhead ? kBlockM / 8 : 1];
    if constexpr (kLseAhead) {
#pragma unroll
      for (int c = 0; c < kBlockM / 8; ++c)
        lse_ahead[c] = *reinterpret_cast<const float2*>(lse_row + 8 * c + 2 * t);
    }
    auto lse_of_chunk = [&](int c) {
      if constexpr (kLseAhead) return lse_ahead[c];
      return *reinterpret_cast<const float2*>(lse_row + 8 * c + 2 * t);
    };
    // Pinned before the fence: otherwise the copies of −D into dPᵀ's duplicate registers
    // sink past it, and ptxas serialises the two GEMMs (warpgroup.wait injected, C7517).
    fence_registers(dpt);
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Cfg::kQKSteps; ++ks)
      MmaS::ss(st, k_major_descriptor<kBlockN>(smem_k, wg_key0, ks),
               k_major_descriptor<kBlockM>(smem_q, 0, ks), ks > 0);
    ptx::wgmma_commit();
#pragma unroll
    for (int ks = 0; ks < Cfg::kQKSteps; ++ks)
      MmaS::ss(dpt, k_major_descriptor<kBlockN>(smem_v, wg_key0, ks),
               k_major_descriptor<kBlockM>(smem_do, 0, ks), true);
    ptx::wgmma_commit();
    ptx::wgmma_wait<1>();  // Sᵀ has landed; dPᵀ's GEMM runs on under Pᵀ's exp2s
    fence_registers(st);

    // Pᵀ packed as dV's A operand, k-step by k-step; Sᵀ's registers keep what dSᵀ needs of
    // it. Two copies behind one uniform branch, so that the unmasked one (every step off the
    // mask's edges) has no test per score.
    auto probabilities = [&](auto masked_tag) {
      constexpr bool kMasked = decltype(masked_tag)::value;
#pragma unroll
      for (int kk = 0; kk < Cfg::kRowSteps; ++kk) {
        float prob[8];
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int c = 2 * kk + cc;
          const float2 lse2 = lse_of_chunk(c);
#pragma unroll
          for (int half = 0; half < 2; ++half)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              prob[4 * cc + 2 * half + e] = mma::probability<Logits, kMasked>(
                  logits, mask, scale_log2, e == 0 ? lse2.x : lse2.y, row0 + 8 * c + 2 * t + e,
                  key0 + (half == 0 ? key_lo : key_hi), st[4 * c + 2 * half + e]);
        }
        pack_a_operand<T>(pa[kk], prob, 0);
      }
    };
    if (masked)
      probabilities(std::true_type{});
    else
      probabilities(std::false_type{});
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kRowSteps; ++kk)
      MmaKV::rs(dv, pa[kk], mn_major_descriptor<kBlockM>(smem_do, kk), true);
    ptx::wgmma_commit();
    ptx::wgmma_wait<Cfg::kDsUnderDv ? 1 : 0>();  // dPᵀ has landed (and dV, unless it runs on)
    fence_registers(dpt);

    // dSᵀ, packed as dK's A operand and stored to shared memory for dQ (4-byte stores, one
    // swizzled chunk a quad: conflict-free).
#pragma unroll
    for (int kk = 0; kk < Cfg::kRowSteps; ++kk) {
#pragma unroll
      for (int r = 8 * kk; r < 8 * kk + 8; ++r) dpt[r] = mma::ds<Logits>(logits, st[r], dpt[r]);
      pack_a_operand<T>(dsa[kk], dpt, kk);
      auto store = [&](int key, int chunk, uint32_t value) {
        *reinterpret_cast<uint32_t*>(ds_tile + swizzled_offset<kBlockN>(key, chunk) + 4 * t) =
            value;
      };
      store(key_lo, 2 * kk, dsa[kk][0]);
      store(key_hi, 2 * kk, dsa[kk][1]);
      store(key_lo, 2 * kk + 1, dsa[kk][2]);
      store(key_hi, 2 * kk + 1, dsa[kk][3]);
    }
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kRowSteps; ++kk)
      MmaKV::rs(dk, dsa[kk], mn_major_descriptor<kBlockM>(smem_q, kk), true);
    ptx::wgmma_commit();
  }

  // This warpgroup's dQ tile (64 rows of dq_row_tile, 64 columns of dq_col_tile) = dS·K
  // over the block's keys, from both warpgroups' dSᵀ at smem_ds (A: its swizzle block
  // dq_row_tile) and K (B: its block dq_col_tile); on return dV, dK and dQ have landed.
  __device__ __forceinline__ void dq_tile(uint32_t smem_ds, uint32_t smem_k) {
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kKeySteps; ++kk)
      MmaQ::ss_mn_major(
          dq, mn_major_descriptor<kBlockN>(smem_ds + dq_row_tile * kBlockN * kSwizzleBytes, kk),
          mn_major_descriptor<kBlockN>(smem_k + dq_col_tile * kBlockN * kSwizzleBytes, kk),
          kk > 0);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    fence_registers(dq);
    fence_registers(dv);
    fence_registers(dk);
  }

  // 4b.5: the dQ tile added to the accumulator by the threads' 8-byte reductions (register
  // pair 4c + 2·half is row(half), columns 8c + 2t, +1).
  __device__ __forceinline__ void add_dq(const mma::BackwardScratch& ws, const SeqlenInfo<int>& seq,
                                         int64_t b, int64_t h, int row0) const {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + dq_row_tile * 64 + frag.row(half);
      if (row < seq.seqlen_q) {
        float* const at = ws.dq + seq.row_offset_q(ws.dq_strides, b, row, h) +
                          dq_col_tile * 64 + 2 * t;
#pragma unroll
        for (int c = 0; c < 8; ++c)
          mma::atomic_add_pair(at + 8 * c,
                               make_float2(dq[4 * c + 2 * half], dq[4 * c + 2 * half + 1]));
      }
    }
  }

  // 4b.6: the dQ tile into this warpgroup's staging (generic address), as the accumulator's
  // map lays out its two boxes (8-byte stores). The swizzle puts rows g and g ^ 1 on the same
  // pair of chunks, so that a half-warp's stores of one column group would meet twice in each
  // bank: odd rows store column group c ^ 2 when even rows store c.
  __device__ __forceinline__ void stage_dq(unsigned char* stage) const {
    const bool odd_row = (frag.row(0) & 1) != 0;
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int cs = odd_row ? c ^ 2 : c;
        const float2 value =
            odd_row ? make_float2(dq[4 * (c ^ 2) + 2 * half], dq[4 * (c ^ 2) + 2 * half + 1])
                    : make_float2(dq[4 * c + 2 * half], dq[4 * c + 2 * half + 1]);
        *reinterpret_cast<float2*>(stage + swizzled_offset<64>(frag.row(half), 2 * cs + t / 2) +
                                   8 * (t % 2)) = value;
      }
  }

  // dK and dV to 16-bit over K's and V's tiles (the caller makes sure no GEMM still reads
  // them).
  __device__ __forceinline__ void stage_dk_dv(unsigned char* k_tile, unsigned char* v_tile) const {
#pragma unroll
    for (int c = 0; c < Cfg::kHeadDim / 8; ++c)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t at = swizzled_offset<kBlockN>(half == 0 ? key_lo : key_hi, c) + 4 * t;
        *reinterpret_cast<uint32_t*>(k_tile + at) =
            ptx::pack2<T>(dk[4 * c + 2 * half], dk[4 * c + 2 * half + 1]);
        *reinterpret_cast<uint32_t*>(v_tile + at) =
            ptx::pack2<T>(dv[4 * c + 2 * half], dv[4 * c + 2 * half + 1]);
      }
  }
};

// The staged dK and dV tiles out to global memory in 16-byte rows, by `threads` threads
// (this one is `thread`), keys past seqlen_k skipped.
template <class T, class Cfg>
__device__ __forceinline__ void store_dk_dv(const BackwardParams& bp, const SeqlenInfo<int>& seq,
                                            int64_t b, int64_t hk, int key0,
                                            const unsigned char* k_tile,
                                            const unsigned char* v_tile, int thread, int threads) {
  for (int id = thread; id < Cfg::kBlockN * Cfg::kRowChunks; id += threads) {
    const int local_key = id / Cfg::kRowChunks, chunk = id % Cfg::kRowChunks;
    const int key = key0 + local_key;
    if (key >= seq.seqlen_k) break;  // ids grow with the key
    const uint32_t at = swizzled_offset<Cfg::kBlockN>(local_key, chunk);
    T* dk_row = static_cast<T*>(bp.dk) + seq.row_offset_k(bp.dk_strides, b, key, hk);
    T* dv_row = static_cast<T*>(bp.dv) + seq.row_offset_k(bp.dv_strides, b, key, hk);
    *reinterpret_cast<uint4*>(dk_row + chunk * 8) = *reinterpret_cast<const uint4*>(k_tile + at);
    *reinterpret_cast<uint4*>(dv_row + chunk * 8) = *reinterpret_cast<const uint4*>(v_tile + at);
  }
}

// The (query head, query block) steps of the CTA's key block: step s is query head
// head(s) of the kv head's group and query block block(s).
struct BackwardSteps {
  QueryBlocks<int> blocks;
  int n_blocks, count;
  int64_t first_head;
  __device__ __forceinline__ BackwardSteps(const QueryBlocks<int>& query, int group, int64_t hk)
      : blocks(query), n_blocks(query.count()), count(group * query.count()),
        first_head(hk * group) {}
  __device__ __forceinline__ int64_t head(int s) const { return first_head + s / n_blocks; }
  __device__ __forceinline__ int block(int s) const { return blocks.begin + s % n_blocks; }
};

// ---- 4b.5: every thread computes, cp.async loads -----------------------------------------

template <class T, class Cfg, class Logits>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    sm90_backward_kernel(const BackwardParams bp, const mma::BackwardScratch ws) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  constexpr float kLog2e = 1.4426950408889634f;
  const AttentionParams& p = bp.fwd;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = ptx::smem_addr(smem_raw);
  const uint32_t base = atom_aligned(raw);
  unsigned char* const base_ptr = smem_raw + (base - raw);
  const uint32_t smem_k = base + Cfg::kKOffset, smem_v = base + Cfg::kVOffset;
  float* const smem_lse = reinterpret_cast<float*>(base_ptr + Cfg::kLseOffset);  // (2, kBlockM)
  float* const smem_d = reinterpret_cast<float*>(base_ptr + Cfg::kDOffset);      // (2, kBlockM)

  const int64_t hk = blockIdx.y, b = blockIdx.z;
  const SeqlenInfo<int> seq(p, b);
  const int key0 = static_cast<int>(blockIdx.x) * kBlockN;
  if (key0 >= seq.seqlen_k) return;  // varlen: past this sequence's keys (zeroed before)
  const Mask<int> mask = seq.mask(p);
  const int key_end = min(key0 + kBlockN, seq.seqlen_k);
  // A partial key block holds zero-filled keys past seqlen_k: the mask removes them.
  const bool partial_keys = key_end - key0 < kBlockN;
  const BackwardSteps steps(query_blocks(mask, key0, key_end, kBlockM),
                            static_cast<int>(p.heads_per_kv()), hk);

  load_tile_async<Cfg, kBlockN>(smem_k, static_cast<const T*>(p.k) + seq.k_offset(p, b, key0, hk),
                                p.k_row_stride, seq.seqlen_k - key0);
  load_tile_async<Cfg, kBlockN>(smem_v, static_cast<const T*>(p.v) + seq.v_offset(p, b, key0, hk),
                                p.v_row_stride, seq.seqlen_k - key0);

  // Issues step s's Q and dO tiles into stage s % 2 and returns its lse·log2e and D for
  // this thread's row (threads < kBlockM), which the caller stores once the stage is free.
  // Rows past seqlen_q, and rows that see nothing (lse = −inf), get lse = +inf: P = 0.
  auto issue_step = [&](int s, float& lse_log2, float& d_row) {
    lse_log2 = INFINITY, d_row = 0.0f;
    if (s >= steps.count) return;
    const int64_t h = steps.head(s);
    const int row0 = steps.block(s) * kBlockM;
    const int stage = s % 2;
    load_tile_async<Cfg, kBlockM>(base + Cfg::kQOffset + stage * Cfg::kRowTileBytes,
                                  static_cast<const T*>(p.q) + seq.q_offset(p, b, row0, h),
                                  p.q_row_stride, seq.seqlen_q - row0);
    load_tile_async<Cfg, kBlockM>(
        base + Cfg::kDoOffset + stage * Cfg::kRowTileBytes,
        static_cast<const T*>(bp.dout) + seq.row_offset_q(bp.dout_strides, b, row0, h),
        bp.dout_strides.row, seq.seqlen_q - row0);
    mma::fetch_row_stats(bp, ws, seq, b, h, row0, kBlockM, lse_log2, d_row);
  };
  auto stage_row_stats = [&](int s, float lse_log2, float d_row) {
    mma::stage_row_stats(smem_lse, smem_d, kBlockM, s, lse_log2, d_row);
  };
  {
    float lse_log2, d_row;
    issue_step(0, lse_log2, d_row);
    stage_row_stats(0, lse_log2, d_row);
  }
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();           // K, V and step 0's tiles have landed for this thread,
  ptx::fence_proxy_async_shared();   // are visible to wgmma,
  __syncthreads();                   // and are so for every thread, as are the row stats

  const int wg_index = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  BackwardWarpgroup<T, Cfg, Logits> wg(wg_index);
  const float scale_log2 = p.scale * kLog2e;

  for (int s = 0; s < steps.count; ++s) {
    // Stage (s+1) % 2 is free: its last reads (step s-1's products and row stats) ended
    // before step s-1's closing barrier.
    float next_lse_log2, next_d;
    issue_step(s + 1, next_lse_log2, next_d);
    ptx::cp_async_commit();

    const int64_t h = steps.head(s);
    const int m_block = steps.block(s);
    const int row0 = m_block * kBlockM;
    const int stage = s % 2;
    wg.scores_and_grads(smem_k, smem_v, base + Cfg::kQOffset + stage * Cfg::kRowTileBytes,
                        base + Cfg::kDoOffset + stage * Cfg::kRowTileBytes,
                        smem_lse + stage * kBlockM, smem_d + stage * kBlockM,
                        base_ptr + Cfg::kDsOffset, logits_transform<float>(p, b, h), mask,
                        scale_log2, row0, key0, partial_keys || steps.blocks.needs_mask(m_block));
    ptx::fence_proxy_async_shared();  // this thread's dSᵀ stores, visible to wgmma ...
    __syncthreads();                  // ... and both warpgroups' keys written
    wg.dq_tile(base + Cfg::kDsOffset, smem_k);
    // Step s+1's tiles and row stats are made ready before the dQ adds are issued, so that
    // the fence's wait for this thread's memory operations does not include the adds.
    stage_row_stats(s + 1, next_lse_log2, next_d);
    ptx::cp_async_wait<0>();          // step s+1's tiles have landed for this thread,
    ptx::fence_proxy_async_shared();  // are visible to wgmma (and every thread, after the
                                      // closing barrier)
    int* const counter = mma::wait_for_dq_turn(bp, ws, seq, mask, b, h, m_block, kBlockM,
                                               kBlockN);  // null unless deterministic
    wg.add_dq(ws, seq, b, h, row0);
    mma::pass_dq_turn(bp, counter);
    __syncthreads();  // step s+1's tiles ready for every thread; stage s and dSᵀ are free
  }

  // Epilogue: K's and V's tiles are free (every wgmma that read them was waited for before
  // the last barrier).
  ptx::cp_async_wait<0>();
  wg.stage_dk_dv(base_ptr + Cfg::kKOffset, base_ptr + Cfg::kVOffset);
  __syncthreads();
  store_dk_dv<T, Cfg>(bp, seq, b, hk, key0, base_ptr + Cfg::kKOffset, base_ptr + Cfg::kVOffset,
                      static_cast<int>(threadIdx.x), Cfg::kThreads);
}

// ---- 4b.6: warp specialisation -------------------------------------------------------------

// The tensor maps of 4b.6 (a __grid_constant__ parameter): q and dout in boxes of kBlockM
// rows, k and v of kBlockN, and the fp32 dQ accumulator as (head dim, rows, heads, batch)
// in 64-row boxes of kDqBoxCols columns.
struct BackwardMaps {
  CUtensorMap q, k, v, dout, dq;
};

// The (batch entry, kv head, key block) of a 4b.6 CTA: the grid's (z, y, x), or under a mask
// the forward's grouped heaviest-first order (JOURNEY 4.9), so that the causal grid does not
// end on its last heads' heaviest blocks. Key blocks weigh in the reverse order of query
// blocks: wherever the last rows see the most keys, the first keys are seen by the most rows
// (causal). Deterministic calls keep the grid's order: a key block waits for the lower ones'
// dQ adds, which must have started before it.
__device__ __forceinline__ WorkItem backward_grid_item(const AttentionParams& p,
                                                       int heads_per_group) {
  const int x = static_cast<int>(blockIdx.x), blocks = static_cast<int>(gridDim.x);
  const int y = static_cast<int>(blockIdx.y), heads = static_cast<int>(gridDim.y);
  if (heads_per_group <= 1) return WorkItem{static_cast<int>(blockIdx.z), y, x};
  WorkItem w = grouped_heaviest_first_item(x + blocks * (y + heads * static_cast<int>(blockIdx.z)),
                                           heads, heads * static_cast<int>(gridDim.z), blocks,
                                           heads_per_group, p.window_left, p.window_right);
  w.m_block = blocks - 1 - w.m_block;
  return w;
}

// Named barriers of the warp-specialised kernel (0 is __syncthreads).
inline constexpr int kDsWrittenBarrier = 1;  // both consumers: dSᵀ of the step is whole
inline constexpr int kDqFullBarrier = 2;     // consumers arrive, the dQ warp waits: staged
inline constexpr int kDqEmptyBarrier = 3;    // the dQ warp arrives, consumers wait: read out
inline constexpr int kEpilogueBarrier = 4;   // both consumers, around dK and dV's staging

// Who arrives on the mbarriers, per phase:
//   kv        : the producer's expect_tx (1 arrival) and K's and V's TMA bytes;
//   full[i]   : the producer warp's 32 lanes, once their row stats are stored, and the TMA
//               bytes of Q and dO (announced by lane 0 before it issues them);
//   empty[i]  : every consumer thread, once its GEMMs of the step have read stage i's tiles
//               (and it has read the row stats, generic loads that each thread releases).
// Steps use the stages as RingSlot<2> counts them (tile_schedule.hpp).
template <class T, class Cfg, class Logits>
__global__ void __launch_bounds__(Sm90WsBackwardConfig<Cfg>::kThreads, 1)
    sm90_ws_backward_kernel(const BackwardParams bp, const mma::BackwardScratch ws,
                            const __grid_constant__ BackwardMaps maps, int heads_per_group) {
  using Ws = Sm90WsBackwardConfig<Cfg>;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr int kDqThreads = Ws::kConsumerThreads + 32;  // the consumers and the dQ warp
  static_assert(kRegisterSplitFits<Cfg>, "the register split fits the multiprocessor's 64K registers");
  const AttentionParams& p = bp.fwd;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = ptx::smem_addr(smem_raw);
  const uint32_t base = atom_aligned(raw);
  unsigned char* const base_ptr = smem_raw + (base - raw);
  float* const smem_lse = reinterpret_cast<float*>(base_ptr + Ws::kLseOffset);  // (2, kBlockM)
  float* const smem_d = reinterpret_cast<float*>(base_ptr + Ws::kDOffset);      // (2, kBlockM)
  const uint32_t kv_full = base + Ws::kBarrierOffset;
  auto full = [&](int stage) { return kv_full + 8 * (1 + stage); };
  auto empty = [&](int stage) { return kv_full + 8 * (3 + stage); };

  const WorkItem item = backward_grid_item(p, heads_per_group);
  const int64_t hk = item.head, b = item.batch;
  const int n_block = item.m_block;
  const SeqlenInfo<int> seq(p, b);
  const int key0 = n_block * kBlockN;
  const Mask<int> mask = seq.mask(p);
  const int key_end = min(key0 + kBlockN, seq.seqlen_k);
  const BackwardSteps steps(query_blocks(mask, key0, key_end, kBlockM),
                            static_cast<int>(p.heads_per_kv()), hk);

  if (threadIdx.x == 0) {
    ptx::mbarrier_init(kv_full, 1);
    for (int stage = 0; stage < 2; ++stage) {
      ptx::mbarrier_init(full(stage), 32);
      ptx::mbarrier_init(empty(stage), Ws::kConsumerThreads);
    }
    ptx::mbarrier_init_fence();
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them

  const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<kProducerRegisters>();
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    if (warp == 0) {  // the loads: K and V once, then each step's Q, dO and row stats
      if (lane == 0) {
        ptx::mbarrier_arrive_expect_tx(kv_full, 2 * Cfg::kKeyTileBytes);
        tma_load_tile<Cfg>(base + Cfg::kKOffset, &maps.k, kv_full, kBlockN, key0, hk, b);
        tma_load_tile<Cfg>(base + Cfg::kVOffset, &maps.v, kv_full, kBlockN, key0, hk, b);
      }
      for (int s = 0; s < steps.count; ++s) {
        const RingSlot<2> ring{static_cast<uint32_t>(s)};
        const int stage = ring.slot();
        if (ring.reused()) ptx::mbarrier_wait(empty(stage), ring.released_parity());
        const int64_t h = steps.head(s);
        const int row0 = steps.block(s) * kBlockM;
        if (lane == 0) {
          ptx::mbarrier_expect_tx(full(stage), 2 * Cfg::kRowTileBytes);
          tma_load_tile<Cfg>(base + Cfg::kQOffset + stage * Cfg::kRowTileBytes, &maps.q,
                             full(stage), kBlockM, row0, h, b);
          tma_load_tile<Cfg>(base + Cfg::kDoOffset + stage * Cfg::kRowTileBytes, &maps.dout,
                             full(stage), kBlockM, row0, h, b);
        }
        for (int i = lane; i < kBlockM; i += 32) {
          float lse_log2 = INFINITY, d_row = 0.0f;
          mma::row_stats(bp, ws, seq, b, h, row0 + i, lse_log2, d_row);
          smem_lse[stage * kBlockM + i] = lse_log2;
          smem_d[stage * kBlockM + i] = d_row;
        }
        ptx::mbarrier_arrive(full(stage));
      }
    } else if (warp == 1) {  // the dQ adds: both staged tiles, two boxes each, per step
      for (int s = 0; s < steps.count; ++s) {
        ptx::named_barrier_sync(kDqFullBarrier, kDqThreads);
        if (lane == 0) {
          const int64_t h = steps.head(s);
          const int m_block = steps.block(s);
          mma::DqTurn turn{};
          if (bp.deterministic) {
            turn = mma::dq_turn(bp, ws, seq, mask, b, h, m_block, n_block, kBlockM, kBlockN);
            turn.wait();
            ptx::fence_proxy_async_global();  // the earlier blocks' adds, before ours
          }
#pragma unroll
          for (int wg = 0; wg < Cfg::kWarpgroups; ++wg)
#pragma unroll
            for (int box = 0; box < 64 / Ws::kDqBoxCols; ++box)
              ptx::tma_reduce_add_4d(
                  &maps.dq,
                  base + Ws::kDqStageOffset + wg * Ws::kDqStageBytes + box * 64 * kSwizzleBytes,
                  (wg / Cfg::kDqRowTiles) * 64 + box * Ws::kDqBoxCols,
                  m_block * kBlockM + (wg % Cfg::kDqRowTiles) * 64, static_cast<int>(h),
                  static_cast<int>(b));
          ptx::bulk_commit_group();
          if (bp.deterministic) {  // the adds are performed before the next key block's turn
            ptx::bulk_wait_group<0>();
            ptx::fence_proxy_async_global();
            mma::pass_turn(turn.counter);
          } else {
            ptx::bulk_wait_group_read<0>();  // the staging may be written again
          }
        }
        __syncwarp();
        if (s + 1 < steps.count) ptx::named_barrier_arrive(kDqEmptyBarrier, kDqThreads);
      }
      if (lane == 0) ptx::bulk_wait_group<0>();
    }
    return;
  }

  ptx::setmaxnreg_inc<kConsumerRegisters<Cfg>>();
  const int wg_index = warpgroup - 1;
  BackwardWarpgroup<T, Cfg, Logits> wg(wg_index);
  const float scale_log2 = p.scale * kLog2e;
  const bool partial_keys = key_end - key0 < kBlockN;  // keys past seqlen_k: masked
  const uint32_t smem_k = base + Cfg::kKOffset, smem_v = base + Cfg::kVOffset;
  ptx::mbarrier_wait(kv_full, 0);
  for (int s = 0; s < steps.count; ++s) {
    const RingSlot<2> ring{static_cast<uint32_t>(s)};
    const int stage = ring.slot();
    const int64_t h = steps.head(s);
    const int m_block = steps.block(s);
    const int ds_offset = Cfg::kDsOffset + (s % 2) * Cfg::kDsBytes;
    ptx::mbarrier_wait(full(stage), ring.full_parity());
    wg.scores_and_grads(smem_k, smem_v, base + Cfg::kQOffset + stage * Cfg::kRowTileBytes,
                        base + Cfg::kDoOffset + stage * Cfg::kRowTileBytes,
                        smem_lse + stage * kBlockM, smem_d + stage * kBlockM,
                        base_ptr + ds_offset, logits_transform<float>(p, b, h), mask,
                        scale_log2, m_block * kBlockM, key0,
                        partial_keys || steps.blocks.needs_mask(m_block));
    ptx::fence_proxy_async_shared();  // this thread's dSᵀ stores, visible to wgmma ...
    ptx::named_barrier_sync(kDsWrittenBarrier, Ws::kConsumerThreads);  // ... both written
    wg.dq_tile(base + ds_offset, smem_k);
    ptx::mbarrier_arrive(empty(stage));  // each thread: its reads of the row stats, released
    if (s > 0) ptx::named_barrier_sync(kDqEmptyBarrier, kDqThreads);
    wg.stage_dq(base_ptr + Ws::kDqStageOffset + wg_index * Ws::kDqStageBytes);
    ptx::fence_proxy_async_shared();  // visible to the copy engine
    ptx::named_barrier_arrive(kDqFullBarrier, kDqThreads);
  }

  // Epilogue: once both consumers' last dQ GEMMs have read K, dK and dV over K's and V's
  // tiles, then out.
  ptx::named_barrier_sync(kEpilogueBarrier, Ws::kConsumerThreads);
  wg.stage_dk_dv(base_ptr + Cfg::kKOffset, base_ptr + Cfg::kVOffset);
  ptx::named_barrier_sync(kEpilogueBarrier, Ws::kConsumerThreads);
  store_dk_dv<T, Cfg>(bp, seq, b, hk, key0, base_ptr + Cfg::kKOffset, base_ptr + Cfg::kVOffset,
                      static_cast<int>(threadIdx.x) - kWarpgroupThreads, Ws::kConsumerThreads);
}

// The maps of a dense call; false for varlen (past a sequence's end the boxes would hold
// the next one's rows) or when the driver refuses one.
template <class Cfg>
bool encode_backward_maps(const BackwardParams& bp, const mma::BackwardScratch& ws,
                          BackwardMaps& maps) {
  const AttentionParams& p = bp.fwd;
  if (p.is_varlen()) return false;
  return encode_bshd_map(maps.q, p.dtype, p.q, p.head_dim, p.seqlen_q, p.heads_q, p.batch,
                         p.q_row_stride, p.q_head_stride, p.q_batch_stride, Cfg::kBlockM) &&
         encode_bshd_map(maps.k, p.dtype, p.k, p.head_dim, p.seqlen_k, p.heads_kv, p.batch,
                         p.k_row_stride, p.k_head_stride, p.k_batch_stride, Cfg::kBlockN) &&
         encode_bshd_map(maps.v, p.dtype, p.v, p.head_dim, p.seqlen_k, p.heads_kv, p.batch,
                         p.v_row_stride, p.v_head_stride, p.v_batch_stride, Cfg::kBlockN) &&
         encode_bshd_map(maps.dout, p.dtype, bp.dout, p.head_dim, p.seqlen_q, p.heads_q, p.batch,
                         bp.dout_strides.row, bp.dout_strides.head, bp.dout_strides.batch,
                         Cfg::kBlockM) &&
         encode_4d_map(maps.dq, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, ws.dq,
                       {Cfg::kHeadDim, p.seqlen_q, p.heads_q, p.batch},
                       {ws.dq_strides.row, ws.dq_strides.head, ws.dq_strides.batch},
                       Sm90WsBackwardConfig<Cfg>::kDqBoxCols, 64);
}

// The main kernel of a call: 4b.6 where its maps encode, unless pinned to 4b.5's cp_async
// (which varlen calls always take).
template <class T, class Cfg, class Logits>
void launch_sm90_backward_main(const BackwardParams& bp, const mma::BackwardScratch& ws,
                               bool pinned_cp_async, cudaStream_t stream) {
  BackwardMaps maps;
  if (!pinned_cp_async && encode_backward_maps<Cfg>(bp, ws, maps)) {
    using Ws = Sm90WsBackwardConfig<Cfg>;
    auto* const kernel = &sm90_ws_backward_kernel<T, Cfg, Logits>;
    set_smem_limit(kernel, Ws::kSmemBytes, bp.fwd.device_index);  // before the occupancy query
    const int heads_per_group =
        ws_heads_per_group(bp.fwd, !bp.deterministic, kernel, Ws::kThreads, Ws::kSmemBytes,
                           mma::backward_grid<Ws>(bp.fwd));
    mma::launch_backward_main<Ws>(kernel, "sm90_ws_backward_kernel", bp, ws, stream, maps,
                                  heads_per_group);
  } else
    mma::launch_backward_main<Cfg>(&sm90_backward_kernel<T, Cfg, Logits>, "sm90_backward_kernel",
                                   bp, ws, stream);
}

// The whole backward for one configuration (bp validated: head dim kHeadDim exactly, rows
// 16-byte aligned), the workspace at `workspace`. Plain logits take their own kernel (the
// scale folded into the exp2); softcap and ALiBi one kernel that reads them per call.
template <class T, class Cfg>
void run_sm90_backward_passes(const BackwardParams& bp, void* workspace, bool pinned_cp_async,
                              cudaStream_t stream) {
  mma::run_backward_passes<T>(bp, workspace, stream, Cfg::kHeadDim, Cfg::kBlockM,
                              [&](const mma::BackwardScratch& ws) {
                                if (bp.fwd.softcap == 0.0f && bp.fwd.alibi_slopes == nullptr)
                                  launch_sm90_backward_main<T, Cfg, LogitsFlags<false, false>>(
                                      bp, ws, pinned_cp_async, stream);
                                else
                                  launch_sm90_backward_main<T, Cfg, Sm90BackwardRuntimeLogits>(
                                      bp, ws, pinned_cp_async, stream);
                              });
}

// The configuration of each head dim (the backward serves 64 and 128 exactly):
//  d=128: 64 query rows a step (Sᵀ, dPᵀ 32 registers each beside dK and dV's 64 each;
//         145 KB of shared memory for 4b.5, 194 KB for 4b.6);
//  d=64: 128 rows a step (Sᵀ, dPᵀ 64 each, dK and dV 32 each; 130 / 194 KB),
//        FlashAttention-2's d=64 tile as cuda_mma's backward takes it.
template <int kHeadDim>
struct Sm90BackwardTraits;
template <>
struct Sm90BackwardTraits<64> : Sm90BackwardConfig<64, 128> {};
template <>
struct Sm90BackwardTraits<128> : Sm90BackwardConfig<128, 64> {};

template <class T, int kHeadDim>
void run_sm90_backward(const BackwardParams& bp, void* workspace, bool pinned_cp_async,
                       cudaStream_t stream) {
  run_sm90_backward_passes<T, Sm90BackwardTraits<kHeadDim>>(bp, workspace, pinned_cp_async,
                                                            stream);
}

// Instantiated once per head dim in backward_hdim<D>.cu and nowhere else.
#define FLASHTILE_SM90_BACKWARD_INSTANTIATIONS(prefix, D)                                     \
  prefix template void run_sm90_backward<__half, D>(const BackwardParams&, void*, bool,       \
                                                    cudaStream_t);                            \
  prefix template void run_sm90_backward<__nv_bfloat16, D>(const BackwardParams&, void*, bool, \
                                                           cudaStream_t);
FLASHTILE_SM90_BACKWARD_INSTANTIATIONS(extern, 64)
FLASHTILE_SM90_BACKWARD_INSTANTIATIONS(extern, 128)

}  // namespace flashtile::detail::sm90
