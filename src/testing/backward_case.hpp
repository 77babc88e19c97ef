// A backward case, shared by the test suites and the CLI (`check --pass bwd`, `bench --pass
// bwd`): an AttentionCase whose out and lse come from the oracle's forward (cpu_reference), a
// random dout (never zeros) and NaN-poisoned gradients dq, dk, dv (and dsinks), in the
// layouts of q, k, v (strided when the shape is); with draw_lse_gradient, also a random
// gradient into the LSE (options.dlse) that the backward and the oracle both take.
#pragma once

#include <algorithm>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "flashtile/reference.hpp"
#include "testing/attention_case.hpp"

namespace flashtile::testing {

struct BackwardCase {
  AttentionCase fwd;
  HostTensor dout, dq, dk, dv;
  std::vector<float> dsinks;  // heads_q when the variant has sinks, else empty
  std::vector<float> dlse;    // the LSE's shape when drawn, else empty (no gradient into it)

  explicit BackwardCase(const Shape& s, uint32_t seed = 1234)
      : fwd(s, seed),
        dout(s.dtype, fwd.shape.q_shape(), s.strided),
        dq(s.dtype, fwd.shape.q_shape(), s.strided),
        dk(s.dtype, fwd.shape.kv_shape(), s.strided),
        dv(s.dtype, fwd.shape.kv_shape(), s.strided) {
    std::mt19937 rng(seed + 1);
    dout.fill_random(rng);
    testing::run_forward(fwd.q.view, fwd.k.view, fwd.v.view, fwd.out.view,
                         fwd.options(Backend::cpu_reference), fwd.varlen());
    if (fwd.shape.sinks) dsinks.resize(size_t(s.heads_q));
    poison();
  }

  // A random ∂loss/∂lse for every LSE element, rows that see nothing included (they must
  // stay free of NaN: their lse is -inf and P = 0).
  void draw_lse_gradient(uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    dlse.resize(fwd.lse.size());
    for (float& g : dlse) g = uniform(rng);
  }

  void poison() {
    dq.poison();
    dk.poison();
    dv.poison();
    std::fill(dsinks.begin(), dsinks.end(), std::numeric_limits<float>::quiet_NaN());
  }

  // The case's options for backward (no lse: it is an argument), dsinks when it has sinks.
  Options options(Backend backend, bool deterministic = false) {
    Options o = fwd.reference_options();
    o.backend = backend;
    o.deterministic = deterministic;
    o.dsinks = dsinks.empty() ? nullptr : dsinks.data();
    o.dlse = dlse.empty() ? nullptr : dlse.data();
    return o;
  }

  void run(Backend backend, bool deterministic = false) {
    const Options o = options(backend, deterministic);
    if (const std::optional<Varlen> vl = fwd.varlen())
      backward_varlen(fwd.q.view, fwd.k.view, fwd.v.view, fwd.out.view, dout.view, fwd.lse.data(),
                      dq.view, dk.view, dv.view, *vl, o);
    else
      backward(fwd.q.view, fwd.k.view, fwd.v.view, fwd.out.view, dout.view, fwd.lse.data(),
               dq.view, dk.view, dv.view, o);
  }

  GradientVerification verify() const {
    Options o = fwd.reference_options();
    o.dlse = dlse.empty() ? nullptr : dlse.data();
    const std::optional<Varlen> vl = fwd.varlen();
    return verify_backward(fwd.q.view, fwd.k.view, fwd.v.view, dout.view, dq.view, dk.view, dv.view,
                           dsinks.empty() ? nullptr : dsinks.data(), o, vl ? &*vl : nullptr);
  }

  // The gradients' bytes (dq, dk, dv, dsinks), for bitwise comparisons.
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> all(dq.bytes.begin(), dq.bytes.end());
    all.insert(all.end(), dk.bytes.begin(), dk.bytes.end());
    all.insert(all.end(), dv.bytes.begin(), dv.bytes.end());
    const auto* s = reinterpret_cast<const unsigned char*>(dsinks.data());
    all.insert(all.end(), s, s + dsinks.size() * sizeof(float));
    return all;
  }
};

}  // namespace flashtile::testing
