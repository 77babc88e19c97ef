// Runs a call on many host threads at once, each repeating it against its own serial result:
// the thread-safety tests of the CPU and CUDA suites.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "testing/attention_case.hpp"

namespace flashtile::testing {

// Starts `threads` threads; thread t calls run(t) `repeats` times on cases[t] (poisoned
// first) and compares its outputs bitwise with serial_out[t] / serial_lse[t]. Expects no
// thread to differ or throw; `what` names the backend in the failure.
inline void expect_concurrent_runs_match(int threads, int repeats, std::vector<AttentionCase>& cases,
                                         const std::vector<HostBytes>& serial_out,
                                         const std::vector<std::vector<float>>& serial_lse,
                                         const std::function<void(int)>& run,
                                         const std::string& what) {
  std::vector<std::thread> pool;
  std::vector<std::string> errors(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      try {
        for (int repeat = 0; repeat < repeats; ++repeat) {
          cases[t].poison();
          run(t);
          if (cases[t].out.bytes != serial_out[t] || cases[t].lse != serial_lse[t])
            errors[t] = "differs from the serial result";
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  for (std::thread& th : pool) th.join();
  for (int t = 0; t < threads; ++t) EXPECT_EQ(errors[t], "") << what << " thread " << t;
}

}  // namespace flashtile::testing
