// `flashtile check`: every available backend against the double-precision oracle on
// random shapes (odd lengths, seqlen_q != seqlen_k, causal, GQA/MQA, strided views, every
// dtype the backend takes) and random variants (windows, softcap, ALiBi, sinks, varlen
// batches with empty and length-1 sequences and seqused_k) for the backends that take them.
// `--pass bwd` checks the gradients instead (dq, dk, dv, dsinks against the oracle's, the
// backward rule of flashtile/reference.hpp) for the backends that have a backward pass; a
// third of its draws also give a random gradient into the LSE (options.dlse; " dlse" after
// the shape in a FAIL line). Exits 1 on any failure.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "commands.hpp"
#include "flashtile/reference.hpp"
#include "workload.hpp"

namespace flashtile::cli {
namespace {

int64_t pick_length(std::mt19937& rng, int64_t max_seqlen) {
  static const int64_t kLengths[] = {1, 2, 17, 31, 63, 64, 65, 113, 127, 128, 129, 200, 255, 257,
                                     1023, 1025};
  std::vector<int64_t> allowed;
  for (int64_t l : kLengths)
    if (l <= max_seqlen) allowed.push_back(l);
  std::uniform_int_distribution<size_t> any(0, allowed.size() - 1);
  std::uniform_int_distribution<int64_t> uniform(1, max_seqlen);
  return rng() % 3 == 0 ? uniform(rng) : allowed[any(rng)];
}

Shape random_dense_shape(std::mt19937& rng, int64_t max_seqlen) {
  static const int64_t kHeadDims[] = {32, 64, 128, 64, 128, 8, 16, 40, 72, 96, 256};
  Shape s;
  s.seqlen_q = pick_length(rng, max_seqlen);
  s.seqlen_k = pick_length(rng, max_seqlen);
  s.head_dim = kHeadDims[rng() % std::size(kHeadDims)];
  s.batch = 1 + rng() % 2;
  s.heads_kv = 1 + rng() % 3;
  s.heads_q = s.heads_kv * (1 + rng() % 3);  // MHA, GQA or MQA
  s.causal = rng() % 2;
  s.strided = rng() % 2;
  return s;
}

// A packed batch of 1-5 sequences, empty and length-1 sequences included (but at least one
// query and one key overall: tensors cannot be empty), optionally with seqused_k.
void make_varlen(Shape& s, std::mt19937& rng, int64_t max_seqlen) {
  auto length = [&] {
    switch (rng() % 6) {
      case 0: return int64_t(0);
      case 1: return int64_t(1);
      default: return pick_length(rng, max_seqlen);
    }
  };
  const int sequences = 1 + rng() % 5;
  do {
    s.varlen_q.clear();
    s.varlen_k.clear();
    for (int b = 0; b < sequences; ++b) {
      s.varlen_q.push_back(length());
      s.varlen_k.push_back(rng() % 3 == 0 ? s.varlen_q.back() : length());
    }
  } while (s.total_q() == 0 || s.total_k() == 0);
  s.seqused_k.clear();
  if (rng() % 2)
    for (int64_t keys : s.varlen_k)
      s.seqused_k.push_back(rng() % 3 == 0 ? keys : int64_t(rng() % (keys + 1)));
}

// One side of a window: 0 (only the diagonal), small, or past every key (normalised away).
int64_t window_side(std::mt19937& rng, int64_t max_seqlen) {
  switch (rng() % 4) {
    case 0: return 0;
    case 1: return max_seqlen + int64_t(rng() % 8);
    default: return int64_t(rng() % (max_seqlen / 2 + 1));
  }
}

// A shape with at least one feature beyond full/causal attention: a window (left, right or
// both, with or without causal), softcap, ALiBi ((heads) or (batch, heads)), sinks, or a
// varlen batch; a quarter of them with any head_dim in 1..256.
Shape random_variant_shape(std::mt19937& rng, int64_t max_seqlen) {
  static const float kSoftcaps[] = {0.5f, 1.0f, 2.0f, 30.0f};
  Shape s = random_dense_shape(rng, max_seqlen);
  if (rng() % 4 == 0) s.head_dim = 1 + int64_t(rng() % 256);
  do {
    if (rng() % 2) {
      switch (rng() % 3) {
        case 0: s.window = {window_side(rng, max_seqlen), -1}; break;
        case 1: s.window = {-1, window_side(rng, max_seqlen)}; break;
        default: s.window = {window_side(rng, max_seqlen), window_side(rng, max_seqlen)};
      }
    }
    if (rng() % 3 == 0) s.softcap = kSoftcaps[rng() % std::size(kSoftcaps)];
    if (rng() % 3 == 0) {
      s.alibi = true;
      s.alibi_per_batch = rng() % 2;
    }
    if (rng() % 3 == 0) s.sinks = true;
    if (rng() % 3 == 0) make_varlen(s, rng, max_seqlen);
  } while (!s.has_variant());
  return s;
}

// Whether `backend` has a backward pass: its plan on a small dense case in some dtype and
// head dim (cuda_mma's backward serves 16-bit only, cuda_sm90's head dims 64 and 128).
bool has_backward(Backend backend) {
  for (DType dtype : {DType::f32, DType::bf16})
    for (int64_t head_dim : {16, 64}) {
      Shape s;
      s.seqlen_q = s.seqlen_k = 8;
      s.head_dim = head_dim;
      s.dtype = dtype;
      Workload work(s);
      try {
        plan_backward_for(work, backend);
        return true;
      } catch (const Error&) {
      }
    }
  return false;
}

// The oracle's gradients (or their 16-bit baseline) for the workload's dout.
ReferenceGradients reference_gradients(Workload& work, ReferencePrecision precision) {
  const AttentionCase& h = work.host;
  const Gradients& g = work.gradients();
  const std::optional<Varlen> varlen = h.varlen();
  Options options = h.reference_options();
  options.dlse = g.dlse.empty() ? nullptr : g.dlse.data();
  return varlen ? reference_attention_backward_varlen(h.q.view, h.k.view, h.v.view, g.dout.view,
                                                      *varlen, options, precision)
                : reference_attention_backward(h.q.view, h.k.view, h.v.view, g.dout.view,
                                               options, precision);
}

struct Tally {
  int run = 0, passed = 0, failed = 0, unsupported = 0;
  int variants = 0;  // runs whose shape had a variant
  double worst_ratio = 0;  // max error / bound over the shapes run
};

// What one backend did with one draw in one dtype.
struct Outcome {
  Backend backend = Backend::automatic;
  DType dtype = DType::f32;
  bool ran = false, passed = false;
  double ratio = 0;     // error / bound
  std::string failure;  // the FAIL line
};
struct DrawResult {
  bool variant = false;  // the validated shape kept a variant
  std::vector<Outcome> outcomes;
};

// error / bound, safe for a zero bound.
double bound_ratio(double error, double bound) { return error / std::max(bound, 1e-300); }

// The backend's out and lse under the forward rule against the oracle's (computed once per
// dtype: `exact` and `lowprec` start empty).
void check_outputs(Workload& work, Backend backend, std::optional<ReferenceResult>& exact,
                   std::optional<ReferenceResult>& lowprec, Outcome& outcome) {
  if (!exact) {
    exact = work.host.reference();
    if (work.host.shape.dtype != DType::f32) lowprec = work.host.reference(ReferencePrecision::lowprec);
  }
  run_once(work, backend);
  const Verification v = verify_against(*exact, lowprec ? &*lowprec : nullptr,
                                        work.host.out.view, work.host.lse.data());
  outcome.ran = true;
  outcome.passed = v.pass();
  outcome.ratio = std::max(bound_ratio(v.out_error, v.out_bound), bound_ratio(v.lse_error, v.lse_bound));
  if (!outcome.passed) {
    char line[512];
    std::snprintf(line, sizeof line, "FAIL %s %s: out err %.3g (bound %.3g), lse err %.3g (bound %.3g)\n",
                  std::string(backend_name(backend)).c_str(), work.host.shape.describe().c_str(),
                  v.out_error, v.out_bound, v.lse_error, v.lse_bound);
    outcome.failure = line;
  }
}

// --pass bwd: the backend's gradients, from its own forward's out and lse, under the backward
// rule against the oracle's (computed once per dtype).
void check_gradients(Workload& work, Backend backend, std::optional<ReferenceGradients>& exact,
                     std::optional<ReferenceGradients>& lowprec, Outcome& outcome) {
  run_once(work, backend);  // the out and lse the backward starts from
  run_backward_once(work, backend);
  const Gradients& g = work.gradients();
  if (!exact) {
    exact = reference_gradients(work, ReferencePrecision::exact);
    if (work.host.shape.dtype != DType::f32)
      lowprec = reference_gradients(work, ReferencePrecision::lowprec);
  }
  const GradientVerification v =
      verify_gradients(*exact, lowprec ? &*lowprec : nullptr, g.dq.view, g.dk.view, g.dv.view,
                       g.dsinks.empty() ? nullptr : g.dsinks.data());
  outcome.ran = true;
  outcome.passed = v.pass();
  outcome.ratio = std::max({bound_ratio(v.dq_error, v.dq_bound), bound_ratio(v.dk_error, v.dk_bound),
                            bound_ratio(v.dv_error, v.dv_bound),
                            bound_ratio(v.dsinks_error, v.dsinks_bound)});
  if (!outcome.passed) {
    char line[640];
    std::snprintf(line, sizeof line,
                  "FAIL %s %s%s: dq err %.3g (bound %.3g), dk err %.3g (bound %.3g), dv err %.3g "
                  "(bound %.3g), dsinks err %.3g (bound %.3g)\n",
                  std::string(backend_name(backend)).c_str(), work.host.shape.describe().c_str(),
                  g.dlse.empty() ? "" : " dlse",
                  v.dq_error, v.dq_bound, v.dk_error, v.dk_bound, v.dv_error, v.dv_bound,
                  v.dsinks_error, v.dsinks_bound);
    outcome.failure = line;
  }
}

// One draw: the shape in every dtype, the oracle once per dtype, then each wanted backend.
// Runs on one thread (the oracle's own parallel loop is nested, hence serial, here).
DrawResult run_draw(const Shape& base, uint32_t seed, const std::vector<Backend>& wanted,
                    Pass pass) {
  DrawResult result;
  // A third of the backward's draws also take a random gradient into the LSE; drawn from
  // the draw's own seed, so the shapes stay those of the shared generator.
  const bool lse_gradient = pass == Pass::bwd && std::mt19937(seed ^ 0x4c5345u)() % 3 == 0;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    Shape shape = base;
    shape.dtype = dtype;
    Workload work(shape, seed);
    if (lse_gradient) work.gradients().draw_lse_gradient(seed);
    result.variant = host_params(work).has_variant();
    std::optional<ReferenceResult> exact, lowprec;
    std::optional<ReferenceGradients> exact_grads, lowprec_grads;
    for (Backend backend : wanted) {
      Outcome outcome;
      outcome.backend = backend;
      outcome.dtype = dtype;
      try {
        plan_for(work, backend);
        if (pass == Pass::bwd) plan_backward_for(work, backend);
      } catch (const Error&) {
        result.outcomes.push_back(outcome);  // unsupported
        continue;
      }
      if (pass == Pass::bwd)
        check_gradients(work, backend, exact_grads, lowprec_grads, outcome);
      else
        check_outputs(work, backend, exact, lowprec, outcome);
      result.outcomes.push_back(outcome);
    }
  }
  return result;
}

// The score pairs a draw's oracle computes, per head dim unit: what its run time scales with.
double estimated_work(const Shape& s) {
  double pairs = 0;
  if (s.is_varlen()) {
    for (size_t b = 0; b < s.varlen_q.size(); ++b) pairs += double(s.varlen_q[b]) * double(s.varlen_k[b]);
  } else {
    pairs = double(s.batch) * double(s.seqlen_q) * double(s.seqlen_k);
  }
  return pairs * double(s.heads_q) * double(s.head_dim);
}

// The order to run a batch's draws in: the heaviest first, so that a long draw does not start
// last and hold the whole batch (draw costs span four orders of magnitude).
std::vector<int> heaviest_first(const std::vector<Shape>& shapes) {
  std::vector<int> order(shapes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return estimated_work(shapes[size_t(a)]) > estimated_work(shapes[size_t(b)]);
  });
  return order;
}

}  // namespace

int run_check(const CheckOptions& o) {
  if (o.threads > 0) omp_set_num_threads(o.threads);
  std::vector<Backend> backends;
  if (o.backends.empty()) {
    for (Backend b : all_backends())
      if (backend_available(b) && (o.pass == Pass::fwd || has_backward(b))) backends.push_back(b);
  } else {
    backends = parse_backend_list(o.backends);
    for (Backend b : backends)
      if (!backend_available(b))
        throw Error(ErrorKind::unsupported, std::string(backend_name(b)) +
                                                " is not available: " + backend_unavailable_reason(b));
  }
  for (Backend b : all_backends()) {
    if (!backend_available(b))
      std::printf("not checked: %s (%s)\n", std::string(backend_name(b)).c_str(),
                  backend_unavailable_reason(b).c_str());
    else if (o.pass == Pass::bwd && !has_backward(b))
      std::printf("not checked: %s (no backward pass)\n", std::string(backend_name(b)).c_str());
  }
  if (o.pass == Pass::bwd) std::printf("checking the backward pass: dq, dk, dv, dsinks\n");

  std::mt19937 rng(o.seed);
  std::map<std::pair<Backend, DType>, Tally> tallies;
  std::map<Backend, int> runs;  // shapes run per backend (in any of its dtypes)
  // Variant draws a backend ran (in some dtype) or refused (in every dtype).
  std::map<Backend, int> variant_runs, variant_refusals;
  int failures_shown = 0;
  // Draw until every backend has run `shapes` shapes it supports (a backend that takes few
  // head dims needs more draws), with a cap so an unsupported backend cannot spin forever.
  auto needs_more = [&](Backend b) { return runs[b] < o.shapes; };
  // Half the draws carry a variant while some backend still counting may take one; the
  // journey steps refuse them all, so once the others are done the draws are dense.
  constexpr int kVariantProbes = 20;
  auto may_take_variants = [&](Backend b) {
    return variant_runs[b] > 0 || variant_refusals[b] < kVariantProbes;
  };
  const int max_draws = 20 * o.shapes;
  // Draws run in batches, one draw per thread: the shapes are drawn in order from the one
  // generator and the results folded in draw order, so the report does not depend on the
  // thread count or on the order a batch runs in. A batch ends on its slowest thread, so it
  // is long (32 draws a thread) and runs heaviest first; it may take a backend past `shapes`.
  const int batch_size = 32 * omp_get_max_threads();
  int draws = 0;
  while (draws < max_draws && std::any_of(backends.begin(), backends.end(), needs_more)) {
    std::vector<Backend> wanted;
    for (Backend b : backends)
      if (needs_more(b)) wanted.push_back(b);
    const bool variant_wanted = std::any_of(wanted.begin(), wanted.end(), may_take_variants);
    // No longer than the neediest backend still needs (but not so short that threads idle).
    int still_needed = 0;
    for (Backend b : wanted) still_needed = std::max(still_needed, o.shapes - runs[b]);
    const int batch = std::min({batch_size, std::max(still_needed, 4 * omp_get_max_threads()),
                                max_draws - draws});
    std::vector<Shape> shapes;
    for (int i = 0; i < batch; ++i)
      shapes.push_back(variant_wanted && rng() % 2 == 0 ? random_variant_shape(rng, o.max_seqlen)
                                                        : random_dense_shape(rng, o.max_seqlen));
    std::vector<DrawResult> results(static_cast<size_t>(batch));
    std::vector<std::string> errors(static_cast<size_t>(batch));
    const std::vector<int> order = heaviest_first(shapes);
#pragma omp parallel for schedule(dynamic, 1)
    for (int n = 0; n < batch; ++n) {
      const int i = order[size_t(n)];
      try {
        results[i] = run_draw(shapes[i], o.seed + uint32_t(draws + i), wanted, o.pass);
      } catch (const std::exception& e) {
        errors[i] = e.what();  // rethrown below, outside the parallel region
      }
    }
    for (int i = 0; i < batch; ++i) {
      if (!errors[i].empty()) throw Error(ErrorKind::runtime, errors[i]);
      const DrawResult& r = results[i];
      std::set<Backend> ran_this_draw;
      for (const Outcome& outcome : r.outcomes) {
        Tally& tally = tallies[{outcome.backend, outcome.dtype}];
        if (!outcome.ran) {
          ++tally.unsupported;
          continue;
        }
        ++tally.run;
        tally.variants += r.variant;
        ran_this_draw.insert(outcome.backend);
        tally.worst_ratio = std::max(tally.worst_ratio, outcome.ratio);
        if (outcome.passed) {
          ++tally.passed;
        } else {
          ++tally.failed;
          if (failures_shown++ < 20) std::fputs(outcome.failure.c_str(), stdout);
        }
      }
      for (Backend b : ran_this_draw) ++runs[b];
      if (r.variant)
        for (Backend b : wanted) ++(ran_this_draw.count(b) ? variant_runs[b] : variant_refusals[b]);
    }
    draws += batch;
    std::fprintf(stderr, "drew %d shapes\n", draws);
  }

  std::printf("\n%-14s %-9s %6s %9s %6s %6s %12s %16s  %s\n", "backend", "dtype", "run",
              "variants", "pass", "fail", "unsupported", "worst err/bound", "result");
  bool any_failed = false;
  for (Backend backend : backends) {
    const int backend_runs = runs[backend];
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      const Tally& t = tallies[{backend, dtype}];
      if (t.run == 0) continue;
      any_failed |= t.failed > 0;
      std::printf("%-14s %-9s %6d %9d %6d %6d %12d %16.3f  %s\n",
                  std::string(backend_name(backend)).c_str(),
                  std::string(dtype_name(dtype)).c_str(), t.run, t.variants, t.passed, t.failed,
                  t.unsupported, t.worst_ratio, t.failed ? "FAIL" : "pass");
    }
    if (backend_runs < o.shapes) {
      std::printf("%-14s ran only %d of %d shapes (the others were unsupported)\n",
                  std::string(backend_name(backend)).c_str(), backend_runs, o.shapes);
      any_failed = true;
    }
  }
  std::printf("%s\n", any_failed ? "check FAILED" : "check passed");
  return any_failed ? 1 : 0;
}

}  // namespace flashtile::cli
