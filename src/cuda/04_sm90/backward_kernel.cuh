// Journey step 4b — the cuda_sm90 backward: FlashAttention-2's algorithm (the cuda_mma
// backward's, 03_mma/backward_kernel.cuh; formulas in docs/BACKWARD.md) on Hopper's
// warpgroup MMA, sm_90a only. Step 4b.1: wgmma with cp.async loads (4b.5: the next step's
// loads waited for before this step's dQ adds are issued).
//
// The pre-pass (D, the sinks' partials), the dQ post-pass and the workspace are the cuda_mma
// backward's (03_mma/backward_passes.cuh); this is the main pass. One CTA per (key block of
// kBlockN = 128 keys, kv head, batch entry), two consumer warpgroups of 64 keys each, both
// computing (no producer yet). K and V stay in shared memory, each warpgroup's dK and dV
// (64 keys x d, fp32) in its registers. The CTA walks the query heads of its kv head's group
// and, per head, the query blocks query_blocks() names; per (query block of kBlockM rows):
//   Sᵀ = K·Qᵀ, dPᵀ − D = V·dOᵀ − D   wgmma ss (K-major K, V as A; Q, dO as B), M = 64 keys
//   Pᵀ, dSᵀ                          registers (probability_and_ds, the shared per-score op)
//   dV += Pᵀ·dO, dK += dSᵀ·Q         wgmma rs: Pᵀ, dSᵀ packed from the accumulators as A,
//                                    dO and Q read MN-major (the forward's P·V form)
//   dQ (kBlockM x d) = dS·K          wgmma ss with both operands MN-major: dSᵀ as the
//                                    warpgroups wrote it to shared memory, K as it lies; one
//                                    64 x 64 tile per warpgroup, added to the fp32
//                                    accumulator by 8-byte reductions (or in key-block order)
// The next step's Q and dO tiles are in flight (cp.async, double-buffered) during each step.
// Tiles use the forward's K-major 128-byte-swizzle layout (kernel.cuh's header); dSᵀ is a
// (kBlockN keys, kBlockM rows) tile of it, whose rows are keys.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/03_mma/backward_passes.cuh"
#include "cuda/04_sm90/kernel.cuh"

namespace flashtile::detail::sm90 {

// One backward configuration: head dim kHeadDim (64 or 128; whole swizzle blocks) and
// kBlockM query rows a step.
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

// The runtime-logits kernel's tag (softcap and ALiBi read per call; its own type so its
// symbols stay apart from cuda_mma's).
struct Sm90BackwardRuntimeLogits : RuntimeLogitsTag {};

template <class T, class Cfg, class Logits>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    sm90_backward_kernel(const BackwardParams bp, const mma::BackwardScratch ws) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  constexpr float kLog2e = 1.4426950408889634f;
  using MmaS = ptx::Wgmma<T, kBlockM>;         // Sᵀ, dPᵀ (64 keys, kBlockM rows)
  using MmaKV = ptx::Wgmma<T, Cfg::kHeadDim>;  // dV, dK (64 keys, d)
  using MmaQ = ptx::Wgmma<T, 64>;              // a dQ tile (64 rows, 64 columns)
  const AttentionParams& p = bp.fwd;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = ptx::smem_addr(smem_raw);
  const uint32_t base = atom_aligned(raw);
  unsigned char* const base_ptr = smem_raw + (base - raw);
  const uint32_t smem_k = base + Cfg::kKOffset, smem_v = base + Cfg::kVOffset;
  const uint32_t smem_ds = base + Cfg::kDsOffset;
  float* const smem_lse = reinterpret_cast<float*>(base_ptr + Cfg::kLseOffset);  // (2, kBlockM)
  float* const smem_d = reinterpret_cast<float*>(base_ptr + Cfg::kDOffset);      // (2, kBlockM)

  const FragmentCoords frag;
  const int t = frag.lane % 4;
  const int wg = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  const int wg_key0 = wg * kWarpgroupRows;  // this warpgroup's keys inside the block
  const int64_t hk = blockIdx.y, b = blockIdx.z;
  const int group = static_cast<int>(p.heads_per_kv());
  const SeqlenInfo<int> seq(p, b);
  const int key0 = static_cast<int>(blockIdx.x) * kBlockN;
  if (key0 >= seq.seqlen_k) return;  // varlen: past this sequence's keys (zeroed before)
  const Mask<int> mask = seq.mask(p);
  const int key_end = min(key0 + kBlockN, seq.seqlen_k);
  // A partial key block holds zero-filled keys past seqlen_k: the mask removes them.
  const bool partial_keys = key_end - key0 < kBlockN;
  const QueryBlocks<int> blocks = query_blocks(mask, key0, key_end, kBlockM);
  const int n_blocks = blocks.count();
  const int steps = group * n_blocks;  // (query head of the group, query block) pairs

  load_tile_async<Cfg, kBlockN>(smem_k, static_cast<const T*>(p.k) + seq.k_offset(p, b, key0, hk),
                                p.k_row_stride, seq.seqlen_k - key0);
  load_tile_async<Cfg, kBlockN>(smem_v, static_cast<const T*>(p.v) + seq.v_offset(p, b, key0, hk),
                                p.v_row_stride, seq.seqlen_k - key0);

  // Step s is query head `head_of(s)` and query block `block_of(s)`.
  auto head_of = [&](int s) { return hk * group + s / n_blocks; };
  auto block_of = [&](int s) { return blocks.begin + s % n_blocks; };
  // Issues step s's Q and dO tiles into stage s % 2 and returns its lse·log2e and D for
  // this thread's row (threads < kBlockM), which the caller stores once the stage is free.
  // Rows past seqlen_q, and rows that see nothing (lse = −inf), get lse = +inf: P = 0.
  auto issue_step = [&](int s, float& lse_log2, float& d_row) {
    lse_log2 = INFINITY, d_row = 0.0f;
    if (s >= steps) return;
    const int64_t h = head_of(s);
    const int row0 = block_of(s) * kBlockM;
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

  float dk[Cfg::kDRegs], dv[Cfg::kDRegs];
#pragma unroll
  for (int r = 0; r < Cfg::kDRegs; ++r) dk[r] = dv[r] = 0.0f;
  const float scale_log2 = p.scale * kLog2e;
  const int dq_row_tile = wg % Cfg::kDqRowTiles, dq_col_tile = wg / Cfg::kDqRowTiles;
  // This thread's two keys (rows g and g + 8 of its warp's 16 in the warpgroup's 64).
  const int key_lo = wg_key0 + frag.row(0), key_hi = wg_key0 + frag.row(1);

  for (int s = 0; s < steps; ++s) {
    // Stage (s+1) % 2 is free: its last reads (step s-1's products and row stats) ended
    // before step s-1's closing barrier.
    float next_lse_log2, next_d;
    issue_step(s + 1, next_lse_log2, next_d);
    ptx::cp_async_commit();

    const int64_t h = head_of(s);
    const int m_block = block_of(s);
    const int row0 = m_block * kBlockM;
    const int stage = s % 2;
    const uint32_t smem_q = base + Cfg::kQOffset + stage * Cfg::kRowTileBytes;
    const uint32_t smem_do = base + Cfg::kDoOffset + stage * Cfg::kRowTileBytes;
    const float* lse_row = smem_lse + stage * kBlockM;
    const float* d_row = smem_d + stage * kBlockM;
    const LogitsTransform<float> logits = logits_transform<float>(p, b, h);

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
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Cfg::kQKSteps; ++ks)
      MmaS::ss(st, k_major_descriptor<kBlockN>(smem_k, wg_key0, ks),
               k_major_descriptor<kBlockM>(smem_q, 0, ks), ks > 0);
#pragma unroll
    for (int ks = 0; ks < Cfg::kQKSteps; ++ks)
      MmaS::ss(dpt, k_major_descriptor<kBlockN>(smem_v, wg_key0, ks),
               k_major_descriptor<kBlockM>(smem_do, 0, ks), true);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    fence_registers(st);
    fence_registers(dpt);

    // Pᵀ and dSᵀ in place of Sᵀ and dPᵀ; two copies behind one uniform branch, so that the
    // unmasked one (every step off the mask's edges) has no test per score.
    auto probabilities_and_ds = [&](auto masked_tag) {
      constexpr bool kMasked = decltype(masked_tag)::value;
#pragma unroll
      for (int c = 0; c < kBlockM / 8; ++c) {
        const float2 lse2 = *reinterpret_cast<const float2*>(lse_row + 8 * c + 2 * t);
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int r = 4 * c + 2 * half + e;
            mma::probability_and_ds<Logits, kMasked>(
                logits, mask, scale_log2, e == 0 ? lse2.x : lse2.y, row0 + 8 * c + 2 * t + e,
                key0 + (half == 0 ? key_lo : key_hi), st[r], dpt[r]);
          }
      }
    };
    if (partial_keys || blocks.needs_mask(m_block))
      probabilities_and_ds(std::true_type{});
    else
      probabilities_and_ds(std::false_type{});

    // Pᵀ and dSᵀ as 16-bit A fragments, k-step kk = query rows 16kk..; dSᵀ also to shared
    // memory for dQ (4-byte stores, one swizzled chunk a quad: conflict-free).
    uint32_t pa[Cfg::kRowSteps][4], dsa[Cfg::kRowSteps][4];
#pragma unroll
    for (int kk = 0; kk < Cfg::kRowSteps; ++kk) {
      pack_a_operand<T>(pa[kk], st, kk);
      pack_a_operand<T>(dsa[kk], dpt, kk);
      auto store = [&](int key, int chunk, uint32_t value) {
        *reinterpret_cast<uint32_t*>(base_ptr + Cfg::kDsOffset +
                                     swizzled_offset<kBlockN>(key, chunk) + 4 * t) = value;
      };
      store(key_lo, 2 * kk, dsa[kk][0]);
      store(key_hi, 2 * kk, dsa[kk][1]);
      store(key_lo, 2 * kk + 1, dsa[kk][2]);
      store(key_hi, 2 * kk + 1, dsa[kk][3]);
    }
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kRowSteps; ++kk)
      MmaKV::rs(dv, pa[kk], mn_major_descriptor<kBlockM>(smem_do, kk), true);
#pragma unroll
    for (int kk = 0; kk < Cfg::kRowSteps; ++kk)
      MmaKV::rs(dk, dsa[kk], mn_major_descriptor<kBlockM>(smem_q, kk), true);
    ptx::wgmma_commit();

    ptx::fence_proxy_async_shared();  // this thread's dSᵀ stores, visible to wgmma ...
    __syncthreads();                  // ... and both warpgroups' keys written

    // dQ tile (64 rows of dq_row_tile, 64 columns of dq_col_tile) = dS·K over the block's
    // keys: A from dSᵀ's swizzle block dq_row_tile, B from K's block dq_col_tile.
    float dq[32];
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kKeySteps; ++kk)
      MmaQ::ss_mn_major(dq,
                        mn_major_descriptor<kBlockN>(
                            smem_ds + dq_row_tile * kBlockN * kSwizzleBytes, kk),
                        mn_major_descriptor<kBlockN>(
                            smem_k + dq_col_tile * kBlockN * kSwizzleBytes, kk),
                        kk > 0);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();  // dV, dK and dQ have landed
    fence_registers(dq);
    fence_registers(dv);
    fence_registers(dk);
    // Step s+1's tiles and row stats are made ready before the dQ adds are issued, so that
    // the fence's wait for this thread's memory operations does not include the adds.
    stage_row_stats(s + 1, next_lse_log2, next_d);
    ptx::cp_async_wait<0>();          // step s+1's tiles have landed for this thread,
    ptx::fence_proxy_async_shared();  // are visible to wgmma (and every thread, after the
                                      // closing barrier)

    int* const counter = mma::wait_for_dq_turn(bp, ws, seq, mask, b, h, m_block, kBlockM,
                                               kBlockN);  // null unless deterministic
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + dq_row_tile * 64 + frag.row(half);
      if (row < seq.seqlen_q) {
        float* const at = ws.dq + seq.row_offset_q(ws.dq_strides, b, row, h) +
                          dq_col_tile * 64 + 2 * t;
#pragma unroll
        for (int c = 0; c < 8; ++c)
          mma::atomic_add_pair(at + 8 * c, make_float2(dq[4 * c + 2 * half], dq[4 * c + 2 * half + 1]));
      }
    }
    mma::pass_dq_turn(bp, counter);
    __syncthreads();  // step s+1's tiles ready for every thread; stage s and dSᵀ are free
  }

  // Epilogue: dK and dV to 16-bit over K's and V's tiles (free: every wgmma that read them
  // was waited for before the last barrier), then 16-byte rows out.
  ptx::cp_async_wait<0>();
#pragma unroll
  for (int c = 0; c < Cfg::kHeadDim / 8; ++c)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t at = swizzled_offset<kBlockN>(half == 0 ? key_lo : key_hi, c) + 4 * t;
      *reinterpret_cast<uint32_t*>(base_ptr + Cfg::kKOffset + at) =
          ptx::pack2<T>(dk[4 * c + 2 * half], dk[4 * c + 2 * half + 1]);
      *reinterpret_cast<uint32_t*>(base_ptr + Cfg::kVOffset + at) =
          ptx::pack2<T>(dv[4 * c + 2 * half], dv[4 * c + 2 * half + 1]);
    }
  __syncthreads();
  for (int id = static_cast<int>(threadIdx.x); id < kBlockN * Cfg::kRowChunks; id += Cfg::kThreads) {
    const int local_key = id / Cfg::kRowChunks, chunk = id % Cfg::kRowChunks;
    const int key = key0 + local_key;
    if (key >= seq.seqlen_k) break;  // ids grow with the key
    const uint32_t at = swizzled_offset<kBlockN>(local_key, chunk);
    T* dk_row = static_cast<T*>(bp.dk) + seq.row_offset_k(bp.dk_strides, b, key, hk);
    T* dv_row = static_cast<T*>(bp.dv) + seq.row_offset_k(bp.dv_strides, b, key, hk);
    *reinterpret_cast<uint4*>(dk_row + chunk * 8) =
        *reinterpret_cast<const uint4*>(base_ptr + Cfg::kKOffset + at);
    *reinterpret_cast<uint4*>(dv_row + chunk * 8) =
        *reinterpret_cast<const uint4*>(base_ptr + Cfg::kVOffset + at);
  }
}

template <class T, class Cfg, class Logits>
void launch_sm90_backward_main(const BackwardParams& bp, const mma::BackwardScratch& ws,
                               cudaStream_t stream) {
  mma::launch_backward_main<Cfg>(&sm90_backward_kernel<T, Cfg, Logits>, "sm90_backward_kernel",
                                 bp, ws, stream);
}

// The whole backward for one configuration (bp validated: head dim kHeadDim exactly, rows
// 16-byte aligned), the workspace at `workspace`. Plain logits take their own kernel (the
// scale folded into the exp2); softcap and ALiBi one kernel that reads them per call.
template <class T, class Cfg>
void run_sm90_backward_passes(const BackwardParams& bp, void* workspace, cudaStream_t stream) {
  mma::run_backward_passes<T>(bp, workspace, stream, Cfg::kHeadDim, Cfg::kBlockM,
                              [&](const mma::BackwardScratch& ws) {
                                if (bp.fwd.softcap == 0.0f && bp.fwd.alibi_slopes == nullptr)
                                  launch_sm90_backward_main<T, Cfg, LogitsFlags<false, false>>(
                                      bp, ws, stream);
                                else
                                  launch_sm90_backward_main<T, Cfg, Sm90BackwardRuntimeLogits>(
                                      bp, ws, stream);
                              });
}

// The configuration of each head dim (the backward serves 64 and 128 exactly):
//  d=128: 64 query rows a step (Sᵀ, dPᵀ 32 registers each beside dK and dV's 64 each;
//         145 KB of shared memory);
//  d=64: 128 rows a step (Sᵀ, dPᵀ 64 each, dK and dV 32 each; 130 KB), FlashAttention-2's
//         d=64 tile as cuda_mma's backward takes it.
template <int kHeadDim>
struct Sm90BackwardTraits;
template <>
struct Sm90BackwardTraits<64> : Sm90BackwardConfig<64, 128> {};
template <>
struct Sm90BackwardTraits<128> : Sm90BackwardConfig<128, 64> {};

template <class T, int kHeadDim>
void run_sm90_backward(const BackwardParams& bp, void* workspace, cudaStream_t stream) {
  run_sm90_backward_passes<T, Sm90BackwardTraits<kHeadDim>>(bp, workspace, stream);
}

// Instantiated once per head dim in backward_hdim<D>.cu and nowhere else.
#define FLASHTILE_SM90_BACKWARD_INSTANTIATIONS(prefix, D)                                       \
  prefix template void run_sm90_backward<__half, D>(const BackwardParams&, void*, cudaStream_t); \
  prefix template void run_sm90_backward<__nv_bfloat16, D>(const BackwardParams&, void*,         \
                                                           cudaStream_t);
FLASHTILE_SM90_BACKWARD_INSTANTIATIONS(extern, 64)
FLASHTILE_SM90_BACKWARD_INSTANTIATIONS(extern, 128)

}  // namespace flashtile::detail::sm90
