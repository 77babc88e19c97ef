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
//    + 1e-5, where lowprec is standard attention in the input precision; the same for LSE.
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

}  // namespace flashtile
