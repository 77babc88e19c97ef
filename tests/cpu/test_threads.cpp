// Many host threads calling forward at once get bitwise the results of one thread: the
// backends keep no mutable global state between calls (cpu_flash picks its SIMD target
// once, under a static initialiser).
#include <gtest/gtest.h>

#include <vector>

#include "support/concurrent_runs.hpp"
#include "testing/attention_case.hpp"

namespace flashtile {
namespace {

using testing::AttentionCase;
using testing::Shape;

TEST(Threads, ConcurrentCallsMatchSerialOnesBitwise) {
  constexpr int kThreads = 8;
  std::vector<Backend> backends;
  for (Backend b : {Backend::cpu_flash, Backend::cpu_standard, Backend::cpu_reference})
    if (backend_available(b)) backends.push_back(b);
  for (Backend backend : backends) {
    std::vector<AttentionCase> cases;
    for (int t = 0; t < kThreads; ++t) {
      Shape s;
      s.batch = 1 + t % 2, s.heads_q = 4, s.heads_kv = 2, s.head_dim = 32;
      s.seqlen_q = 60 + 7 * t, s.seqlen_k = 90 + 5 * t;
      s.causal = t % 2 == 1;
      s.dtype = t % 3 == 0 ? DType::bf16 : DType::f32;
      cases.emplace_back(s, 100 + t);
    }
    std::vector<testing::HostBytes> serial_out;
    std::vector<std::vector<float>> serial_lse;
    for (AttentionCase& c : cases) {
      forward(c.q.view, c.k.view, c.v.view, c.out.view, c.options(backend));
      serial_out.push_back(c.out.bytes);
      serial_lse.push_back(c.lse);
      c.poison();
    }
    testing::expect_concurrent_runs_match(
        kThreads, /*repeats=*/3, cases, serial_out, serial_lse,
        [&](int t) {
          AttentionCase& c = cases[t];
          forward(c.q.view, c.k.view, c.v.view, c.out.view, c.options(backend));
        },
        std::string(backend_name(backend)));
  }
}

}  // namespace
}  // namespace flashtile
