// cpu_flash's backward pass: FlashAttention-2's algorithm tiled for the CPU, in O(N·d)
// memory. P is never stored: each (query block, key block) pair recomputes it from the
// saved LSE,
//   P = exp(S - lse),  dP = dO·Vᵀ,  dS = P∘(dP - D)∘∂c/∂(q·k),
// with D = rowsum(dO∘O) from a pre-pass and the softcap's chain rule (docs/BACKWARD.md).
//
// Three passes, each parallel with OpenMP over work that owns its outputs, so no atomics
// and no reduction whose order depends on the threads: the gradients are bitwise the same
// for any thread count and run, deterministic by construction (options.deterministic is
// always honoured).
//   1. D: one task per block of query rows.
//   2. dK, dV: one task per (sequence, kv head, key block). It walks the query heads of its
//      group and the query blocks that see its keys (key_blocks() of each query block says
//      which, and whether the mask is needed), accumulating dV += Pᵀ·dO and dK += dSᵀ·Q in
//      fp32.
//   3. dQ: one task per (sequence, query head, query block), over the key blocks it
//      visits, dQ += dS·K in an fp32 accumulator per task (the fp32 dQ accumulators); the
//      sinks' gradient per task, summed afterwards in task order.
// Pass 3 recomputes S and dP a second time (7 block products per pair instead of FA2's 5):
// the price of a dQ without atomics on the CPU.
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
#include <vector>

#include "attn/block_range.hpp"
#include "attn/features.hpp"
#include "attn/seqlen.hpp"
#include "attn/variant.hpp"
#include "common/numeric.hpp"

namespace flashtile::detail::cpu_flash_backward {
#if FLASHTILE_WITH_HWY
namespace {

using Seqlen = SeqlenInfo<int64_t>;

// Query rows per dQ task and keys per dK/dV task (and per step of either pass).
constexpr int64_t kBlockM = 64;
constexpr int64_t kBlockN = 64;
// The SIMD kernels take tile rows of whole vectors: up to 16 floats (AVX-512).
static_assert(kBlockN % 16 == 0, "a key block must be whole vectors on every target");
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// n values of `dtype` from element `offset` of `data` into dst as fp32.
void load_row(const void* data, DType dtype, int64_t offset, int64_t n, float* dst) {
  switch (dtype) {
    case DType::f32: std::copy_n(static_cast<const float*>(data) + offset, n, dst); return;
    default:
      for (int64_t c = 0; c < n; ++c) dst[c] = load_as_float(data, dtype, offset + c);
  }
}
void store_row(void* data, DType dtype, int64_t offset, int64_t n, const float* src) {
  for (int64_t c = 0; c < n; ++c) store_from_float(data, dtype, offset + c, src[c]);
}

// The per-thread tiles of one (query block, key block) product, fp32; dp = head_dim rounded
// up to whole vectors, zero-padded. Rows past a block's end are zero too.
struct Tiles {
  int64_t d, dp;
  std::vector<float> q, dout;       // [kBlockM × dp]: the query block's rows
  std::vector<float> lse, row_sums;  // [kBlockM]: +inf for rows that see nothing (P = 0)
  std::vector<float> k;             // [kBlockN × dp]: the key block, row-major
  std::vector<float> k_t, v_t;      // [d × kBlockN]: Kᵀ and Vᵀ
  std::vector<float> s, ds, chain;  // [kBlockM × kBlockN]: S then P; dP then dS; ∂c/∂(q·k)
  std::vector<float> p_t, ds_t;     // [kBlockN × kBlockM]: Pᵀ and dSᵀ
  std::vector<float> acc_a, acc_b;  // [max(kBlockM, kBlockN) × dp]: dK and dV, or dQ
  int64_t rows = 0, keys = 0;       // valid rows and keys of the loaded blocks
  int64_t first_row = 0, first_key = 0;

  Tiles(int64_t head_dim, int64_t lanes) : d(head_dim), dp(ceil_div(head_dim, lanes) * lanes) {
    auto sized = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n), 0.0f); };
    q = sized(kBlockM * dp);
    dout = sized(kBlockM * dp);
    lse = sized(kBlockM);
    row_sums = sized(kBlockM);
    k = sized(kBlockN * dp);
    k_t = sized(d * kBlockN);
    v_t = sized(d * kBlockN);
    s = sized(kBlockM * kBlockN);
    ds = sized(kBlockM * kBlockN);
    chain = sized(kBlockM * kBlockN);
    p_t = sized(kBlockN * kBlockM);
    ds_t = sized(kBlockN * kBlockM);
    acc_a = sized(std::max(kBlockM, kBlockN) * dp);
    acc_b = sized(std::max(kBlockM, kBlockN) * dp);
  }
  static int64_t floats(int64_t head_dim, int64_t lanes) {
    const int64_t dp = ceil_div(head_dim, lanes) * lanes;
    return 2 * kBlockM * dp + 2 * kBlockM + kBlockN * dp + 2 * head_dim * kBlockN +
           5 * kBlockM * kBlockN + 2 * std::max(kBlockM, kBlockN) * dp;
  }

  // Query block qb of head h: q, dO, the LSE and D of its rows.
  void load_queries(const BackwardParams& bp, const std::vector<float>& all_row_sums,
                    const Seqlen& seq, int64_t b, int64_t h, int64_t qb) {
    const AttentionParams& p = bp.fwd;
    first_row = qb * kBlockM;
    rows = std::min(kBlockM, seq.seqlen_q - first_row);
    std::fill(q.begin(), q.end(), 0.0f);
    std::fill(dout.begin(), dout.end(), 0.0f);
    for (int64_t r = 0; r < kBlockM; ++r) {
      if (r >= rows) {
        lse[r] = std::numeric_limits<float>::infinity();
        row_sums[r] = 0.0f;
        continue;
      }
      const int64_t i = first_row + r;
      load_row(p.q, p.dtype, seq.q_offset(p, b, i, h), d, &q[r * dp]);
      load_row(bp.dout, p.dtype, seq.row_offset_q(bp.dout_strides, b, i, h), d, &dout[r * dp]);
      const float l = p.lse[seq.lse_index(p, b, h, i)];
      lse[r] = l == kNegInf ? std::numeric_limits<float>::infinity() : l;
      row_sums[r] = all_row_sums[size_t(seq.lse_index(p, b, h, i))];
    }
  }

  // Key block kb of kv head hk: K, Kᵀ, Vᵀ.
  void load_keys(const AttentionParams& p, const Seqlen& seq, int64_t b, int64_t hk, int64_t kb) {
    first_key = kb * kBlockN;
    keys = std::min(kBlockN, seq.seqlen_k - first_key);
    std::fill(k.begin(), k.end(), 0.0f);
    std::fill(k_t.begin(), k_t.end(), 0.0f);
    std::fill(v_t.begin(), v_t.end(), 0.0f);
    float* v_row = acc_b.data();  // scratch for one row; the accumulators are zeroed after
    for (int64_t j = 0; j < keys; ++j) {
      load_row(p.k, p.dtype, seq.k_offset(p, b, first_key + j, hk), d, &k[j * dp]);
      load_row(p.v, p.dtype, seq.v_offset(p, b, first_key + j, hk), d, v_row);
      for (int64_t c = 0; c < d; ++c) {
        k_t[c * kBlockN + j] = k[j * dp + c];
        v_t[c * kBlockN + j] = v_row[c];
      }
    }
  }
};

// P (in s) and dS (in ds) of the loaded query and key blocks: S = Q·Kᵀ and dP = dO·Vᵀ, the
// logits of the variant (softcap lane-wise, ALiBi and the mask through the shared core),
// then P = exp(S - lse) and dS = P∘(dP - D)∘∂c/∂(q·k). Masked and padding entries get P = 0.
template <class Flags>
void block_gradients(const Kernels& kern, const AttentionParams& p, const Mask<int64_t>& mask,
                     const LogitsTransform<float>& logits, bool needs_mask, Tiles& t) {
  const int64_t m = t.rows;
  kern.gemm(t.q.data(), t.dp, t.k_t.data(), kBlockN, t.s.data(), kBlockN, m, kBlockN, p.head_dim,
            false);
  kern.gemm(t.dout.data(), t.dp, t.v_t.data(), kBlockN, t.ds.data(), kBlockN, m, kBlockN,
            p.head_dim, false);
  if constexpr (Flags::kSoftcap)
    kern.softcap(t.s.data(), t.chain.data(), kBlockN, m, kBlockN, logits.scale, logits.softcap,
                 logits.capped_scale);
  for (int64_t r = 0; r < m; ++r) {
    float* row = &t.s[r * kBlockN];
    const int64_t i = t.first_row + r;
    if constexpr (!Flags::kSoftcap)
      for (int64_t j = 0; j < t.keys; ++j) row[j] = logits.scaled<false>(row[j]);
    if constexpr (Flags::kAlibi)
      for (int64_t j = 0; j < t.keys; ++j) row[j] += logits.alibi_bias(mask, i, t.first_key + j);
    if (needs_mask)
      for (int64_t j = 0; j < t.keys; ++j)
        if (!mask.visible(i, t.first_key + j)) row[j] = kNegInf;
    for (int64_t j = t.keys; j < kBlockN; ++j) row[j] = kNegInf;
  }
  kern.probabilities(t.s.data(), t.ds.data(), Flags::kSoftcap ? t.chain.data() : nullptr, kBlockN,
                     m, kBlockN, t.lse.data(), t.row_sums.data(), logits.scale);
}

struct Workspace {
  std::vector<float> row_sums;     // D, indexed as the LSE
  std::vector<float> sink_partials;  // one per dQ task (sinks only)
};

int64_t row_sum_count(const AttentionParams& p) {
  return p.is_varlen() ? p.heads_q * p.total_q : p.batch * p.heads_q * p.seqlen_q;
}

int64_t blocks_of(int64_t n, int64_t block) { return ceil_div<int64_t>(n, block); }

// Pass 1: D_i = Σ_c dO_ic · O_ic, fp32, per query row.
void compute_row_sums(const BackwardParams& bp, std::vector<float>& row_sums) {
  const AttentionParams& p = bp.fwd;
  const int64_t d = p.head_dim;
  const int64_t per_seq = blocks_of(p.seqlen_q, kBlockM);
#pragma omp parallel
  {
    std::vector<float> o(static_cast<size_t>(d)), g(static_cast<size_t>(d));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < p.batch * per_seq; ++task) {
      const int64_t b = task / per_seq, qb = task % per_seq;
      const Seqlen seq(p, b);
      for (int64_t i = qb * kBlockM; i < std::min(seq.seqlen_q, (qb + 1) * kBlockM); ++i)
        for (int64_t h = 0; h < p.heads_q; ++h) {
          load_row(p.o, p.dtype, seq.o_offset(p, b, i, h), d, o.data());
          load_row(bp.dout, p.dtype, seq.row_offset_q(bp.dout_strides, b, i, h), d, g.data());
          float sum = 0.0f;
          for (int64_t c = 0; c < d; ++c) sum += o[c] * g[c];
          row_sums[size_t(seq.lse_index(p, b, h, i))] = sum;
        }
    }
  }
}

// Varlen: key rows outside every sequence's used keys have gradient 0 (passes 2 and 3 write
// only the used ones).
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

// Pass 2: dK and dV of one key block of one (sequence, kv head).
template <class Flags>
void key_block_task(const Kernels& kern, const BackwardParams& bp,
                    const std::vector<float>& row_sums, int64_t b, int64_t hk, int64_t kb,
                    Tiles& t) {
  const AttentionParams& p = bp.fwd;
  const Seqlen seq(p, b);
  const Mask<int64_t> mask = seq.mask(p);
  t.load_keys(p, seq, b, hk, kb);
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
      t.load_queries(bp, row_sums, seq, b, h, qb);
      block_gradients<Flags>(kern, p, mask, logits, blocks.needs_mask(kb), t);
      for (int64_t r = 0; r < t.rows; ++r)
        for (int64_t j = 0; j < kBlockN; ++j) {
          t.p_t[j * kBlockM + r] = t.s[r * kBlockN + j];
          t.ds_t[j * kBlockM + r] = t.ds[r * kBlockN + j];
        }
      // dV += Pᵀ·dO and dK += dSᵀ·Q over the block's rows.
      kern.gemm(t.p_t.data(), kBlockM, t.dout.data(), t.dp, dv_acc, t.dp, t.keys, t.dp, t.rows,
                true);
      kern.gemm(t.ds_t.data(), kBlockM, t.q.data(), t.dp, dk_acc, t.dp, t.keys, t.dp, t.rows,
                true);
    }
  }
  for (int64_t j = 0; j < t.keys; ++j) {
    const int64_t key = t.first_key + j;
    store_row(bp.dk, p.dtype, seq.row_offset_k(bp.dk_strides, b, key, hk), t.d, dk_acc + j * t.dp);
    store_row(bp.dv, p.dtype, seq.row_offset_k(bp.dv_strides, b, key, hk), t.d, dv_acc + j * t.dp);
  }
}

// Pass 3: dQ of one query block of one (sequence, query head), and its rows' share of the
// sink's gradient, -Σ_i P_sink,i · D_i.
template <class Flags>
float query_block_task(const Kernels& kern, const BackwardParams& bp,
                       const std::vector<float>& row_sums, int64_t b, int64_t h, int64_t qb,
                       Tiles& t) {
  const AttentionParams& p = bp.fwd;
  const int64_t hk = h / p.heads_per_kv();
  const Seqlen seq(p, b);
  const Mask<int64_t> mask = seq.mask(p);
  const LogitsTransform<float> logits = logits_transform<float>(p, b, h);
  t.load_queries(bp, row_sums, seq, b, h, qb);
  float* dq_acc = t.acc_a.data();  // [kBlockM × dp]
  std::fill(t.acc_a.begin(), t.acc_a.end(), 0.0f);
  const KeyBlocks<int64_t> blocks = key_blocks(mask, t.first_row, t.first_row + t.rows, kBlockN);
  for (int64_t kb = blocks.begin; kb < blocks.end; ++kb) {
    t.load_keys(p, seq, b, hk, kb);
    block_gradients<Flags>(kern, p, mask, logits, blocks.needs_mask(kb), t);
    kern.gemm(t.ds.data(), kBlockN, t.k.data(), t.dp, dq_acc, t.dp, t.rows, t.dp, t.keys, true);
  }
  float dsink = 0.0f;
  const float sink = sink_logit<float>(p, h);
  for (int64_t r = 0; r < t.rows; ++r) {
    const int64_t i = t.first_row + r;
    store_row(bp.dq, p.dtype, seq.row_offset_q(bp.dq_strides, b, i, h), t.d, dq_acc + r * t.dp);
    const float lse = p.lse[seq.lse_index(p, b, h, i)];
    if (p.sinks != nullptr && lse != kNegInf) dsink -= std::exp(sink - lse) * t.row_sums[r];
  }
  return dsink;
}

template <class Flags>
void run_passes(const BackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  const Kernels kern = kernels();
  std::vector<float> row_sums(size_t(row_sum_count(p)));
  compute_row_sums(bp, row_sums);
  if (p.is_varlen()) zero_key_gradients(bp);

  const int64_t key_blocks_per_seq = blocks_of(p.seqlen_k, kBlockN);
  const int64_t key_tasks = p.batch * p.heads_kv * key_blocks_per_seq;
  const int64_t query_blocks_per_seq = blocks_of(p.seqlen_q, kBlockM);
  const int64_t query_tasks = p.batch * p.heads_q * query_blocks_per_seq;
  std::vector<float> sink_partials(size_t(query_tasks), 0.0f);
#pragma omp parallel
  {
    Tiles tiles(p.head_dim, kern.lanes);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < key_tasks; ++t) {
      const int64_t kb = t % key_blocks_per_seq, bh = t / key_blocks_per_seq;
      const int64_t b = bh / p.heads_kv, hk = bh % p.heads_kv;
      if (kb < blocks_of(Seqlen(p, b).seqlen_k, kBlockN))
        key_block_task<Flags>(kern, bp, row_sums, b, hk, kb, tiles);
    }
    // (the implicit barrier: every dK/dV is written before dQ starts; they are independent,
    // but one parallel region keeps each thread's tiles)
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < query_tasks; ++t) {
      const int64_t qb = t % query_blocks_per_seq, bh = t / query_blocks_per_seq;
      const int64_t b = bh / p.heads_q, h = bh % p.heads_q;
      if (qb < blocks_of(Seqlen(p, b).seqlen_q, kBlockM))
        sink_partials[size_t(t)] = query_block_task<Flags>(kern, bp, row_sums, b, h, qb, tiles);
    }
  }
  if (bp.dsinks != nullptr)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      float total = 0.0f;  // in task order: the same sum for any thread count
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t qb = 0; qb < query_blocks_per_seq; ++qb)
          total += sink_partials[size_t((b * p.heads_q + h) * query_blocks_per_seq + qb)];
      bp.dsinks[h] = total;
    }
}

}  // namespace

int64_t workspace_bytes(const BackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  const int64_t threads = omp_get_max_threads();
  const int64_t query_tasks = p.batch * p.heads_q * blocks_of(p.seqlen_q, kBlockM);
  // D, each thread's Tiles (the fp32 dK/dV or dQ accumulators among them), the sinks'
  // partial sums.
  return (row_sum_count(p) + threads * Tiles::floats(p.head_dim, kernels().lanes) + query_tasks) *
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
