// cpu_flash's backward pass: FlashAttention-2's algorithm tiled for the CPU, in O(N·d)
// memory. P is never stored: each (query row, key block) recomputes it from the saved LSE,
//   P_ij = exp(S_ij - lse_i),  dP_ij = dO_i·v_j,  dS_ij = P_ij (dP_ij - D_i),
// with D_i = dO_i·O_i from a pre-pass, and the softcap's chain rule on dS (docs/BACKWARD.md).
//
// Three passes, each parallel with OpenMP over work that owns its outputs, so no atomics
// and no reduction whose order depends on the threads: the gradients are bitwise the same
// for any thread count and run, deterministic by construction (options.deterministic is
// always honoured).
//   1. D: one task per block of query rows.
//   2. dK, dV: one task per (sequence, kv head, key block). It walks the query heads of its
//      group and the query blocks that see its keys (key_blocks() of each query block says
//      which, and where the mask is needed), accumulating dK and dV of its keys in fp32.
//   3. dQ: one task per (sequence, query head, query block), over the key blocks the block
//      visits, dQ accumulated in fp32 per task (the fp32 dQ accumulators); the sinks'
//      gradient per task, summed afterwards in task order.
// Pass 3 recomputes S and dP a second time (7 block products per pair instead of FA2's 5):
// the price of a dQ without atomics on the CPU.
//
// The products are plain loops over contiguous fp32 tiles (K and V transposed so that the
// score loop runs over keys), vectorised by the compiler; f16/bf16 are converted to fp32
// once per tile. Every mask bound, offset and LSE index comes from src/attn/.
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
namespace {

using Seqlen = SeqlenInfo<int64_t>;

// Query rows per dQ task and keys per dK/dV task (and per step of either pass).
constexpr int64_t kBlockM = 64;
constexpr int64_t kBlockN = 64;
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

// One key block in fp32: K row-major (for dQ += dS·K), Kᵀ and Vᵀ (for S = q·Kᵀ, dP = dO·Vᵀ).
struct KeyTile {
  int64_t first = 0, keys = 0;  // keys [first, first + keys) of the sequence
  std::vector<float> k;         // [kBlockN × d]
  std::vector<float> k_t, v_t;  // [d × kBlockN]

  explicit KeyTile(int64_t d)
      : k(size_t(kBlockN * d)), k_t(static_cast<size_t>(d * kBlockN)), v_t(static_cast<size_t>(d * kBlockN)) {}

  void load(const AttentionParams& p, int64_t b, int64_t hk, const Seqlen& seq, int64_t block,
            std::vector<float>& row) {
    const int64_t d = p.head_dim;
    first = block * kBlockN;
    keys = std::min(kBlockN, seq.seqlen_k - first);
    for (int64_t j = 0; j < keys; ++j) {
      load_row(p.k, p.dtype, seq.k_offset(p, b, first + j, hk), d, &k[j * d]);
      for (int64_t c = 0; c < d; ++c) k_t[c * kBlockN + j] = k[j * d + c];
      load_row(p.v, p.dtype, seq.v_offset(p, b, first + j, hk), d, row.data());
      for (int64_t c = 0; c < d; ++c) v_t[c * kBlockN + j] = row[c];
    }
  }
};

// One query row of one head against one key tile: P and dS (already through the softcap's
// chain rule, so that dQ += dS·K and dK += dS·q) over the tile's keys, 0 where masked.
template <class Flags>
void row_gradients(const AttentionParams& p, const Mask<int64_t>& mask,
                   const LogitsTransform<float>& logits, const KeyTile& tile, bool needs_mask,
                   int64_t i, const float* q_row, const float* do_row, float lse, float row_sum,
                   float* prob, float* dscore) {
  const int64_t d = p.head_dim, n = tile.keys;
  // prob <- q·Kᵀ and dscore <- dO·Vᵀ, both over the keys (contiguous in the tiles).
  std::fill_n(prob, kBlockN, 0.0f);
  std::fill_n(dscore, kBlockN, 0.0f);
  for (int64_t c = 0; c < d; ++c) {
    const float qc = q_row[c], dc = do_row[c];
    const float* kc = &tile.k_t[c * kBlockN];
    const float* vc = &tile.v_t[c * kBlockN];
#pragma omp simd
    for (int64_t j = 0; j < kBlockN; ++j) {
      prob[j] += qc * kc[j];
      dscore[j] += dc * vc[j];
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    const int64_t key = tile.first + j;
    const float capped = logits.scaled<Flags::kSoftcap>(prob[j]);
    float s = capped;
    if constexpr (Flags::kAlibi) s += logits.alibi_bias(mask, i, key);
    const float pr = (needs_mask && !mask.visible(i, key)) ? 0.0f : std::exp(s - lse);
    prob[j] = pr;
    dscore[j] = pr * (dscore[j] - row_sum) * logits.scaled_derivative<Flags::kSoftcap>(capped);
  }
  for (int64_t j = n; j < kBlockN; ++j) prob[j] = dscore[j] = 0.0f;
}

// acc[j][:] += w[j] · x[:] for the tile's keys (rank-1 updates of dK and dV).
void add_outer(float* acc, const float* w, const float* x, int64_t keys, int64_t d) {
  for (int64_t j = 0; j < keys; ++j) {
    const float wj = w[j];
    if (wj == 0.0f) continue;  // masked keys; skipping a +0 leaves the sum bitwise the same
    float* a = acc + j * d;
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) a[c] += wj * x[c];
  }
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
void key_block_task(const BackwardParams& bp, const std::vector<float>& row_sums, int64_t b,
                    int64_t hk, int64_t kb) {
  const AttentionParams& p = bp.fwd;
  const int64_t d = p.head_dim;
  const Seqlen seq(p, b);
  const Mask<int64_t> mask = seq.mask(p);
  std::vector<float> row(static_cast<size_t>(d)), q_row(static_cast<size_t>(d)), do_row(static_cast<size_t>(d));
  std::vector<float> prob(kBlockN), dscore(kBlockN);
  std::vector<float> dk_acc(size_t(kBlockN * d), 0.0f), dv_acc(size_t(kBlockN * d), 0.0f);
  KeyTile tile(d);
  tile.load(p, b, hk, seq, kb, row);
  for (int64_t h = hk * p.heads_per_kv(); h < (hk + 1) * p.heads_per_kv(); ++h) {
    const LogitsTransform<float> logits = logits_transform<float>(p, b, h);
    for (int64_t qb = 0; qb < blocks_of(seq.seqlen_q, kBlockM); ++qb) {
      const int64_t i0 = qb * kBlockM, i1 = std::min(seq.seqlen_q, i0 + kBlockM);
      const KeyBlocks<int64_t> blocks = key_blocks(mask, i0, i1, kBlockN);
      if (kb < blocks.begin || kb >= blocks.end) continue;  // no row of this block sees these keys
      const bool needs_mask = blocks.needs_mask(kb);
      for (int64_t i = i0; i < i1; ++i) {
        const float lse = p.lse[seq.lse_index(p, b, h, i)];
        if (lse == kNegInf) continue;  // a row that sees nothing has P = 0
        load_row(p.q, p.dtype, seq.q_offset(p, b, i, h), d, q_row.data());
        load_row(bp.dout, p.dtype, seq.row_offset_q(bp.dout_strides, b, i, h), d, do_row.data());
        row_gradients<Flags>(p, mask, logits, tile, needs_mask, i, q_row.data(), do_row.data(), lse,
                             row_sums[size_t(seq.lse_index(p, b, h, i))], prob.data(), dscore.data());
        add_outer(dv_acc.data(), prob.data(), do_row.data(), tile.keys, d);
        add_outer(dk_acc.data(), dscore.data(), q_row.data(), tile.keys, d);
      }
    }
  }
  for (int64_t j = 0; j < tile.keys; ++j) {
    store_row(bp.dk, p.dtype, seq.row_offset_k(bp.dk_strides, b, tile.first + j, hk), d, &dk_acc[j * d]);
    store_row(bp.dv, p.dtype, seq.row_offset_k(bp.dv_strides, b, tile.first + j, hk), d, &dv_acc[j * d]);
  }
}

// Pass 3: dQ of one query block of one (sequence, query head), and its rows' share of the
// sink's gradient, -Σ_i P_sink,i · D_i.
template <class Flags>
float query_block_task(const BackwardParams& bp, const std::vector<float>& row_sums, int64_t b,
                       int64_t h, int64_t qb) {
  const AttentionParams& p = bp.fwd;
  const int64_t d = p.head_dim, hk = h / p.heads_per_kv();
  const Seqlen seq(p, b);
  const Mask<int64_t> mask = seq.mask(p);
  const LogitsTransform<float> logits = logits_transform<float>(p, b, h);
  const int64_t i0 = qb * kBlockM, i1 = std::min(seq.seqlen_q, i0 + kBlockM), rows = i1 - i0;
  std::vector<float> row(static_cast<size_t>(d)), prob(kBlockN), dscore(kBlockN);
  std::vector<float> q_tile(static_cast<size_t>(rows * d)), do_tile(static_cast<size_t>(rows * d));  // [rows × d]
  std::vector<float> dq_acc(size_t(rows * d), 0.0f);                       // [rows × d]
  for (int64_t i = i0; i < i1; ++i) {
    load_row(p.q, p.dtype, seq.q_offset(p, b, i, h), d, &q_tile[(i - i0) * d]);
    load_row(bp.dout, p.dtype, seq.row_offset_q(bp.dout_strides, b, i, h), d, &do_tile[(i - i0) * d]);
  }
  const KeyBlocks<int64_t> blocks = key_blocks(mask, i0, i1, kBlockN);
  KeyTile tile(d);
  for (int64_t kb = blocks.begin; kb < blocks.end; ++kb) {
    tile.load(p, b, hk, seq, kb, row);
    for (int64_t i = i0; i < i1; ++i) {
      const float lse = p.lse[seq.lse_index(p, b, h, i)];
      if (lse == kNegInf) continue;
      row_gradients<Flags>(p, mask, logits, tile, blocks.needs_mask(kb), i, &q_tile[(i - i0) * d],
                           &do_tile[(i - i0) * d], lse, row_sums[size_t(seq.lse_index(p, b, h, i))],
                           prob.data(), dscore.data());
      float* acc = &dq_acc[(i - i0) * d];
      for (int64_t j = 0; j < tile.keys; ++j) {
        const float w = dscore[j];
        if (w == 0.0f) continue;
        const float* kj = &tile.k[j * d];
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) acc[c] += w * kj[c];
      }
    }
  }
  float dsink = 0.0f;
  const float sink = sink_logit<float>(p, h);
  for (int64_t i = i0; i < i1; ++i) {
    store_row(bp.dq, p.dtype, seq.row_offset_q(bp.dq_strides, b, i, h), d, &dq_acc[(i - i0) * d]);
    const float lse = p.lse[seq.lse_index(p, b, h, i)];
    if (p.sinks != nullptr && lse != kNegInf)
      dsink -= std::exp(sink - lse) * row_sums[size_t(seq.lse_index(p, b, h, i))];
  }
  return dsink;
}

template <class Flags>
void run_passes(const BackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  std::vector<float> row_sums(static_cast<size_t>(row_sum_count(p)));
  compute_row_sums(bp, row_sums);
  if (p.is_varlen()) zero_key_gradients(bp);

  const int64_t key_blocks_per_seq = blocks_of(p.seqlen_k, kBlockN);
  const int64_t key_tasks = p.batch * p.heads_kv * key_blocks_per_seq;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < key_tasks; ++t) {
    const int64_t kb = t % key_blocks_per_seq, bh = t / key_blocks_per_seq;
    const int64_t b = bh / p.heads_kv, hk = bh % p.heads_kv;
    if (kb < blocks_of(Seqlen(p, b).seqlen_k, kBlockN)) key_block_task<Flags>(bp, row_sums, b, hk, kb);
  }

  const int64_t query_blocks_per_seq = blocks_of(p.seqlen_q, kBlockM);
  const int64_t query_tasks = p.batch * p.heads_q * query_blocks_per_seq;
  std::vector<float> sink_partials(size_t(query_tasks), 0.0f);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < query_tasks; ++t) {
    const int64_t qb = t % query_blocks_per_seq, bh = t / query_blocks_per_seq;
    const int64_t b = bh / p.heads_q, h = bh % p.heads_q;
    if (qb < blocks_of(Seqlen(p, b).seqlen_q, kBlockM))
      sink_partials[size_t(t)] = query_block_task<Flags>(bp, row_sums, b, h, qb);
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
  const int64_t d = p.head_dim, threads = omp_get_max_threads();
  const int64_t query_tasks = p.batch * p.heads_q * blocks_of(p.seqlen_q, kBlockM);
  // D; per thread the larger of a dK/dV task (two fp32 [kBlockN × d] accumulators) and a
  // dQ task (q, dO and the fp32 dQ accumulator, [kBlockM × d] each), plus a key tile
  // (three [kBlockN × d]); the sinks' partial sums.
  const int64_t per_thread =
      std::max(2 * kBlockN * d, 3 * kBlockM * d) + 3 * kBlockN * d + 2 * kBlockN + 3 * d;
  return (row_sum_count(p) + threads * per_thread + query_tasks) * int64_t(sizeof(float));
}

void run(const BackwardParams& bp) {
  with_logits_flags(bp.fwd, [&](auto flags) { run_passes<decltype(flags)>(bp); });
}

}  // namespace flashtile::detail::cpu_flash_backward
