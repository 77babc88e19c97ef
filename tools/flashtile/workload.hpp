// What `bench` and `check` share: a problem's FLOPs, running a backend on a host case
// (mirrored on the GPU for CUDA backends), timing it, and measuring its error. Every
// variant and packed varlen batch of testing::Shape goes through the same calls.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "api/params.hpp"
#include "flashtile/reference.hpp"
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

// The backward pass's host buffers: a random dout and the NaN-poisoned gradients.
struct Gradients {
  testing::HostTensor dout, dq, dk, dv;
  std::vector<float> dsinks;  // heads_q with sinks, else empty
  std::vector<float> dlse;    // options.dlse: the LSE's shape when drawn, else empty
  explicit Gradients(const AttentionCase& host);
  // A random gradient into the LSE (uniform in [-1, 1]), before the first backward call.
  void draw_lse_gradient(uint32_t seed);
};

// The same on the GPU, for CUDA backends' backward (copied back into Gradients to verify).
struct DeviceGradients {
  testing::DeviceTensor dout, dq, dk, dv;
  testing::DeviceArray<float> dsinks, dlse;
  explicit DeviceGradients(const Gradients& host, int device_index = 0);
};

// A host case plus, created on first use, its mirror on the GPU and its gradient buffers.
struct Workload {
  AttentionCase host;
  std::unique_ptr<DeviceCase> device;
  std::unique_ptr<Gradients> grads;
  std::unique_ptr<DeviceGradients> device_grads;
  explicit Workload(const Shape& shape, uint32_t seed = 1234, const VariantValues& values = {});
  DeviceCase& on_device();
  Gradients& gradients();
  DeviceGradients& device_gradients();
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
  // GPU: wait for the device before each timed call, so that its time includes the host's
  // path to the launch; otherwise the calls are queued back to back (cuda_median_ms).
  bool isolated = false;
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

// ---- the backward pass (CPU backends on the host case, CUDA backends on its GPU mirror) ----
// Which passes `bench` times: forward, backward (from the forward's out and lse), or both.
enum class Pass { fwd, bwd, fwdbwd };
std::optional<Pass> parse_pass(const std::string& name);
const char* pass_name(Pass pass);
// FLOPs of a pass: the forward's, 2.5x it for the backward (FlashAttention's convention:
// five block products instead of two), 3.5x for both.
double pass_flops(const Workload& work, Pass pass);

// Plan of backward on `backend` (throws flashtile::Error when it cannot run this case).
Plan plan_backward_for(Workload& work, Backend backend);
// Runs backward once with poisoned gradients, from the out and lse of the last forward
// (run_once first) on the backend's device; the gradients end in work.gradients().
void run_backward_once(Workload& work, Backend backend);
// Median milliseconds of the backward (with_forward: forward then backward) on `backend`.
double median_backward_ms(Workload& work, Backend backend, const TimingSettings& settings,
                          bool with_forward);
// The rule on the last backward's gradients (computes the oracle's gradients).
GradientVerification verify_gradients_of(const Workload& work);
// max |g - oracle| over dq, dk, dv (and dsinks) of the last backward.
double gradient_max_abs_error(const Workload& work);
// Above this many forward FLOPs bench leaves a backward row unchecked (the double oracle's
// gradients cost about 4x its forward, on every row).
constexpr double kBackwardOracleLimitFlops = 2e9;

std::string human_bytes(int64_t bytes);

}  // namespace flashtile::cli
