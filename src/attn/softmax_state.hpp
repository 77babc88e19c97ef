// The online softmax (Milakov & Gimelshein 2018; FlashAttention): a running max m and a
// running denominator l, with the partial output rescaled whenever m grows. Every kernel,
// CPU and GPU, folds its blocks of scores through these functions, merges states of
// disjoint key ranges (split-KV, ring attention) with merge_states, adds a sink with
// add_sink and finalises with output_scale / log_sum_exp.
//
// For scores s_1..s_n seen so far, the invariant after each step is
//   m = max_j s_j,   l = Σ_j exp(s_j - m),   acc = Σ_j exp(s_j - m) · v_j,
// so the final output is acc / l and the log-sum-exp is m + log(l).
// Masking is the only source of an empty state: masked scores are -inf, and a row whose
// every score is masked keeps m = -inf, l = 0 and finalises to 0 with LSE = -inf. A NaN
// score never looks masked: it makes l NaN, and the row's output and LSE NaN. Scores are
// fp32 values: one beyond fp32's range is +-inf. A +inf score makes its row NaN (inf - inf),
// and a row that sees keys but scores every one -inf is NaN too (nan_if_no_finite_score):
// only masking empties a row.
#pragma once

#include <cmath>
#include <limits>

#include "common/host_device.hpp"

namespace flashtile::detail {

template <class T>
struct SoftmaxState {
  T m = -std::numeric_limits<T>::infinity();  // running max
  T l = T(0);                                 // running denominator, relative to m
};

// exp(x) for the scalar types the kernels use.
FT_HOST_DEVICE float softmax_exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);  // full precision: the fp32 kernels are held to 1e-5
#else
  return std::exp(x);
#endif
}
FT_HOST_DEVICE double softmax_exp(double x) { return std::exp(x); }
FT_HOST_DEVICE float softmax_log(float x) { return std::log(x); }
FT_HOST_DEVICE double softmax_log(double x) { return std::log(x); }

// The value to subtract from scores before exponentiating: m, or 0 while m is -inf (so a
// fully masked block gives exp(-inf - 0) = 0 instead of exp(-inf + inf) = NaN).
template <class T>
FT_HOST_DEVICE T safe_shift(T m) {
  return m == -std::numeric_limits<T>::infinity() ? T(0) : m;
}

// Moves the state to a new block whose largest score is `block_max`. Returns the factor
// alpha = exp(m_old - m_new) by which the caller scales its accumulator; l is rescaled
// here. The probabilities the caller then adds are exp(s - safe_shift(state.m)).
template <class T>
FT_HOST_DEVICE T online_softmax_rescale(SoftmaxState<T>& state, T block_max) {
  const T m_new = state.m > block_max ? state.m : block_max;
  if (m_new == -std::numeric_limits<T>::infinity()) return T(1);  // nothing seen yet
  const T alpha = softmax_exp(state.m - m_new);  // exp(-inf) = 0 on the first block
  state.l *= alpha;
  state.m = m_new;
  return alpha;
}

// One whole block at once: scores[0..n) become probabilities in place (relative to the
// new running max), l accumulates their sum, and the returned alpha rescales acc.
template <class T>
FT_HOST_DEVICE T online_softmax_block(SoftmaxState<T>& state, T* scores, int n) {
  T block_max = -std::numeric_limits<T>::infinity();
  for (int j = 0; j < n; ++j) block_max = scores[j] > block_max ? scores[j] : block_max;
  const T alpha = online_softmax_rescale(state, block_max);
  const T shift = safe_shift(state.m);
  T sum = T(0);
  for (int j = 0; j < n; ++j) {
    scores[j] = softmax_exp(scores[j] - shift);
    sum += scores[j];
  }
  state.l += sum;
  return alpha;
}

// The factors by which two accumulators are scaled when their states are merged.
template <class T>
struct MergeFactors {
  T self;   // for the accumulator of the state merged into
  T other;  // for the accumulator of the other state
};

// Folds `other`, the state of a disjoint set of scores, into `state`: the merged
// accumulator is self·acc + other·acc_other. Either state may be empty.
template <class T>
FT_HOST_DEVICE MergeFactors<T> merge_states(SoftmaxState<T>& state, const SoftmaxState<T>& other) {
  const T m = state.m > other.m ? state.m : other.m;
  if (m == -std::numeric_limits<T>::infinity()) return {T(1), T(0)};  // both empty
  const T self = softmax_exp(state.m - m), from_other = softmax_exp(other.m - m);
  state.l = state.l * self + other.l * from_other;
  state.m = m;
  return {self, from_other};
}

// The state of a finished partial result whose log-sum-exp is `lse` (its accumulator is
// the normalised partial output): what split-KV partials are merged from.
template <class T>
FT_HOST_DEVICE SoftmaxState<T> state_from_lse(T lse) {
  return lse == -std::numeric_limits<T>::infinity() ? SoftmaxState<T>{} : SoftmaxState<T>{lse, T(1)};
}

// A row that sees keys but whose every score came out -inf (a score below fp32's range,
// or -inf in an input) has no defined softmax; masking alone makes a row empty. Such a row
// becomes NaN, as in PyTorch's math backend. Applied after the last key, before a sink:
// to a state, and to the running max of a three-pass softmax.
template <class T>
FT_HOST_DEVICE void nan_if_no_finite_score(SoftmaxState<T>& state, bool row_sees_keys) {
  if (row_sees_keys && state.m == -std::numeric_limits<T>::infinity())
    state.l = std::numeric_limits<T>::quiet_NaN();
}
template <class T>
FT_HOST_DEVICE T nan_if_no_finite_score(T row_max, bool row_sees_keys) {
  return row_sees_keys && row_max == -std::numeric_limits<T>::infinity()
             ? std::numeric_limits<T>::quiet_NaN()
             : row_max;
}

// An attention sink: a logit that joins the denominator with no value (its accumulator is
// 0). Returns the factor for the row's accumulator. A sink of -inf changes nothing.
template <class T>
FT_HOST_DEVICE T add_sink(SoftmaxState<T>& state, T sink_logit) {
  return merge_states(state, SoftmaxState<T>{sink_logit, T(1)}).self;
}

// Factor that turns the accumulator into the output: 1/l, or 0 for an empty (fully
// masked) row. A NaN l stays NaN.
template <class T>
FT_HOST_DEVICE T output_scale(const SoftmaxState<T>& state) {
  return state.l == T(0) ? T(0) : T(1) / state.l;
}

// Natural-log log-sum-exp of all scores seen: m + log(l), or -inf for an empty row.
template <class T>
FT_HOST_DEVICE T log_sum_exp(const SoftmaxState<T>& state) {
  return state.l == T(0) ? -std::numeric_limits<T>::infinity() : state.m + softmax_log(state.l);
}

}  // namespace flashtile::detail
