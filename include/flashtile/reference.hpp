// The oracle every test and `flashtile check` compares against: standard attention over
// CPU tensor views, with the same semantics as flashtile::forward (scale default, causal
// bottom-right, GQA, fully masked rows -> 0 and LSE = -inf).
#pragma once

#include <vector>

#include "flashtile/flashtile.hpp"

namespace flashtile {

enum class ReferencePrecision {
  exact,    // double throughout: the oracle
  lowprec,  // FlashAttention's "same precision" baseline: inputs in their dtype, S and P
            // rounded to the input dtype, fp32 accumulation, output rounded
};

struct ReferenceResult {
  std::vector<double> out;  // contiguous BSHD, shape of q
  std::vector<double> lse;  // contiguous [batch, heads_q, seqlen_q]
};

// q, k, v must be CPU views; they are validated as forward() would.
ReferenceResult reference_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const Options& options = {},
                                    ReferencePrecision precision = ReferencePrecision::exact);

struct ErrorStats {
  double max_abs = 0;    // max_i |out_i - ref_i|; +inf if any out_i is not finite
  double max_ref = 0;    // max_i |ref_i|
  double rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
};

// Compares a CPU view (any dtype, strided) with a contiguous reference of the same shape.
ErrorStats compare_to_reference(const TensorView& out, const std::vector<double>& ref);
// Compares an LSE buffer ([batch, heads, seqlen_q], fp32) with the reference LSE:
// -inf must match -inf exactly.
ErrorStats compare_lse(const float* lse, const std::vector<double>& ref);

// The accuracy rule of ../DESIGN (and FlashAttention's tests):
//  - float32: max|out - oracle| <= 1e-5 · max|oracle|  (relative error <= 1e-5);
//  - float16/bfloat16: max|out - oracle| <= 2 · max|lowprec - oracle| + 1e-5,
//    where lowprec is standard attention in the input precision; the same for LSE.
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
// from q, k, v with `options`; every view must be on the CPU (copy GPU results back first).
Verification verify_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const float* lse, const Options& options);

}  // namespace flashtile
