// `flashtile check`: every available backend against the double-precision oracle on
// random shapes (odd lengths, seqlen_q != seqlen_k, causal, GQA/MQA, strided views, every
// dtype the backend takes). Exits 1 on any failure.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>

#include "commands.hpp"
#include "flashtile/reference.hpp"
#include "workload.hpp"

namespace flashtile::cli {
namespace {

Shape random_shape(std::mt19937& rng, int64_t max_seqlen) {
  static const int64_t kLengths[] = {1, 2, 17, 31, 63, 64, 65, 113, 127, 128, 129, 200, 255, 257,
                                     1023, 1025};
  static const int64_t kHeadDims[] = {32, 64, 128, 64, 128, 8, 16, 40, 72, 96, 256};
  auto pick_length = [&] {
    std::vector<int64_t> allowed;
    for (int64_t l : kLengths)
      if (l <= max_seqlen) allowed.push_back(l);
    std::uniform_int_distribution<size_t> any(0, allowed.size() - 1);
    std::uniform_int_distribution<int64_t> uniform(1, max_seqlen);
    return rng() % 3 == 0 ? uniform(rng) : allowed[any(rng)];
  };
  Shape s;
  s.seqlen_q = pick_length();
  s.seqlen_k = pick_length();
  s.head_dim = kHeadDims[rng() % std::size(kHeadDims)];
  s.batch = 1 + rng() % 2;
  s.heads_kv = 1 + rng() % 3;
  s.heads_q = s.heads_kv * (1 + rng() % 3);  // MHA, GQA or MQA
  s.causal = rng() % 2;
  s.strided = rng() % 2;
  return s;
}

struct Tally {
  int run = 0, passed = 0, failed = 0, unsupported = 0;
  double worst_ratio = 0;  // max error / bound over the shapes run
};

}  // namespace

int run_check(const CheckOptions& o) {
  if (o.threads > 0) omp_set_num_threads(o.threads);
  std::vector<Backend> backends;
  if (o.backends.empty()) {
    for (Backend b : all_backends())
      if (backend_available(b)) backends.push_back(b);
  } else {
    backends = parse_backend_list(o.backends);
    for (Backend b : backends)
      if (!backend_available(b))
        throw Error(ErrorKind::unsupported, std::string(backend_name(b)) +
                                                " is not available: " + backend_unavailable_reason(b));
  }
  for (Backend b : all_backends())
    if (!backend_available(b))
      std::printf("not checked: %s (%s)\n", std::string(backend_name(b)).c_str(),
                  backend_unavailable_reason(b).c_str());

  std::mt19937 rng(o.seed);
  std::map<std::pair<Backend, DType>, Tally> tallies;
  std::map<Backend, int> runs;  // shapes run per backend (in any of its dtypes)
  int failures_shown = 0;
  // Draw until every backend has run `shapes` shapes it supports (a backend that takes few
  // head dims needs more draws), with a cap so an unsupported backend cannot spin forever.
  auto needs_more = [&](Backend b) { return runs[b] < o.shapes; };
  const int max_draws = 20 * o.shapes;
  int draws = 0;
  while (draws < max_draws && std::any_of(backends.begin(), backends.end(), needs_more)) {
    const int n = draws++;
    Shape base = random_shape(rng, o.max_seqlen);
    std::vector<Backend> wanted;
    for (Backend b : backends)
      if (needs_more(b)) wanted.push_back(b);
    std::set<Backend> ran_this_draw;
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      Shape shape = base;
      shape.dtype = dtype;
      Workload work(shape, o.seed + n);
      std::optional<ReferenceResult> exact, lowprec;
      for (Backend backend : wanted) {
        Tally& tally = tallies[{backend, dtype}];
        try {
          plan_for(work, backend);
        } catch (const Error&) {
          ++tally.unsupported;
          continue;
        }
        if (!exact) {
          Options ref;
          ref.causal = shape.causal;
          const AttentionCase& h = work.host;
          exact = reference_attention(h.q.view, h.k.view, h.v.view, ref);
          if (dtype != DType::f32)
            lowprec = reference_attention(h.q.view, h.k.view, h.v.view, ref,
                                          ReferencePrecision::lowprec);
        }
        ++tally.run;
        ran_this_draw.insert(backend);
        run_once(work, backend);
        const Verification v = verify_against(*exact, lowprec ? &*lowprec : nullptr,
                                              work.host.out.view, work.host.lse.data());
        const double ratio = std::max(v.out_error / std::max(v.out_bound, 1e-300),
                                      v.lse_error / std::max(v.lse_bound, 1e-300));
        tally.worst_ratio = std::max(tally.worst_ratio, ratio);
        if (v.pass()) {
          ++tally.passed;
        } else {
          ++tally.failed;
          if (failures_shown++ < 20)
            std::printf("FAIL %s %s: out err %.3g (bound %.3g), lse err %.3g (bound %.3g)\n",
                        std::string(backend_name(backend)).c_str(), shape.describe().c_str(),
                        v.out_error, v.out_bound, v.lse_error, v.lse_bound);
        }
      }
    }
    for (Backend b : ran_this_draw) ++runs[b];
    if ((n + 1) % 20 == 0) std::fprintf(stderr, "drew %d shapes\n", n + 1);
  }

  std::printf("\n%-14s %-9s %6s %6s %6s %12s %16s  %s\n", "backend", "dtype", "run", "pass",
              "fail", "unsupported", "worst err/bound", "result");
  bool any_failed = false;
  for (Backend backend : backends) {
    const int backend_runs = runs[backend];
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      const Tally& t = tallies[{backend, dtype}];
      if (t.run == 0) continue;
      any_failed |= t.failed > 0;
      std::printf("%-14s %-9s %6d %6d %6d %12d %16.3f  %s\n",
                  std::string(backend_name(backend)).c_str(),
                  std::string(dtype_name(dtype)).c_str(), t.run, t.passed, t.failed,
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
