// What `bench` and `check` share: a problem's FLOPs, running a backend on a host case
// (mirrored on the GPU for CUDA backends), timing it, and measuring its error.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "testing/attention_case.hpp"
#include "testing/device_case.hpp"

namespace flashtile::cli {

using testing::AttentionCase;
using testing::DeviceCase;
using testing::Shape;

// The field's convention: 4·B·H·Sq·Sk·d, halved when causal.
double attention_flops(const Shape& shape);

// A host case plus, created on first use, its mirror on the GPU.
struct Workload {
  AttentionCase host;
  std::unique_ptr<DeviceCase> device;
  explicit Workload(const Shape& shape, uint32_t seed = 1234) : host(shape, seed) {}
  DeviceCase& on_device();
};

// Plan for `backend` (throws flashtile::Error when it cannot run this shape).
Plan plan_for(Workload& work, Backend backend);

// Runs `backend` once with NaN-poisoned outputs and leaves its results in work.host.
void run_once(Workload& work, Backend backend);

struct TimingSettings {
  int warmup = 3;
  int repeats = 20;
  double cpu_budget_s = 3.0;  // CPU backends stop repeating after this much time
  bool flush_l2 = true;       // GPU: overwrite a 256 MiB buffer before each timed call
};

// Median milliseconds of `backend` on this workload.
double median_ms(Workload& work, Backend backend, const TimingSettings& settings);

// Max |out - oracle| over all rows, or over `sample_rows` sampled query rows when the
// full oracle would be too slow (sampled == true then). Uses the last run's outputs.
struct ErrorReport {
  double max_abs_err = 0;
  bool sampled = false;
};
ErrorReport measure_error(const Workload& work, int64_t full_oracle_limit_flops = 4'000'000'000);

std::string human_bytes(int64_t bytes);

}  // namespace flashtile::cli
