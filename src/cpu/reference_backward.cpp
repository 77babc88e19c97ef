// The backward oracle: the gradient of standard attention in double precision (and its
// 16-bit baseline), plus the cpu_reference backend's backward, which writes it out in the
// input dtype. The formulas are derived in docs/BACKWARD.md; every feature comes from the
// shared core (Mask, LogitsTransform, sink_logit, SeqlenInfo), as in the forward oracle.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "api/backend.hpp"
#include "attn/seqlen.hpp"
#include "attn/variant.hpp"
#include "common/numeric.hpp"
#include "flashtile/reference.hpp"

namespace flashtile {
namespace {

using detail::AttentionParams;
using Seqlen = detail::SeqlenInfo<int64_t>;

// Element offsets of the oracle's contiguous gradients: dq has q's shape, dk/dv k's.
int64_t contiguous_q(const AttentionParams& p, int64_t b, const Seqlen& seq, int64_t i, int64_t h) {
  return (((p.is_varlen() ? 0 : b * p.seqlen_q) + seq.q_start + i) * p.heads_q + h) * p.head_dim;
}
int64_t contiguous_k(const AttentionParams& p, int64_t b, const Seqlen& seq, int64_t j,
                     int64_t hk) {
  return (((p.is_varlen() ? 0 : b * p.seqlen_k) + seq.k_start + j) * p.heads_kv + hk) * p.head_dim;
}
int64_t q_rows(const AttentionParams& p) { return p.is_varlen() ? p.total_q : p.batch * p.seqlen_q; }
int64_t k_rows(const AttentionParams& p) { return p.is_varlen() ? p.total_k : p.batch * p.seqlen_k; }

// The backward of one (sequence b, query head h, query row i), accumulated into dq (this
// row's, owned), dk and dv (the kv head's rows, shared by the group: the caller serialises
// the group) and *dsink; lse_grad is ∂loss/∂lse_i (0 without a gradient into the LSE).
// Acc is double for the oracle and float for the 16-bit baseline, where `round` rounds S,
// P, O, dP, D and dS to the input dtype.
template <class Acc, class Round>
void backward_row(const AttentionParams& p, const void* dout, const detail::ViewStrides& dout_s,
                  int64_t b, int64_t h, const Seqlen& seq, int64_t i, Acc lse_grad, Round round,
                  std::vector<Acc>& scratch, Acc* dq, Acc* dk, Acc* dv, Acc* dsink,
                  Acc* dsink_sensitivity) {
  const int64_t hk = h / p.heads_per_kv(), d = p.head_dim;
  const detail::Mask<int64_t> mask = seq.mask(p);
  const detail::LogitsTransform<Acc> logits = detail::logits_transform<Acc>(p, b, h);
  const bool softcap = p.softcap != 0.0f, alibi = p.alibi_slopes != nullptr;
  const int64_t first = mask.first_key(i), end = mask.key_end(i), n = std::max<int64_t>(end - first, 0);
  const Acc sink = detail::sink_logit<Acc>(p, h);
  // scratch: [capped scores | probabilities | dP] for this row's n keys, then q, dO, O.
  Acc* capped = scratch.data();
  Acc* prob = capped + n;
  Acc* dprob = prob + n;
  Acc* q_row = dprob + n;
  Acc* do_row = q_row + d;
  Acc* out_row = do_row + d;
  const int64_t q_off = seq.q_offset(p, b, i, h), do_off = seq.row_offset_q(dout_s, b, i, h);
  for (int64_t c = 0; c < d; ++c) {
    q_row[c] = Acc(detail::load_as_float(p.q, p.dtype, q_off + c));
    do_row[c] = Acc(detail::load_as_float(dout, p.dtype, do_off + c));
  }

  // Forward again: S, the row's max and denominator (the sink joins both), P.
  Acc max_score = sink;
  for (int64_t j = first; j < end; ++j) {
    const int64_t k_off = seq.k_offset(p, b, j, hk);
    Acc dot = 0;
    for (int64_t c = 0; c < d; ++c)
      dot += q_row[c] * Acc(detail::load_as_float(p.k, p.dtype, k_off + c));
    capped[j - first] = softcap ? logits.template scaled<true>(dot) : logits.template scaled<false>(dot);
    Acc s = capped[j - first];
    if (alibi) s += logits.alibi_bias(mask, i, j);
    prob[j - first] = round(s);
    max_score = std::max(max_score, prob[j - first]);
  }
  if (max_score == -std::numeric_limits<Acc>::infinity()) return;  // sees nothing: no gradient
  Acc sum = std::exp(sink - max_score);
  for (int64_t j = 0; j < n; ++j) {
    prob[j] = std::exp(prob[j] - max_score);
    sum += prob[j];
  }
  for (int64_t j = 0; j < n; ++j) prob[j] = round(prob[j] / sum);
  const Acc prob_sink = std::exp(sink - max_score) / sum;  // 0 without a sink

  // dP_j = dO·v_j and D = dO·O with O = Σ_j P_j v_j (the sink has no value). In double
  // D equals Σ_j P_j dP_j; the baseline takes it from its rounded O, as a 16-bit
  // reference does.
  Acc row_sum = 0;  // D
  for (int64_t c = 0; c < d; ++c) out_row[c] = 0;
  for (int64_t j = first; j < end; ++j) {
    const int64_t v_off = seq.v_offset(p, b, j, hk);
    Acc dot = 0;
    for (int64_t c = 0; c < d; ++c) {
      const Acc vc = Acc(detail::load_as_float(p.v, p.dtype, v_off + c));
      dot += do_row[c] * vc;
      out_row[c] += prob[j - first] * vc;
    }
    dprob[j - first] = round(dot);
  }
  for (int64_t c = 0; c < d; ++c) row_sum += do_row[c] * round(out_row[c]);
  row_sum = round(row_sum);
  // ∂lse/∂s_j = P_j and ∂lse/∂s_h = P_sink: the LSE's gradient g adds g·P to every dS, which
  // is D' = D - g in place of D (the baseline subtracts in fp32, as lse and g are fp32).
  const Acc shifted_row_sum = row_sum - lse_grad;

  // dS_j = P_j (dP_j - D'); through the softcap d qk = dS · scale·(1 - tanh²).
  for (int64_t j = first; j < end; ++j) {
    const Acc ds = round(prob[j - first] * (dprob[j - first] - shifted_row_sum));
    const Acc dqk = round(ds * (softcap ? logits.template scaled_derivative<true>(capped[j - first])
                                        : logits.template scaled_derivative<false>(capped[j - first])));
    const int64_t k_off = seq.k_offset(p, b, j, hk);
    Acc* dk_row = dk + contiguous_k(p, b, seq, j, hk);
    Acc* dv_row = dv + contiguous_k(p, b, seq, j, hk);
    for (int64_t c = 0; c < d; ++c) {
      dq[c] += dqk * Acc(detail::load_as_float(p.k, p.dtype, k_off + c));
      dk_row[c] += dqk * q_row[c];
      dv_row[c] += prob[j - first] * do_row[c];
    }
  }
  // The sink's logit s_h enters only the denominator: ∂L/∂s_h = P_sink · (0 - D').
  *dsink += -prob_sink * shifted_row_sum;
  Acc magnitude = 0;
  for (int64_t c = 0; c < d; ++c) magnitude += std::fabs(do_row[c] * out_row[c]);
  *dsink_sensitivity += prob_sink * magnitude;
}

// The whole backward in precision Acc. Threads take (sequence, kv head) pairs: each owns
// the dk/dv rows of its pair and the dq rows of its group, so no two threads write one
// element and the order of every sum is fixed. Sinks' sums are per (sequence, head), then
// added in sequence order.
template <class Acc, class Round>
void backward_all(const AttentionParams& p, const void* dout, const detail::ViewStrides& dout_s,
                  const float* dlse, Round round, Acc* dq, Acc* dk, Acc* dv, Acc* dsinks,
                  Acc* dsink_sensitivity) {
  const int64_t pairs = p.batch * p.heads_kv, group = p.heads_per_kv();
  std::vector<Acc> dsink_parts(static_cast<size_t>(p.batch * p.heads_q), Acc(0));
  std::vector<Acc> sensitivity_parts(dsink_parts.size(), Acc(0));
#pragma omp parallel
  {
    std::vector<Acc> scratch(static_cast<size_t>(3 * p.seqlen_k + 3 * p.head_dim));
#pragma omp for schedule(dynamic, 1)
    for (int64_t pair = 0; pair < pairs; ++pair) {
      const int64_t b = pair / p.heads_kv, hk = pair % p.heads_kv;
      const Seqlen seq(p, b);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
        for (int64_t i = 0; i < seq.seqlen_q; ++i)
          backward_row(p, dout, dout_s, b, h, seq, i,
                       dlse != nullptr ? Acc(dlse[seq.lse_index(p, b, h, i)]) : Acc(0), round,
                       scratch,
                       dq + contiguous_q(p, b, seq, i, h), dk, dv, &dsink_parts[b * p.heads_q + h],
                       &sensitivity_parts[b * p.heads_q + h]);
    }
  }
  if (dsinks != nullptr)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      Acc total = 0, sensitivity = 0;
      for (int64_t b = 0; b < p.batch; ++b) {
        total += dsink_parts[b * p.heads_q + h];
        sensitivity += sensitivity_parts[b * p.heads_q + h];
      }
      dsinks[h] = total;
      dsink_sensitivity[h] = sensitivity;
    }
}

ReferenceGradients run_reference_backward(const AttentionParams& p, const void* dout,
                                          const detail::ViewStrides& dout_s, const float* dlse,
                                          ReferencePrecision precision) {
  const size_t nq = size_t(q_rows(p) * p.heads_q * p.head_dim);
  const size_t nk = size_t(k_rows(p) * p.heads_kv * p.head_dim);
  const size_t ns = p.sinks != nullptr ? size_t(p.heads_q) : 0;
  ReferenceGradients g{std::vector<double>(nq), std::vector<double>(nk), std::vector<double>(nk),
                       std::vector<double>(ns), std::vector<double>(ns)};
  if (precision == ReferencePrecision::exact) {
    backward_all(p, dout, dout_s, dlse, [](double x) { return x; }, g.dq.data(), g.dk.data(),
                 g.dv.data(), ns ? g.dsinks.data() : nullptr,
                 ns ? g.dsinks_out_sensitivity.data() : nullptr);
    return g;
  }
  std::vector<float> dq(nq), dk(nk), dv(nk), dsinks(ns), sensitivity(ns);
  const DType dtype = p.dtype;
  backward_all(p, dout, dout_s, dlse, [dtype](float x) { return detail::round_to(dtype, x); }, dq.data(),
               dk.data(), dv.data(), ns ? dsinks.data() : nullptr,
               ns ? sensitivity.data() : nullptr);
  auto rounded = [dtype](const std::vector<float>& x) {
    std::vector<double> r(x.size());
    for (size_t n = 0; n < x.size(); ++n) r[n] = detail::round_to(dtype, x[n]);
    return r;
  };
  return {rounded(dq), rounded(dk), rounded(dv), std::vector<double>(dsinks.begin(), dsinks.end()),
          std::vector<double>(sensitivity.begin(), sensitivity.end())};
}

// Validates the oracle's arguments as backward() would (dout: q's shape, dtype, the CPU).
detail::ViewStrides check_dout(const TensorView& q, const TensorView& dout, const char* api) {
  auto fail = [&](const std::string& what) {
    throw Error(ErrorKind::invalid_argument, std::string(api) + ": " + what);
  };
  if (dout.data == nullptr) fail("dout.data is null");
  if (dout.device.type != DeviceType::cpu) fail("dout must be on the cpu");
  if (dout.dtype != q.dtype)
    throw Error(ErrorKind::dtype, std::string(api) + ": dout.dtype must match q.dtype (expected " +
                                      std::string(dtype_name(q.dtype)) + ", got " +
                                      std::string(dtype_name(dout.dtype)) + ")");
  for (int i = 0; i < 4; ++i)
    if (dout.shape[i] != q.shape[i])
      fail("dout.shape[" + std::to_string(i) + "] must equal q.shape[" + std::to_string(i) +
           "] (expected " + std::to_string(q.shape[i]) + ", got " + std::to_string(dout.shape[i]) + ")");
  if (dout.strides[3] != 1) fail("dout.strides[3] (head_dim stride) must be 1");
  return {dout.strides[0], dout.strides[1], dout.strides[2]};
}

void require_cpu(const TensorView& q, const TensorView& k, const TensorView& v, const char* api) {
  for (const TensorView* t : {&q, &k, &v})
    if (t->device.type != DeviceType::cpu)
      throw Error(ErrorKind::invalid_argument, std::string(api) + ": inputs must be on the cpu");
}

// Writes a contiguous double tensor into a strided view of `like`'s shape, in its dtype.
void store_view(const TensorView& like, void* data, DType dtype, const detail::ViewStrides& s,
                const std::vector<double>& values) {
  int64_t n = 0;
  for (int64_t b = 0; b < like.batch(); ++b)
    for (int64_t r = 0; r < like.seqlen(); ++r)
      for (int64_t h = 0; h < like.heads(); ++h)
        for (int64_t c = 0; c < like.head_dim(); ++c, ++n)
          detail::store_from_float(data, dtype, b * s.batch + r * s.row + h * s.head + c,
                                   static_cast<float>(values[n]));
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t n = 0; n < a.size(); ++n) m = std::max(m, std::fabs(a[n] - b[n]));
  return m;
}

}  // namespace

ReferenceGradients reference_attention_backward(const TensorView& q, const TensorView& k,
                                                const TensorView& v, const TensorView& dout,
                                                const Options& options,
                                                ReferencePrecision precision) {
  constexpr const char* api = "reference_attention_backward";
  require_cpu(q, k, v, api);
  const detail::ViewStrides s = check_dout(q, dout, api);
  return run_reference_backward(detail::validate({q, k, v, nullptr, nullptr, options, api}),
                                dout.data, s, options.dlse, precision);
}

ReferenceGradients reference_attention_backward_varlen(const TensorView& q, const TensorView& k,
                                                       const TensorView& v, const TensorView& dout,
                                                       const Varlen& varlen, const Options& options,
                                                       ReferencePrecision precision) {
  constexpr const char* api = "reference_attention_backward_varlen";
  require_cpu(q, k, v, api);
  detail::ViewStrides s = check_dout(q, dout, api);
  s.batch = 0;  // packed: (1, total_q, heads, head_dim)
  return run_reference_backward(detail::validate({q, k, v, nullptr, &varlen, options, api}),
                                dout.data, s, options.dlse, precision);
}

GradientVerification verify_gradients(const ReferenceGradients& exact,
                                      const ReferenceGradients* lowprec, const TensorView& dq,
                                      const TensorView& dk, const TensorView& dv,
                                      const float* dsinks) {
  for (const TensorView* t : {&dq, &dk, &dv})
    if (t->device.type != DeviceType::cpu)
      throw Error(ErrorKind::invalid_argument, "verify_gradients: gradients must be on the cpu");
  const bool fp32 = dq.dtype == DType::f32;
  if (!fp32 && lowprec == nullptr)
    throw Error(ErrorKind::invalid_argument, "verify_gradients: 16-bit gradients need the lowprec reference");
  auto rule = [&](const ErrorStats& stats, const std::vector<double>& ref,
                  const std::vector<double>* low, double& error, double& bound) {
    if (fp32) {
      error = stats.rel_l2();
      bound = 1e-5;
    } else {
      error = stats.max_abs;
      bound = 2 * max_abs_diff(*low, ref) + 1e-4;
    }
  };
  GradientVerification r;
  rule(compare_to_reference(dq, exact.dq), exact.dq, lowprec ? &lowprec->dq : nullptr, r.dq_error, r.dq_bound);
  rule(compare_to_reference(dk, exact.dk), exact.dk, lowprec ? &lowprec->dk : nullptr, r.dk_error, r.dk_bound);
  rule(compare_to_reference(dv, exact.dv), exact.dv, lowprec ? &lowprec->dv : nullptr, r.dv_error, r.dv_bound);
  if (dsinks != nullptr && !exact.dsinks.empty()) {
    const int64_t heads = int64_t(exact.dsinks.size());
    const TensorView view{const_cast<float*>(dsinks), DType::f32, Device::cpu(), {1, 1, 1, heads},
                          {heads, heads, heads, 1}};
    rule(compare_to_reference(view, exact.dsinks), exact.dsinks,
         lowprec ? &lowprec->dsinks : nullptr, r.dsinks_error, r.dsinks_bound);
    // dsinks sums -P_sink·D over every query row, and a 16-bit backward takes D = dO·out from
    // the rounded out: each row's D is off by up to u·Σ|dO·out| (u the unit roundoff), and
    // these add up over the rows, a random walk the baseline's own may happen to beat (it
    // did by 2.04x and 1.44x on a bf16 and an f16 case). The first-order bound joins the rule.
    if (!fp32) {
      const double unit = dq.dtype == DType::f16 ? 0x1p-11 : 0x1p-8;
      double sensitivity = 0;
      for (double x : exact.dsinks_out_sensitivity) sensitivity = std::max(sensitivity, x);
      r.dsinks_bound += 2 * unit * sensitivity;
    }
  }
  return r;
}

GradientVerification verify_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& dout, const TensorView& dq,
                                     const TensorView& dk, const TensorView& dv,
                                     const float* dsinks, const Options& options,
                                     const Varlen* varlen) {
  auto reference = [&](ReferencePrecision precision) {
    return varlen ? reference_attention_backward_varlen(q, k, v, dout, *varlen, options, precision)
                  : reference_attention_backward(q, k, v, dout, options, precision);
  };
  const ReferenceGradients exact = reference(ReferencePrecision::exact);
  if (q.dtype == DType::f32) return verify_gradients(exact, nullptr, dq, dk, dv, dsinks);
  const ReferenceGradients low = reference(ReferencePrecision::lowprec);
  return verify_gradients(exact, &low, dq, dk, dv, dsinks);
}

namespace detail {

// cpu_reference's backward: the double oracle, rounded out into the gradient views (unused
// key rows of a varlen batch get 0, as every backward writes them).
void run_reference_backward_backend(const BackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  const ReferenceGradients g =
      run_reference_backward(p, bp.dout, bp.dout_strides, bp.dlse, ReferencePrecision::exact);
  const int64_t b_q = p.is_varlen() ? 1 : p.batch, r_q = p.is_varlen() ? p.total_q : p.seqlen_q;
  const int64_t r_k = p.is_varlen() ? p.total_k : p.seqlen_k;
  const TensorView q_like{nullptr, p.dtype, Device::cpu(), {b_q, r_q, p.heads_q, p.head_dim}, {}};
  const TensorView k_like{nullptr, p.dtype, Device::cpu(), {b_q, r_k, p.heads_kv, p.head_dim}, {}};
  store_view(q_like, bp.dq, p.dtype, bp.dq_strides, g.dq);
  store_view(k_like, bp.dk, p.dtype, bp.dk_strides, g.dk);
  store_view(k_like, bp.dv, p.dtype, bp.dv_strides, g.dv);
  if (bp.dsinks != nullptr)
    for (int64_t h = 0; h < p.heads_q; ++h) bp.dsinks[h] = static_cast<float>(g.dsinks[h]);
}

// The double gradients it builds before rounding them out.
int64_t reference_backward_workspace_bytes(const BackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  const __int128 bytes =
      (__int128(q_rows(p)) * p.heads_q + 2 * __int128(k_rows(p)) * p.heads_kv) * p.head_dim *
      int64_t(sizeof(double));
  return bytes > INT64_MAX ? INT64_MAX : static_cast<int64_t>(bytes);
}

}  // namespace detail
}  // namespace flashtile
