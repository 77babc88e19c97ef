// cpu_flash's backward pass: FlashAttention-2's algorithm tiled for the CPU, in O(N·d)
// memory. P is never stored: each (query block, key block) pair recomputes it from the
// saved LSE,
//   P = exp(S - lse),  dP = dO·Vᵀ,  dS = P∘(dP - D)∘∂c/∂(q·k),
// with D = rowsum(dO∘O) from a pre-pass (minus the LSE's gradient when given) and the
// softcap's chain rule (docs/BACKWARD.md).
//
// Every pass is parallel with OpenMP over work that owns its outputs, so no atomics and no
// reduction whose order depends on the threads: the gradients are bitwise the same for any
// thread count and run, deterministic by construction (options.deterministic is always
// honoured).
//   1. Packing: every query block (q, dO, LSE and D) and key block (K, Kᵀ, Vᵀ) to fp32, once.
//   2. The fused schedule, when there are at least as many (sequence, kv head) pairs as
//      threads: one task per pair walks its key blocks in order; for each, the query heads of
//      the group and the query blocks that see those keys (key_blocks() of each query block
//      says which, and whether the mask is needed), accumulating dV += Pᵀ·dO and
//      dK += dSᵀ·Q for the key block and dQ += dS·K in fp32 accumulators for the whole
//      sequence (FlashAttention-2's loop; 5 block products per pair).
//   2'. Otherwise the wavefront schedule: one OpenMP task per key block and run of
//      kWaveBlocks query blocks, the same 5 products per pair,
//      into fp32 accumulators per key block (dK, dV) and per query block (dQ); task
//      dependences on the two accumulators keep each one's additions in the fused loop's
//      order, so pairs of different key and query blocks run at once. (It replaced a split
//      schedule, dK/dV per key block then dQ per query block recomputing S and dP: 7
//      products per pair; the wavefront measured 1.27-1.49x less CPU time at 2 threads,
//      B=1 H=1 N=4096.)
// Both do every accumulator's additions in the same order with the same operations: they
// give the same bits. The sinks' gradient is summed per query block and then in block order.
//
// Tiles are fp32 (f16/bf16 converted once per tile load), K and V also transposed so that
// every block product is a plain row-major matrix product; the products and the
// element-wise steps are Highway SIMD kernels (flash_backward_kernels-inl.hpp, one copy per
// target, chosen at run time). Every mask bound, offset and LSE index comes from src/attn/.
#include "cpu/flash_backward.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <vector>

#include "attn/block_range.hpp"
#include "attn/features.hpp"
#include "attn/seqlen.hpp"
#include "attn/variant.hpp"
#include "common/numeric.hpp"
#include "hwy/aligned_allocator.h"

namespace flashtile::detail::cpu_flash_backward {
#if FLASHTILE_WITH_HWY
namespace {

using Seqlen = SeqlenInfo<int64_t>;

// Query rows per dQ task and keys per dK/dV task (and per step of either pass).
constexpr int64_t kBlockM = 64;
constexpr int64_t kBlockN = 64;
// The SIMD kernels take tile rows of whole vectors: up to 16 floats (AVX-512).
static_assert(kBlockN % 16 == 0, "a key block must be whole vectors on every target");
// Query blocks per task of the wavefront schedule (one dQ dependence token per such run).
constexpr int64_t kWaveBlocks = 4;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// n values of `dtype` from element `offset` of `data` into dst as fp32.
void load_row(const void* data, DType dtype, int64_t offset, int64_t n, float* dst) {
  if (dtype == DType::f32) {
    const float* src = static_cast<const float*>(data) + offset;
    for (int64_t c = 0; c < n; ++c) dst[c] = src[c];
    return;
  }
  for (int64_t c = 0; c < n; ++c) dst[c] = load_as_float(data, dtype, offset + c);
}
// Asks for the cache lines of n values of `dtype` from element `offset` of `data`: the
// packing reads rows a head's row stride apart (2 KiB in BSHD at H=8 d=64), which the
// hardware prefetchers do not follow, so each row's lines used to come from DRAM one miss
// at a time (load_row was 7% of a call at N=2048 d=64 causal).
void prefetch_row(const void* data, DType dtype, int64_t offset, int64_t n) {
  const int64_t bytes = dtype == DType::f32 ? 4 : 2;
  const char* begin = static_cast<const char*>(data) + offset * bytes;
  const char* end = begin + n * bytes;
  for (const char* line = begin; line < end; line += 64) __builtin_prefetch(line, 0, 3);
}
constexpr int64_t kPrefetchRows = 4;  // rows ahead

void store_row(void* data, DType dtype, int64_t offset, int64_t n, const float* src) {
  if (dtype == DType::f32) {  // a plain copy the compiler vectorises (no switch per element)
    float* dst = static_cast<float*>(data) + offset;
    for (int64_t c = 0; c < n; ++c) dst[c] = src[c];
    return;
  }
  for (int64_t c = 0; c < n; ++c) store_from_float(data, dtype, offset + c, src[c]);
}

int64_t blocks_of(int64_t n, int64_t block) { return ceil_div<int64_t>(n, block); }

// The fp32 workspace of a call (the packed blocks and the fused schedule's dQ accumulators),
// kept by the calling thread for its next call up to kKeptFloats: a fresh one per call
// faulted its 24-48 MiB in page by page at N=2048, 3-9% of a call on the dev VM (measured
// with glibc told to keep freed memory). Not zeroed: every user of it writes it first.
constexpr size_t kKeptFloats = size_t(256) << 20 >> 2;  // 256 MiB
class Workspace {
 public:
  explicit Workspace(size_t floats) {
    thread_local hwy::AlignedFreeUniquePtr<float[]> kept;
    thread_local size_t kept_floats = 0;
    if (floats <= kept_floats) {
      base_ = kept.get();
    } else if (floats <= kKeptFloats) {
      kept = hwy::AllocateAligned<float>(floats);
      kept_floats = floats;
      base_ = kept.get();
    } else {
      own_ = hwy::AllocateAligned<float>(floats);
      base_ = own_.get();
    }
    if (base_ == nullptr) throw std::bad_alloc();
  }
  float* take(int64_t floats) {  // 64-byte aligned slices, in order
    float* slice = base_ + used_;
    used_ += rounded(floats);
    return slice;
  }
  static size_t rounded(int64_t floats) { return (size_t(floats) + 15) / 16 * 16; }

 private:
  float* base_ = nullptr;
  size_t used_ = 0;
  hwy::AlignedFreeUniquePtr<float[]> own_;
};

// Every block's inputs converted to fp32 once, before the passes (what pass 2 and pass 3
// would otherwise each convert again for every pair): O(N·d) memory. dp is head_dim
// rounded up to whole vectors; padding rows and channels are 0. The buffers are slices of
// the Workspace, not zero-filled first (pack_queries and pack_keys write every float,
// padding included): a memset of them all cost ~1.5% of a call at N=2048.
struct Packed {
  int64_t d = 0, dp = 0;
  std::vector<int64_t> q_base, k_base;  // per sequence: index of its first query / key block
  int64_t q_blocks = 0, k_blocks = 0;   // over every sequence
  float *q = nullptr, *dout = nullptr;  // [heads_q][q_blocks][kBlockM][dp]
  float *lse = nullptr, *row_sums = nullptr;  // [heads_q][q_blocks][kBlockM]; lse +inf: P = 0
  float* k = nullptr;                   // [heads_kv][k_blocks][kBlockN][dp]
  float *k_t = nullptr, *v_t = nullptr;  // [heads_kv][k_blocks][d][kBlockN]

  Packed(const AttentionParams& p, int64_t lanes) : d(p.head_dim), dp(ceil_div(d, lanes) * lanes) {
    for (int64_t b = 0; b < p.batch; ++b) {
      const Seqlen seq(p, b);
      q_base.push_back(q_blocks);
      k_base.push_back(k_blocks);
      q_blocks += blocks_of(seq.seqlen_q, kBlockM);
      k_blocks += blocks_of(seq.seqlen_k, kBlockN);
    }
  }
  static int64_t floats(const AttentionParams& p, int64_t lanes) {
    Packed shape(p, lanes);
    return p.heads_q * shape.q_blocks * kBlockM * (2 * shape.dp + 2) +
           p.heads_kv * shape.k_blocks * kBlockN * (shape.dp + 2 * shape.d);
  }
  int64_t q_floats(const AttentionParams& p) const { return p.heads_q * q_blocks * kBlockM * dp; }
  // The floats of the slices allocate() takes, then `extra` more (dq_all).
  size_t workspace_floats(const AttentionParams& p, int64_t extra) const {
    const int64_t rows = p.heads_q * q_blocks * kBlockM;
    const int64_t ks = p.heads_kv * k_blocks * kBlockN * dp, kt = p.heads_kv * k_blocks * kBlockN * d;
    size_t n = 0;
    for (int64_t s : {q_floats(p), q_floats(p), rows, rows, ks, kt, kt, extra})
      n += Workspace::rounded(s);
    return n;
  }
  void allocate(const AttentionParams& p, Workspace& ws) {
    q = ws.take(q_floats(p));
    dout = ws.take(q_floats(p));
    lse = ws.take(p.heads_q * q_blocks * kBlockM);
    row_sums = ws.take(p.heads_q * q_blocks * kBlockM);
    k = ws.take(p.heads_kv * k_blocks * kBlockN * dp);
    k_t = ws.take(p.heads_kv * k_blocks * kBlockN * d);
    v_t = ws.take(p.heads_kv * k_blocks * kBlockN * d);
  }
  // Index of query block qb of head h of sequence b, and of key block kb of kv head hk.
  int64_t q_block(int64_t b, int64_t h, int64_t qb) const {
    return h * q_blocks + q_base[size_t(b)] + qb;
  }
  int64_t k_block(int64_t b, int64_t hk, int64_t kb) const {
    return hk * k_blocks + k_base[size_t(b)] + kb;
  }

  // Query block qb of head h: q and dO rows, the LSE, and D = dO·O (pass 1, here).
  void pack_queries(const BackwardParams& bp, int64_t b, int64_t h, int64_t qb) {
    const AttentionParams& p = bp.fwd;
    const Seqlen seq(p, b);
    const int64_t n = q_block(b, h, qb), first = qb * kBlockM;
    const int64_t rows = std::min(kBlockM, seq.seqlen_q - first);
    float* qs = &q[size_t(n * kBlockM * dp)];
    float* ds = &dout[size_t(n * kBlockM * dp)];
    float* ls = &lse[size_t(n * kBlockM)];
    float* sums = &row_sums[size_t(n * kBlockM)];
    std::vector<float> o(static_cast<size_t>(d));
    for (int64_t r = 0; r < kBlockM; ++r) {
      ls[r] = std::numeric_limits<float>::infinity();  // padding rows: P = 0
      sums[r] = 0.0f;
      const int64_t from = r < rows ? d : 0;  // padding channels, or the whole padding row
      std::fill(qs + r * dp + from, qs + (r + 1) * dp, 0.0f);
      std::fill(ds + r * dp + from, ds + (r + 1) * dp, 0.0f);
      if (r >= rows) continue;
      const int64_t i = first + r;
      if (r + kPrefetchRows < rows) {
        const int64_t ahead = i + kPrefetchRows;
        prefetch_row(p.q, p.dtype, seq.q_offset(p, b, ahead, h), d);
        prefetch_row(bp.dout, p.dtype, seq.row_offset_q(bp.dout_strides, b, ahead, h), d);
        prefetch_row(p.o, p.dtype, seq.o_offset(p, b, ahead, h), d);
      }
      load_row(p.q, p.dtype, seq.q_offset(p, b, i, h), d, qs + r * dp);
      load_row(bp.dout, p.dtype, seq.row_offset_q(bp.dout_strides, b, i, h), d, ds + r * dp);
      load_row(p.o, p.dtype, seq.o_offset(p, b, i, h), d, o.data());
      // One fused multiply-add per channel in channel order, as the block product forms
      // dP = dO·Vᵀ on FMA targets: where O equals one value row (a row that sees one key),
      // dP - D is then exactly 0, as it is in exact arithmetic.
      float sum = 0.0f;
      for (int64_t c = 0; c < d; ++c) sum = std::fma(ds[r * dp + c], o[c], sum);
      // A gradient g into the LSE adds g·P to dS (∂lse/∂s = P): D' = D - g stands for D
      // here and in the sinks' gradient. Subtracted after the sum, so g = 0 leaves D's bits.
      if (bp.dlse != nullptr) sum -= bp.dlse[seq.lse_index(p, b, h, i)];
      sums[r] = sum;
      const float l = p.lse[seq.lse_index(p, b, h, i)];
      if (l != kNegInf) ls[r] = l;  // a row that sees nothing has P = 0 too
    }
  }

  // Key block kb of kv head hk: K, Kᵀ, Vᵀ.
  void pack_keys(const AttentionParams& p, int64_t b, int64_t hk, int64_t kb) {
    const Seqlen seq(p, b);
    const int64_t n = k_block(b, hk, kb), first = kb * kBlockN;
    const int64_t keys = std::min(kBlockN, seq.seqlen_k - first);
    float* ks = &k[size_t(n * kBlockN * dp)];
    float* kt = &k_t[size_t(n * kBlockN * d)];
    float* vt = &v_t[size_t(n * kBlockN * d)];
    std::vector<float> v_row(static_cast<size_t>(d));
    for (int64_t j = 0; j < kBlockN; ++j)  // padding channels, and rows and columns of keys
      std::fill(ks + j * dp + (j < keys ? d : 0), ks + (j + 1) * dp, 0.0f);
    for (int64_t c = 0; c < d; ++c) {
      std::fill(kt + c * kBlockN + keys, kt + (c + 1) * kBlockN, 0.0f);
      std::fill(vt + c * kBlockN + keys, vt + (c + 1) * kBlockN, 0.0f);
    }
    for (int64_t j = 0; j < keys; ++j) {
      if (j + kPrefetchRows < keys) {
        prefetch_row(p.k, p.dtype, seq.k_offset(p, b, first + j + kPrefetchRows, hk), d);
        prefetch_row(p.v, p.dtype, seq.v_offset(p, b, first + j + kPrefetchRows, hk), d);
      }
      load_row(p.k, p.dtype, seq.k_offset(p, b, first + j, hk), d, ks + j * dp);
      load_row(p.v, p.dtype, seq.v_offset(p, b, first + j, hk), d, v_row.data());
      for (int64_t c = 0; c < d; ++c) {
        kt[c * kBlockN + j] = ks[j * dp + c];
        vt[c * kBlockN + j] = v_row[c];
      }
    }
  }
};

// One (query block, key block) pair: pointers into Packed, and the thread's score tiles.
struct Pair {
  const float *q, *dout, *lse, *row_sums;  // the query block
  const float *k, *k_t, *v_t;              // the key block
  int64_t rows, keys, first_row, first_key;
};

struct Tiles {
  std::vector<float> s, ds, chain;  // [kBlockM × kBlockN]: S then P; dP then dS; ∂c/∂(q·k)
  std::vector<float> acc_a, acc_b;  // [max(kBlockM, kBlockN) × dp]: dK and dV, or dQ
  explicit Tiles(int64_t dp)
      : s(kBlockM * kBlockN), ds(kBlockM * kBlockN), chain(kBlockM * kBlockN),
        acc_a(static_cast<size_t>(std::max(kBlockM, kBlockN) * dp)),
        acc_b(static_cast<size_t>(std::max(kBlockM, kBlockN) * dp)) {}
  static int64_t floats(int64_t dp) {
    return 3 * kBlockM * kBlockN + 2 * std::max(kBlockM, kBlockN) * dp;
  }
};

Pair make_pair(const Packed& pk, const AttentionParams& p, const Seqlen& seq, int64_t b,
               int64_t h, int64_t qb, int64_t kb) {
  const int64_t qn = pk.q_block(b, h, qb), kn = pk.k_block(b, h / p.heads_per_kv(), kb);
  return {&pk.q[size_t(qn * kBlockM * pk.dp)], &pk.dout[size_t(qn * kBlockM * pk.dp)],
          &pk.lse[size_t(qn * kBlockM)], &pk.row_sums[size_t(qn * kBlockM)],
          &pk.k[size_t(kn * kBlockN * pk.dp)], &pk.k_t[size_t(kn * kBlockN * pk.d)],
          &pk.v_t[size_t(kn * kBlockN * pk.d)], std::min(kBlockM, seq.seqlen_q - qb * kBlockM),
          std::min(kBlockN, seq.seqlen_k - kb * kBlockN), qb * kBlockM, kb * kBlockN};
}

// P (in t.s) and dS (in t.ds) of one pair: S = Q·Kᵀ and dP = dO·Vᵀ, the logits of the
// variant (softcap lane-wise, ALiBi and the mask through the shared core), then
// P = exp(S - lse) and dS = P∘(dP - D)∘∂c/∂(q·k). Masked and padding entries get P = 0.
template <class Flags>
void pair_gradients(const Kernels& kern, const Packed& pk, const Mask<int64_t>& mask,
                    const LogitsTransform<float>& logits, bool needs_mask, const Pair& pr,
                    Tiles& t) {
  const int64_t m = pr.rows, d = pk.d;
  kern.gemm(pr.q, pk.dp, pr.k_t, kBlockN, t.s.data(), kBlockN, m, kBlockN, d, false, false);
  kern.gemm(pr.dout, pk.dp, pr.v_t, kBlockN, t.ds.data(), kBlockN, m, kBlockN, d, false, false);
  if constexpr (Flags::kSoftcap)
    kern.softcap(t.s.data(), t.chain.data(), kBlockN, m, kBlockN, logits.scale, logits.softcap,
                 logits.capped_scale);
  // ALiBi's bias is added here (the logits finished here: Probabilities then scales by 1);
  // otherwise Probabilities applies the scale (fused into its exp's argument) and only the
  // masked and padding keys are set here, to -inf, from each row's visible range (Mask's
  // per-row bounds: no per-element test; it was 2% of an N=2048 d=64 causal call).
  const bool mask_here = needs_mask || pr.keys < kBlockN;
  if (Flags::kAlibi || mask_here)
    for (int64_t r = 0; r < m; ++r) {
      float* row = &t.s[size_t(r * kBlockN)];
      const int64_t i = pr.first_row + r;
      int64_t lo = 0, hi = pr.keys;  // block keys [lo, hi) are visible to row i
      if (needs_mask) {
        lo = std::clamp<int64_t>(mask.first_key(i) - pr.first_key, 0, pr.keys);
        hi = std::clamp<int64_t>(mask.key_end(i) - pr.first_key, lo, pr.keys);
      }
      if constexpr (Flags::kAlibi)
        for (int64_t j = lo; j < hi; ++j) {
          if constexpr (!Flags::kSoftcap) row[j] = logits.scaled<false>(row[j]);
          row[j] += logits.alibi_bias(mask, i, pr.first_key + j);
        }
      std::fill(row, row + lo, kNegInf);
      std::fill(row + hi, row + kBlockN, kNegInf);
    }
  kern.probabilities(t.s.data(), t.ds.data(), Flags::kSoftcap ? t.chain.data() : nullptr,
                     kBlockN, m, kBlockN, pr.lse, pr.row_sums,
                     Flags::kSoftcap || Flags::kAlibi ? 1.0f : logits.scale, logits.scale);
}

// Varlen: key rows outside every sequence's used keys have gradient 0 (pass 2 writes only
// the used ones).
void zero_key_gradients(const BackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  const std::vector<float> zeros(size_t(p.head_dim), 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.total_k; ++r)
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      store_row(bp.dk, p.dtype, r * bp.dk_strides.row + hk * bp.dk_strides.head, p.head_dim, zeros.data());
      store_row(bp.dv, p.dtype, r * bp.dv_strides.row + hk * bp.dv_strides.head, p.head_dim, zeros.data());
    }
}

// One pair's share of dV += Pᵀ·dO and dK += dSᵀ·Q (P and dS read transposed) and, with
// dq_acc, of dQ += dS·K: what every schedule does per pair, with the same operations.
template <class Flags>
void pair_step(const Kernels& kern, const Packed& pk, const Mask<int64_t>& mask,
               const LogitsTransform<float>& logits, bool needs_mask, const Pair& pr, Tiles& t,
               float* dk_acc, float* dv_acc, float* dq_acc) {
  pair_gradients<Flags>(kern, pk, mask, logits, needs_mask, pr, t);
  kern.gemm(t.s.data(), kBlockN, pr.dout, pk.dp, dv_acc, pk.dp, pr.keys, pk.dp, pr.rows, true,
            true);
  kern.gemm(t.ds.data(), kBlockN, pr.q, pk.dp, dk_acc, pk.dp, pr.keys, pk.dp, pr.rows, true,
            true);
  if (dq_acc != nullptr)
    kern.gemm(t.ds.data(), kBlockN, pr.k, pk.dp, dq_acc, pk.dp, pr.rows, pk.dp, pr.keys, true,
              false);
}

// Writes dK and dV of key block kb of (sequence b, kv head hk) from its fp32 accumulators.
void store_key_block(const BackwardParams& bp, const Packed& pk, int64_t b, int64_t hk,
                     int64_t kb, const float* dk_acc, const float* dv_acc) {
  const AttentionParams& p = bp.fwd;
  const Seqlen seq(p, b);
  const int64_t first_key = kb * kBlockN, keys = std::min(kBlockN, seq.seqlen_k - first_key);
  for (int64_t j = 0; j < keys; ++j) {  // keys no row sees keep dK = dV = 0
    const int64_t key = first_key + j;
    store_row(bp.dk, p.dtype, seq.row_offset_k(bp.dk_strides, b, key, hk), pk.d, dk_acc + j * pk.dp);
    store_row(bp.dv, p.dtype, seq.row_offset_k(bp.dv_strides, b, key, hk), pk.d, dv_acc + j * pk.dp);
  }
}

// dK and dV of one key block of one (sequence, kv head): every query head of the group and
// every query block that sees these keys. It also adds dS·K to each pair's dQ accumulator
// in dq_all, [heads_q][q_blocks][kBlockM][dp] as Packed.q (the fused schedule).
template <class Flags>
void key_block_gradients(const Kernels& kern, const BackwardParams& bp, const Packed& pk,
                         int64_t b, int64_t hk, int64_t kb, Tiles& t, float* dq_all) {
  const AttentionParams& p = bp.fwd;
  const Seqlen seq(p, b);
  const Mask<int64_t> mask = seq.mask(p);
  float* dk_acc = t.acc_a.data();  // [kBlockN × dp]
  float* dv_acc = t.acc_b.data();  // [kBlockN × dp]
  std::fill(t.acc_a.begin(), t.acc_a.end(), 0.0f);
  std::fill(t.acc_b.begin(), t.acc_b.end(), 0.0f);
  for (int64_t h = hk * p.heads_per_kv(); h < (hk + 1) * p.heads_per_kv(); ++h) {
    const LogitsTransform<float> logits = logits_transform<float>(p, b, h);
    for (int64_t qb = 0; qb < blocks_of(seq.seqlen_q, kBlockM); ++qb) {
      const int64_t i0 = qb * kBlockM, i1 = std::min(seq.seqlen_q, i0 + kBlockM);
      const KeyBlocks<int64_t> blocks = key_blocks(mask, i0, i1, kBlockN);
      if (kb < blocks.begin || kb >= blocks.end) continue;  // no row of this block sees these keys
      const Pair pr = make_pair(pk, p, seq, b, h, qb, kb);
      pair_step<Flags>(kern, pk, mask, logits, blocks.needs_mask(kb), pr, t, dk_acc, dv_acc,
                       dq_all + pk.q_block(b, h, qb) * kBlockM * pk.dp);
    }
  }
  store_key_block(bp, pk, b, hk, kb, dk_acc, dv_acc);
}

// Writes the dQ rows of one query block of one (sequence, query head) from its fp32
// accumulator and returns its rows' share of the sink's gradient, -Σ_i P_sink,i · D'_i.
float finish_query_block(const BackwardParams& bp, const Packed& pk, int64_t b, int64_t h,
                         int64_t qb, const float* dq_acc) {
  const AttentionParams& p = bp.fwd;
  const Seqlen seq(p, b);
  const int64_t i0 = qb * kBlockM, rows = std::min(kBlockM, seq.seqlen_q - i0);
  float dsink = 0.0f;
  const float sink = sink_logit<float>(p, h);
  const float* row_sums = &pk.row_sums[size_t(pk.q_block(b, h, qb) * kBlockM)];
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    store_row(bp.dq, p.dtype, seq.row_offset_q(bp.dq_strides, b, i, h), pk.d, dq_acc + r * pk.dp);
    const float lse = p.lse[seq.lse_index(p, b, h, i)];
    if (p.sinks != nullptr && lse != kNegInf) dsink -= std::exp(sink - lse) * row_sums[r];
  }
  return dsink;
}

// The fused schedule (one task per (sequence, kv head), dQ accumulated beside dK and dV: 5
// block products per pair) when there are at least as many such tasks as threads; else the
// wavefront one: one OpenMP task per key block and run of kWaveBlocks query blocks, the
// same 5 products per pair, ordered by its two
// accumulators (a pair follows the pair before it on its key block's dK/dV, in the fused
// loop's order, and the pair before it on its query block's dQ, key blocks increasing), so
// pairs on different key and query blocks run at once. Both do every accumulator's
// operations in the same order, so they give the same bits, and the choice by thread count
// keeps the gradients bitwise the same for any thread count.
bool fused_schedule(const AttentionParams& p) {
  return p.batch * p.heads_kv >= omp_get_max_threads();
}

template <class Flags>
void run_passes(const BackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  const Kernels kern = kernels();
  Packed pk(p, kern.lanes);
  const bool fused = fused_schedule(p);
  const int64_t dq_floats = pk.q_floats(p);
  // The wavefront schedule's dK and dV accumulators, [heads_kv][k_blocks][2][kBlockN][dp].
  const int64_t kv_floats = fused ? 0 : p.heads_kv * pk.k_blocks * 2 * kBlockN * pk.dp;
  Workspace ws(pk.workspace_floats(p, dq_floats) + Workspace::rounded(kv_floats));
  pk.allocate(p, ws);
  float* const dq_all = ws.take(dq_floats);  // each fused task zeroes its own part
  float* const dkv_all = ws.take(kv_floats);
  if (!fused) {
    std::fill(dq_all, dq_all + dq_floats, 0.0f);
    std::fill(dkv_all, dkv_all + kv_floats, 0.0f);
  }
  if (p.is_varlen()) zero_key_gradients(bp);

  const int64_t q_per_seq = blocks_of(p.seqlen_q, kBlockM), k_per_seq = blocks_of(p.seqlen_k, kBlockN);
  const int64_t key_tasks = p.batch * p.heads_kv * k_per_seq;
  const int64_t query_tasks = p.batch * p.heads_q * q_per_seq;
  std::vector<float> sink_partials(size_t(query_tasks), 0.0f);
  // The wavefront schedule: each thread's Tiles, and one dependence token per key block
  // (its dK/dV accumulators) and per query block (its dQ accumulator).
  std::vector<Tiles*> tiles_of(size_t(omp_get_max_threads()), nullptr);
  std::vector<char> key_order(size_t(fused ? 0 : p.heads_kv * pk.k_blocks));
  std::vector<char> query_order(size_t(fused ? 0 : p.heads_q * pk.q_blocks));
  // Tasks are numbered over the longest sequence; a varlen sequence's extra ones are empty.
  auto key_task = [&](int64_t t, int64_t& b, int64_t& hk, int64_t& kb) {
    kb = t % k_per_seq;
    b = t / k_per_seq / p.heads_kv;
    hk = t / k_per_seq % p.heads_kv;
    return kb < blocks_of(Seqlen(p, b).seqlen_k, kBlockN);
  };
  auto query_task = [&](int64_t t, int64_t& b, int64_t& h, int64_t& qb) {
    qb = t % q_per_seq;
    b = t / q_per_seq / p.heads_q;
    h = t / q_per_seq % p.heads_q;
    return qb < blocks_of(Seqlen(p, b).seqlen_q, kBlockM);
  };
#pragma omp parallel
  {
    Tiles tiles(pk.dp);
    int64_t b, h, blk;
    // Pass 1: pack every block (and D); the barrier at the end of each loop orders them.
#pragma omp for schedule(dynamic, 4)
    for (int64_t t = 0; t < query_tasks; ++t)
      if (query_task(t, b, h, blk)) pk.pack_queries(bp, b, h, blk);
#pragma omp for schedule(dynamic, 4)
    for (int64_t t = 0; t < key_tasks; ++t)
      if (key_task(t, b, h, blk)) pk.pack_keys(p, b, h, blk);
    if (fused) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t pair = 0; pair < p.batch * p.heads_kv; ++pair) {
        const int64_t bb = pair / p.heads_kv, hk = pair % p.heads_kv;
        const Seqlen seq(p, bb);
        for (int64_t hq = hk * p.heads_per_kv(); hq < (hk + 1) * p.heads_per_kv(); ++hq)
          for (int64_t qb = 0; qb < blocks_of(seq.seqlen_q, kBlockM); ++qb) {
            float* acc = dq_all + pk.q_block(bb, hq, qb) * kBlockM * pk.dp;
            std::fill(acc, acc + kBlockM * pk.dp, 0.0f);
          }
        for (int64_t kb = 0; kb < blocks_of(seq.seqlen_k, kBlockN); ++kb)
          key_block_gradients<Flags>(kern, bp, pk, bb, hk, kb, tiles, dq_all);
        for (int64_t hq = hk * p.heads_per_kv(); hq < (hk + 1) * p.heads_per_kv(); ++hq)
          for (int64_t qb = 0; qb < blocks_of(seq.seqlen_q, kBlockM); ++qb)
            sink_partials[size_t((bb * p.heads_q + hq) * q_per_seq + qb)] = finish_query_block(
                bp, pk, bb, hq, qb, dq_all + pk.q_block(bb, hq, qb) * kBlockM * pk.dp);
      }
    } else {
      tiles_of[size_t(omp_get_thread_num())] = &tiles;
#pragma omp barrier
#pragma omp single
      for (int64_t pair = 0; pair < p.batch * p.heads_kv; ++pair) {
        const int64_t bb = pair / p.heads_kv, hk = pair % p.heads_kv;
        const Seqlen seq(p, bb);
        const Mask<int64_t> mask = seq.mask(p);
        for (int64_t kb = 0; kb < blocks_of(seq.seqlen_k, kBlockN); ++kb) {
          const int64_t kn = pk.k_block(bb, hk, kb);
          float* dk_acc = dkv_all + kn * 2 * kBlockN * pk.dp;
          float* dv_acc = dk_acc + kBlockN * pk.dp;
          const int64_t q_blocks = blocks_of(seq.seqlen_q, kBlockM);
          for (int64_t hq = hk * p.heads_per_kv(); hq < (hk + 1) * p.heads_per_kv(); ++hq)
            for (int64_t q0 = 0; q0 < q_blocks; q0 += kWaveBlocks) {
              const int64_t q1 = std::min(q_blocks, q0 + kWaveBlocks);
              bool any = false;  // does a query block of [q0, q1) see key block kb?
              for (int64_t qb = q0; qb < q1 && !any; ++qb) {
                const KeyBlocks<int64_t> blocks = key_blocks(
                    mask, qb * kBlockM, std::min(seq.seqlen_q, (qb + 1) * kBlockM), kBlockN);
                any = kb >= blocks.begin && kb < blocks.end;
              }
              if (!any) continue;
              char* kdep = &key_order[size_t(kn)];
              char* qdep = &query_order[size_t(pk.q_block(bb, hq, q0))];
#pragma omp task default(shared) firstprivate(bb, hq, q0, q1, kb, dk_acc, dv_acc, kdep, qdep) depend(inout : kdep[0], qdep[0])
              {
                const Seqlen s2(p, bb);
                const Mask<int64_t> m2 = s2.mask(p);
                const LogitsTransform<float> logits = logits_transform<float>(p, bb, hq);
                Tiles& t = *tiles_of[size_t(omp_get_thread_num())];
                for (int64_t qb = q0; qb < q1; ++qb) {
                  const int64_t i0 = qb * kBlockM, i1 = std::min(s2.seqlen_q, i0 + kBlockM);
                  const KeyBlocks<int64_t> blocks = key_blocks(m2, i0, i1, kBlockN);
                  if (kb < blocks.begin || kb >= blocks.end) continue;
                  const Pair pr = make_pair(pk, p, s2, bb, hq, qb, kb);
                  pair_step<Flags>(kern, pk, m2, logits, blocks.needs_mask(kb), pr, t, dk_acc,
                                   dv_acc, dq_all + pk.q_block(bb, hq, qb) * kBlockM * pk.dp);
                }
              }
            }
          char* kdep = &key_order[size_t(kn)];
#pragma omp task default(shared) firstprivate(bb, hk, kb, dk_acc, dv_acc, kdep) depend(inout : kdep[0])
          store_key_block(bp, pk, bb, hk, kb, dk_acc, dv_acc);
        }
        for (int64_t hq = hk * p.heads_per_kv(); hq < (hk + 1) * p.heads_per_kv(); ++hq)
          for (int64_t qb = 0; qb < blocks_of(seq.seqlen_q, kBlockM); ++qb) {
            const int64_t qn = pk.q_block(bb, hq, qb);
            char* qdep = &query_order[size_t(pk.q_block(bb, hq, qb / kWaveBlocks * kWaveBlocks))];
#pragma omp task default(shared) firstprivate(bb, hq, qb, qn, qdep) depend(inout : qdep[0])
            sink_partials[size_t((bb * p.heads_q + hq) * q_per_seq + qb)] =
                finish_query_block(bp, pk, bb, hq, qb, dq_all + qn * kBlockM * pk.dp);
          }
      }
      // The single's implicit barrier waits for every task; tiles outlive them.
    }
  }
  if (bp.dsinks != nullptr)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      float total = 0.0f;  // in task order: the same sum for any thread count
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t qb = 0; qb < q_per_seq; ++qb)
          total += sink_partials[size_t((b * p.heads_q + h) * q_per_seq + qb)];
      bp.dsinks[h] = total;
    }
}

}  // namespace

int64_t workspace_bytes(const BackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  const int64_t threads = omp_get_max_threads();
  const int64_t query_tasks = p.batch * p.heads_q * blocks_of(p.seqlen_q, kBlockM);
  // The packed fp32 blocks (D among them), each thread's Tiles (the fp32 dK/dV or dQ
  // accumulators among them), the fused schedule's fp32 dQ accumulators, the sinks'
  // partial sums.
  const int64_t lanes = kernels().lanes;
  const int64_t dp = ceil_div(p.head_dim, lanes) * lanes;
  const Packed shape(p, lanes);
  const int64_t dq_all = p.heads_q * shape.q_blocks * kBlockM * dp +
                         (fused_schedule(p) ? 0 : p.heads_kv * shape.k_blocks * 2 * kBlockN * dp);
  return (Packed::floats(p, lanes) + threads * Tiles::floats(dp) + dq_all + query_tasks) *
         int64_t(sizeof(float));
}

void run(const BackwardParams& bp) {
  with_logits_flags(bp.fwd, [&](auto flags) { run_passes<decltype(flags)>(bp); });
}

#else  // without Highway cpu_flash is unavailable, and the dispatcher never calls these

int64_t workspace_bytes(const BackwardParams&) { return 0; }
void run(const BackwardParams&) {
  throw Error(ErrorKind::unsupported, "cpu_flash: built without Google Highway");
}

#endif

}  // namespace flashtile::detail::cpu_flash_backward
