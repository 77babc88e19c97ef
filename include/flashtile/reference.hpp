// The oracle every test and `flashtile check` compares against: standard attention over
// CPU tensor views, with the same semantics as flashtile::forward: scale default, causal
// bottom-right and sliding windows, softcap, ALiBi, sinks, GQA, varlen; rows that see no key
// and have no sink -> 0 and LSE = -inf; a NaN in anything a row reads -> that row is NaN.
#pragma once

#include <cstdint>
#include <vector>

#include "flashtile/flashtile.hpp"

namespace flashtile {

enum class ReferencePrecision {
  exact,    // double throughout: the oracle
  lowprec,  // FlashAttention's "same precision" baseline: inputs in their dtype, S and P
            // rounded to the input dtype, fp32 accumulation, output rounded
};

struct ReferenceResult {
  std::vector<double> out;  // contiguous, shape of q
  std::vector<double> lse;  // contiguous [batch, heads_q, seqlen_q] ([heads_q, total_q] varlen)
};

// q, k, v (and the variant's parameters, and cu_seqlens) must be on the CPU; they are
// validated as forward() / forward_varlen() would.
ReferenceResult reference_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const Options& options = {},
                                    ReferencePrecision precision = ReferencePrecision::exact);
ReferenceResult reference_attention_varlen(const TensorView& q, const TensorView& k,
                                           const TensorView& v, const Varlen& varlen,
                                           const Options& options = {},
                                           ReferencePrecision precision = ReferencePrecision::exact);

// A query row in q's own coordinates: q[batch, row, head, :]. For a packed varlen batch,
// batch is 0 and row is the packed row.
struct QueryRow {
  int64_t batch = 0, row = 0, head = 0;
};

// The oracle on a few query rows only, for problems whose full oracle is too slow: what
// reference_attention (or reference_attention_varlen, when `varlen` is given) would give
// for those rows, every variant included. out is rows.size() × head_dim, lse rows.size().
ReferenceResult reference_attention_rows(const TensorView& q, const TensorView& k,
                                         const TensorView& v, const std::vector<QueryRow>& rows,
                                         const Options& options = {},
                                         const Varlen* varlen = nullptr,
                                         ReferencePrecision precision = ReferencePrecision::exact);

struct ErrorStats {
  double max_abs = 0;     // max_i |out_i - ref_i|; +inf if any out_i is not finite
  double max_ref = 0;     // max_i |ref_i|
  double sum_sq_err = 0;  // Σ (out_i - ref_i)²  (+inf if any out_i is not finite)
  double sum_sq_ref = 0;  // Σ ref_i²
  // Normwise relative error ‖out − ref‖₂ / ‖ref‖₂.
  double rel_l2() const;
};

// Compares a CPU view (any dtype, strided) with a contiguous reference of the same shape.
ErrorStats compare_to_reference(const TensorView& out, const std::vector<double>& ref);
// Compares an LSE buffer ([batch, heads, seqlen_q], fp32) with the reference LSE:
// -inf must match -inf exactly.
ErrorStats compare_lse(const float* lse, const std::vector<double>& ref);

// The accuracy rule:
//  - float32: normwise relative error ‖out − oracle‖₂ / ‖oracle‖₂ <= 1e-5, and for LSE
//    max|lse − oracle| <= 1e-5 · max(1, max|oracle|). (Normwise, because an output row is an
//    average of many ±values: its largest element can be tiny next to the terms summed, and
//    fp32 summation error scales with the terms, not with the cancelled result.)
//  - float16/bfloat16 (FlashAttention's rule): max|out − oracle| <= 2 · max|lowprec − oracle|
//    + atol, where lowprec is standard attention in the input precision and atol is
//    FlashAttention-3's: max(1e-5, 2 · max|fl(fl(fl(o) + 0.3) − 0.3) − fl(o)|) over the
//    oracle's outputs o rounded to the dtype (about one unit in the last place at 0.3); the
//    same for LSE with atol 1e-5 (the LSE is fp32).
// Any non-finite output where the oracle is finite fails.
struct Verification {
  double out_error = 0, out_bound = 0;
  double lse_error = 0, lse_bound = 0;  // 0/0 when no LSE was given
  bool pass() const { return out_error <= out_bound && lse_error <= lse_bound; }
};

// Applies the rule to `out` (and `lse` when non-null) given the oracle and, for 16-bit
// dtypes, the low-precision baseline (required then; ignored for float32).
Verification verify_against(const ReferenceResult& exact, const ReferenceResult* lowprec,
                            const TensorView& out, const float* lse);

// Computes the references and applies the rule to `out` (and `lse` when non-null) computed
// from q, k, v with `options` (over a varlen batch when `varlen` is given); every view must
// be on the CPU (copy GPU results back first).
Verification verify_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const float* lse, const Options& options,
                            const Varlen* varlen = nullptr);

// ---- the backward pass (docs/BACKWARD.md) -----------------------------------------------

struct ReferenceGradients {
  std::vector<double> dq, dk, dv;  // contiguous, the shapes of q, k, v (unused key rows: 0)
  std::vector<double> dsinks;      // (heads_q); empty without sinks
  // (heads_q) Σ_rows P_sink·Σ_c |dO·O|: how much dsinks moves per unit of relative error in
  // out, which a 16-bit backward receives rounded (its D, and so dsinks, inherit that).
  std::vector<double> dsinks_out_sensitivity;
};

// The gradient of sum(out ∘ dout) + sum(lse ∘ options.dlse) (the second term only when
// options.dlse is given: fp32 on the CPU, the LSE's shape) with respect to q, k, v (and
// the sinks), out and lse being reference_attention(q, k, v, options). `exact`
// differentiates in double, recomputing P and D = rowsum(dout∘out) itself (nothing of a
// forward run is used). `lowprec` is the 16-bit baseline of FlashAttention's rule: what a
// reference in the input dtype computes, fp32 arithmetic with S, P, out, dP, D and dS each
// rounded to the input dtype (D - dlse in fp32) and the gradients rounded at the end
// (dsinks stay fp32). q, k, v, dout must be on the CPU;
// dout has q's shape and dtype.
ReferenceGradients reference_attention_backward(
    const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
    const Options& options = {}, ReferencePrecision precision = ReferencePrecision::exact);
ReferenceGradients reference_attention_backward_varlen(
    const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
    const Varlen& varlen, const Options& options = {},
    ReferencePrecision precision = ReferencePrecision::exact);

// The backward rule on each of dq, dk, dv and dsinks:
//  - float32: normwise relative error <= 1e-5 against the oracle;
//  - float16/bfloat16: max|g − g_oracle| <= 2·max|g_lowprec − g_oracle| + 1e-4; for dsinks,
//    a sum over every query row, plus 2·u·max_h dsinks_out_sensitivity (u the dtype's unit
//    roundoff): the rounding of out, which every row's D inherits, adds up over the rows
//    (see verify_gradients).
// A non-finite gradient where the oracle is finite fails.
struct GradientVerification {
  double dq_error = 0, dq_bound = 0, dk_error = 0, dk_bound = 0, dv_error = 0, dv_bound = 0;
  double dsinks_error = 0, dsinks_bound = 0;  // 0/0 when no dsinks were given
  bool pass() const {
    return dq_error <= dq_bound && dk_error <= dk_bound && dv_error <= dv_bound &&
           dsinks_error <= dsinks_bound;
  }
};

// Computes the references and applies the rule to dq, dk, dv (and dsinks when non-null)
// computed from q, k, v, dout with `options` (over `varlen` when given); all on the CPU.
GradientVerification verify_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& dout, const TensorView& dq,
                                     const TensorView& dk, const TensorView& dv,
                                     const float* dsinks, const Options& options,
                                     const Varlen* varlen = nullptr);
// The same rule against references already computed (lowprec: needed for 16-bit dtypes).
GradientVerification verify_gradients(const ReferenceGradients& exact,
                                      const ReferenceGradients* lowprec, const TensorView& dq,
                                      const TensorView& dk, const TensorView& dv,
                                      const float* dsinks);

}  // namespace flashtile
