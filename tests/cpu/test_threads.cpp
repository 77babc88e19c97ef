// Many host threads calling forward at once get bitwise the results of one thread: the
// backends keep no mutable global state between calls (cpu_flash picks its SIMD target
// once, under a static initialiser).
#include <gtest/gtest.h>

#include <thread>
#include <vector>

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
    std::vector<std::thread> threads;
    std::vector<std::string> errors(kThreads);
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        try {
          for (int repeat = 0; repeat < 3; ++repeat) {
            AttentionCase& c = cases[t];
            c.poison();
            forward(c.q.view, c.k.view, c.v.view, c.out.view, c.options(backend));
            if (c.out.bytes != serial_out[t] || c.lse != serial_lse[t])
              errors[t] = "differs from the serial result";
          }
        } catch (const std::exception& e) {
          errors[t] = e.what();
        }
      });
    for (std::thread& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t)
      EXPECT_EQ(errors[t], "") << backend_name(backend) << " thread " << t;
  }
}

}  // namespace
}  // namespace flashtile
