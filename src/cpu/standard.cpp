// cpu_standard: the write-up's baseline. For every (batch, head) it materialises the full
// S = Q·Kᵀ·scale (seqlen_q × seqlen_k floats), runs the three-pass softmax (max, sum of
// exponentials, divide) and then O = P·V. Single-threaded fp32 on purpose: it is the
// yardstick every speedup in the journey is measured against.
#include <cmath>
#include <limits>
#include <vector>

#include "api/backend.hpp"
#include "attn/seqlen.hpp"
#include "attn/softmax_state.hpp"
#include "common/numeric.hpp"

namespace flashtile::detail {
namespace {

// Copies one head of a strided tensor into a contiguous float matrix (rows × head_dim).
void gather_head(const void* data, DType dtype, int64_t base, int64_t row_stride, int64_t rows,
                 int64_t head_dim, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < head_dim; ++c)
      dst[r * head_dim + c] = load_as_float(data, dtype, base + r * row_stride + c);
}

int64_t standard_workspace_bytes(const AttentionParams& p) {
  const int64_t s_matrix = p.seqlen_q * p.seqlen_k;
  const int64_t head_copies = (2 * p.seqlen_q + 2 * p.seqlen_k) * p.head_dim;  // Q, K, V, O
  return (s_matrix + head_copies) * int64_t(sizeof(float));
}

void run_standard(const AttentionParams& p) {
  const int64_t n_q = p.seqlen_q, n_k = p.seqlen_k, d = p.head_dim;
  std::vector<float> workspace(standard_workspace_bytes(p) / sizeof(float));
  float* S = workspace.data();  // (n_q, n_k)
  float* Q = S + n_q * n_k;     // (n_q, d)
  float* K = Q + n_q * d;       // (n_k, d)
  float* V = K + n_k * d;       // (n_k, d)
  float* O = V + n_k * d;       // (n_q, d)

  for (int64_t b = 0; b < p.batch; ++b) {
    const SeqlenInfo<int64_t> seq(p, b);
    const Mask<int64_t> mask = seq.mask(p);
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = h / p.heads_per_kv();
      gather_head(p.q, p.dtype, b * p.q_batch_stride + h * p.q_head_stride, p.q_row_stride, n_q,
                  d, Q);
      gather_head(p.k, p.dtype, b * p.k_batch_stride + hk * p.k_head_stride, p.k_row_stride, n_k,
                  d, K);
      gather_head(p.v, p.dtype, b * p.v_batch_stride + hk * p.v_head_stride, p.v_row_stride, n_k,
                  d, V);
      // S = Q·Kᵀ·scale, with the causal mask as -inf.
      for (int64_t i = 0; i < n_q; ++i) {
        const int64_t key_end = mask.key_end(i);
        for (int64_t j = 0; j < n_k; ++j) {
          float dot = 0.0f;
          for (int64_t c = 0; c < d; ++c) dot += Q[i * d + c] * K[j * d + c];
          S[i * n_k + j] = j < key_end ? dot * p.scale : -std::numeric_limits<float>::infinity();
        }
      }
      // Three-pass softmax per row; P overwrites S.
      for (int64_t i = 0; i < n_q; ++i) {
        float* row = S + i * n_k;
        float row_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n_k; ++j) row_max = std::max(row_max, row[j]);
        row_max = nan_if_no_finite_score(row_max, mask.visible_keys(i) > 0);
        float sum = 0.0f;
        for (int64_t j = 0; j < n_k; ++j) {
          row[j] = row_max == -std::numeric_limits<float>::infinity() ? 0.0f
                                                                       : std::exp(row[j] - row_max);
          sum += row[j];
        }
        const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;  // fully masked row -> 0
        for (int64_t j = 0; j < n_k; ++j) row[j] *= inv;
        if (p.lse != nullptr)
          p.lse[seq.lse_index(p, b, h, i)] =
              sum == 0.0f ? -std::numeric_limits<float>::infinity() : row_max + std::log(sum);
      }
      // O = P·V over the keys row i sees: a masked key's value is not read (a NaN there
      // would survive its zero probability).
      for (int64_t i = 0; i < n_q; ++i) {
        for (int64_t c = 0; c < d; ++c) O[i * d + c] = 0.0f;
        for (int64_t j = 0; j < mask.key_end(i); ++j) {
          const float prob = S[i * n_k + j];
          for (int64_t c = 0; c < d; ++c) O[i * d + c] += prob * V[j * d + c];
        }
        const int64_t dst = b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride;
        for (int64_t c = 0; c < d; ++c) store_from_float(p.o, p.dtype, dst + c, O[i * d + c]);
      }
    }
  }
}

std::string always_available() { return ""; }

std::string standard_unsupported(const AttentionParams& p) {
  // The materialised S must fit: refuse rather than fail in the allocator.
  if (std::string why = journey_unsupported(p, "cpu_standard"); !why.empty()) return why;
  // Divided rather than multiplied, so that no product can wrap past the limit.
  constexpr int64_t kMaxScores = (int64_t(8) << 30) / int64_t(sizeof(float));
  if (p.seqlen_q > kMaxScores / p.seqlen_k)
    return "seqlen_q*seqlen_k*4 bytes for S exceeds 8 GiB (this is why flash attention exists)";
  return "";
}

}  // namespace

BackendEntry make_cpu_standard_backend() {
  return {Backend::cpu_standard, DeviceType::cpu, /*priority=*/1, always_available,
          standard_unsupported, standard_workspace_bytes, run_standard};
}

}  // namespace flashtile::detail
