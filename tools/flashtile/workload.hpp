// What `bench` and `check` share: a problem's FLOPs, running a backend on a host case
// (mirrored on the GPU for CUDA backends), timing it, and measuring its error. Every
// variant and packed varlen batch of testing::Shape goes through the same calls.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "api/params.hpp"
#include "testing/attention_case.hpp"
#include "testing/device_case.hpp"

namespace flashtile::cli {

using testing::AttentionCase;
using testing::DeviceCase;
using testing::Shape;

// Parameter values bench puts in place of the case's random ones.
struct VariantValues {
  bool standard_alibi = false;      // flags.hpp's standard_alibi_slopes instead of random slopes
  std::optional<float> sink_logit;  // every head's sink logit; nullopt keeps the random logits
};

// A host case plus, created on first use, its mirror on the GPU.
struct Workload {
  AttentionCase host;
  std::unique_ptr<DeviceCase> device;
  explicit Workload(const Shape& shape, uint32_t seed = 1234, const VariantValues& values = {});
  DeviceCase& on_device();
};

// The validated parameters of the case's host call: the normalised window, the lengths.
detail::AttentionParams host_params(const Workload& work);

// FLOPs of the problem, 4·d per visible (query, key) pair and query head. The field's
// convention for dense full (4·B·H·Sq·Sk·d) and dense causal attention (half of it, whatever
// Sq and Sk); the visible pairs counted exactly (attn/mask.hpp, per sequence) for sliding
// windows and varlen batches, so that TFLOP/s compare across variants.
double attention_flops(const Workload& work);

// Plan for `backend` (throws flashtile::Error when it cannot run this case).
Plan plan_for(Workload& work, Backend backend);
// The backend `automatic` picks for this case on `device` (throws when none can).
Plan plan_auto(Workload& work, DeviceType device);

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

// Max |out - oracle| over all rows, or over `kSampledRows` query rows spread over the
// problem when the full oracle would be too slow (sampled == true then; the oracle runs on
// those rows only, every variant included). Uses the last run's outputs.
struct ErrorReport {
  double max_abs_err = 0;
  bool sampled = false;
};
constexpr int kSampledRows = 12;
ErrorReport measure_error(const Workload& work, double full_oracle_limit_flops = 4e9);

std::string human_bytes(int64_t bytes);

}  // namespace flashtile::cli
