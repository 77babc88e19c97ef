#include "workload.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "attn/seqlen.hpp"
#include "flags.hpp"
#include "flashtile/device.hpp"
#include "flashtile/reference.hpp"

namespace flashtile::cli {

Workload::Workload(const Shape& shape, uint32_t seed, const VariantValues& values)
    : host(shape, seed) {
  // Replaced before the GPU mirror is made, so both sides see the same values.
  if (values.standard_alibi && !host.alibi_slopes.empty()) {
    const std::vector<float> slopes = standard_alibi_slopes(host.shape.heads_q);
    for (size_t n = 0; n < host.alibi_slopes.size(); ++n)
      host.alibi_slopes[n] = slopes[n % slopes.size()];  // every batch row alike
  }
  if (values.sink_logit)
    std::fill(host.sinks.begin(), host.sinks.end(), *values.sink_logit);
}

DeviceCase& Workload::on_device() {
  if (!device) device = std::make_unique<DeviceCase>(host);
  return *device;
}

Gradients::Gradients(const AttentionCase& h)
    : dout(h.shape.dtype, h.shape.q_shape(), h.shape.strided),
      dq(h.shape.dtype, h.shape.q_shape(), h.shape.strided),
      dk(h.shape.dtype, h.shape.kv_shape(), h.shape.strided),
      dv(h.shape.dtype, h.shape.kv_shape(), h.shape.strided),
      dsinks(h.sinks.size()) {
  std::mt19937 rng(4321);
  dout.fill_random(rng);
}

void Gradients::draw_lse_gradient(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  dlse.resize(size_t(dq.view.shape[0] * dq.view.shape[1] * dq.view.shape[2]));
  for (float& g : dlse) g = uniform(rng);
}

Gradients& Workload::gradients() {
  if (!grads) grads = std::make_unique<Gradients>(host);
  return *grads;
}

DeviceGradients::DeviceGradients(const Gradients& g, int device_index)
    : dout(g.dout, device_index),
      dq(g.dq, device_index),
      dk(g.dk, device_index),
      dv(g.dv, device_index),
      dsinks(g.dsinks, device_index),
      dlse(g.dlse, device_index) {}

DeviceGradients& Workload::device_gradients() {
  if (!device_grads) device_grads = std::make_unique<DeviceGradients>(gradients());
  return *device_grads;
}

namespace {

bool on_gpu(DeviceType device) { return device == DeviceType::cuda; }

// The call `forward` (or `forward_varlen`) gets for this workload on `device`.
struct Call {
  TensorView q, k, v, out;
  Options options;
  std::optional<Varlen> varlen;
};

Call make_call(Workload& work, Backend backend, DeviceType device) {
  if (on_gpu(device)) {
    if (cuda_device_count() == 0) throw Error(ErrorKind::unsupported, cuda_unavailable_reason());
    DeviceCase& d = work.on_device();
    return {d.q.view, d.k.view, d.v.view, d.out.view, d.options(work.host, backend),
            d.varlen(work.host)};
  }
  AttentionCase& h = work.host;
  return {h.q.view, h.k.view, h.v.view, h.out.view, h.options(backend), h.varlen()};
}

Call make_call(Workload& work, Backend backend) {
  return make_call(work, backend, backend_device(backend));
}

void run_call(const Call& c) { testing::run_forward(c.q, c.k, c.v, c.out, c.options, c.varlen); }

}  // namespace

detail::AttentionParams host_params(const Workload& work) {
  const AttentionCase& h = work.host;
  const Options options = h.reference_options();
  const std::optional<Varlen> varlen = h.varlen();
  return detail::validate({h.q.view, h.k.view, h.v.view, &h.out.view, varlen ? &*varlen : nullptr,
                           options, "flashtile"});
}

double attention_flops(const Workload& work) {
  const detail::AttentionParams p = host_params(work);
  const double per_pair = 4.0 * double(p.heads_q) * double(p.head_dim);
  const bool window = p.has_mask() && !p.is_causal();
  if (!p.is_varlen() && !window) {
    const double full = per_pair * double(p.batch) * double(p.seqlen_q) * double(p.seqlen_k);
    return p.is_causal() ? full / 2 : full;
  }
  double pairs = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const detail::SeqlenInfo<int64_t> seq(p, b);
    const detail::Mask<int64_t> mask = seq.mask(p);
    for (int64_t i = 0; i < seq.seqlen_q; ++i) pairs += double(mask.visible_keys(i));
  }
  return per_pair * pairs;
}

Plan plan_for(Workload& work, Backend backend) {
  const Call c = make_call(work, backend);
  return testing::plan_call(c.q, c.k, c.v, c.out, c.options, c.varlen);
}

Plan plan_auto(Workload& work, DeviceType device) {
  const Call c = make_call(work, Backend::automatic, device);
  return testing::plan_call(c.q, c.k, c.v, c.out, c.options, c.varlen);
}

void run_once(Workload& work, Backend backend) {
  if (on_gpu(backend_device(backend))) {
    DeviceCase& d = work.on_device();
    d.poison();
    d.run(work.host, backend);
  } else {
    work.host.poison();
    run_call(make_call(work, backend));
  }
}

// Median wall-clock milliseconds of a CPU call: one warm-up, then up to `repeats` timed
// calls, stopping early once `cpu_budget_s` has passed (after at least 3).
template <class Call>
double cpu_median_ms(Call&& call, const TimingSettings& settings) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < std::min(settings.warmup, 1); ++i) call();
  std::vector<double> times;
  const auto start = Clock::now();
  for (int i = 0; i < settings.repeats; ++i) {
    const auto t0 = Clock::now();
    call();
    times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (std::chrono::duration<double>(Clock::now() - start).count() > settings.cpu_budget_s &&
        times.size() >= 3)
      break;
  }
  return detail::median(times);
}

// CUDA-event timing of call() on `device` (forward and backward alike).
template <class Call>
double gpu_median_ms(int device, Call&& call, const TimingSettings& settings) {
  using Clock = std::chrono::steady_clock;
  // An idle GPU sits at low clocks; keep it busy for a while before the timed calls so
  // that every backend is measured at the clocks it would see under load.
  constexpr double kSpinUpSeconds = 0.3;
  const auto spin_start = Clock::now();
  do {
    call();
    cuda_synchronize(device);
  } while (std::chrono::duration<double>(Clock::now() - spin_start).count() < kSpinUpSeconds);
  DeviceBuffer flush(settings.flush_l2 ? (size_t(256) << 20) : 1, device);
  return cuda_median_ms(device, settings.warmup, settings.repeats, call, [&] {
    if (settings.flush_l2) flush.fill_bytes_async(0x5A);
    if (settings.isolated) cuda_synchronize(device);
  });
}

double median_ms(Workload& work, Backend backend, const TimingSettings& settings) {
  const Call c = make_call(work, backend);
  auto call = [&] { run_call(c); };
  if (on_gpu(backend_device(backend))) return gpu_median_ms(c.q.device.index, call, settings);
  return cpu_median_ms(call, settings);
}

ErrorReport measure_error(const Workload& work, double full_oracle_limit_flops) {
  const AttentionCase& h = work.host;
  ErrorReport report;
  if (attention_flops(work) <= full_oracle_limit_flops) {
    report.max_abs_err = compare_to_reference(h.out.view, h.reference().out).max_abs;
    return report;
  }
  // Rows spread evenly over q (over the packed rows of a varlen batch), each through the
  // oracle on that row alone; a row that sees nothing must be exactly 0 there too.
  report.sampled = true;
  const TensorView& q = h.q.view;
  std::vector<QueryRow> rows;
  for (int n = 0; n < kSampledRows; ++n)
    rows.push_back({n % q.batch(), (q.seqlen() - 1) * n / (kSampledRows - 1),
                    (n * 7) % q.heads()});
  const std::optional<Varlen> varlen = h.varlen();
  const ReferenceResult ref = reference_attention_rows(h.q.view, h.k.view, h.v.view, rows,
                                                       h.reference_options(),
                                                       varlen ? &*varlen : nullptr);
  const int64_t d = q.head_dim();
  for (size_t n = 0; n < rows.size(); ++n) {
    TensorView out_row = h.out.view;  // the 1-row view out[batch, row, head, :]
    out_row.data = static_cast<unsigned char*>(out_row.data) +
                   (rows[n].batch * out_row.strides[0] + rows[n].row * out_row.strides[1] +
                    rows[n].head * out_row.strides[2]) * int64_t(dtype_size(out_row.dtype));
    out_row.shape = {1, 1, 1, d};
    const std::vector<double> expected(ref.out.begin() + n * d, ref.out.begin() + (n + 1) * d);
    report.max_abs_err =
        std::max(report.max_abs_err, compare_to_reference(out_row, expected).max_abs);
  }
  return report;
}

std::optional<Pass> parse_pass(const std::string& name) {
  if (name == "fwd") return Pass::fwd;
  if (name == "bwd") return Pass::bwd;
  if (name == "fwdbwd") return Pass::fwdbwd;
  return std::nullopt;
}

const char* pass_name(Pass pass) {
  switch (pass) {
    case Pass::fwd: return "fwd";
    case Pass::bwd: return "bwd";
    case Pass::fwdbwd: return "fwdbwd";
  }
  return "?";
}

double pass_flops(const Workload& work, Pass pass) {
  const double forward = attention_flops(work);
  return pass == Pass::fwd ? forward : pass == Pass::bwd ? 2.5 * forward : 3.5 * forward;
}

namespace {

// backward (or backward_varlen) on `backend`: of the host case, or of its GPU mirror (from
// the device forward's out and lse) for a CUDA backend.
struct BackwardCall {
  TensorView q, k, v, out, dout, dq, dk, dv;
  const float* lse;
  std::optional<Varlen> varlen;
  Options options;
};

BackwardCall make_backward_call(Workload& work, Backend backend) {
  Gradients& g = work.gradients();
  if (on_gpu(backend_device(backend))) {
    if (cuda_device_count() == 0) throw Error(ErrorKind::unsupported, cuda_unavailable_reason());
    DeviceCase& d = work.on_device();
    DeviceGradients& dg = work.device_gradients();
    Options o = d.options(work.host, backend);
    o.lse = nullptr;  // an argument of backward
    o.dsinks = dg.dsinks.data();
    o.dlse = dg.dlse.data();
    return {d.q.view, d.k.view, d.v.view, d.out.view, dg.dout.view, dg.dq.view, dg.dk.view,
            dg.dv.view, static_cast<const float*>(d.lse.data()), d.varlen(work.host), o};
  }
  const AttentionCase& h = work.host;
  Options o = h.reference_options();
  o.backend = backend;
  o.dsinks = g.dsinks.empty() ? nullptr : g.dsinks.data();
  o.dlse = g.dlse.empty() ? nullptr : g.dlse.data();
  return {h.q.view, h.k.view, h.v.view, h.out.view, g.dout.view, g.dq.view, g.dk.view,
          g.dv.view, h.lse.data(), h.varlen(), o};
}

void call_backward(const BackwardCall& c) {
  if (c.varlen)
    backward_varlen(c.q, c.k, c.v, c.out, c.dout, c.lse, c.dq, c.dk, c.dv, *c.varlen, c.options);
  else
    backward(c.q, c.k, c.v, c.out, c.dout, c.lse, c.dq, c.dk, c.dv, c.options);
}

}  // namespace

Plan plan_backward_for(Workload& work, Backend backend) {
  const BackwardCall c = make_backward_call(work, backend);
  return c.varlen ? plan_backward_varlen(c.q, c.k, c.v, c.out, c.dout, c.lse, c.dq, c.dk, c.dv,
                                         *c.varlen, c.options)
                  : plan_backward(c.q, c.k, c.v, c.out, c.dout, c.lse, c.dq, c.dk, c.dv, c.options);
}

void run_backward_once(Workload& work, Backend backend) {
  const BackwardCall c = make_backward_call(work, backend);
  Gradients& g = work.gradients();
  for (testing::HostTensor* t : {&g.dq, &g.dk, &g.dv}) t->poison();
  std::fill(g.dsinks.begin(), g.dsinks.end(), std::numeric_limits<float>::quiet_NaN());
  if (!on_gpu(backend_device(backend))) {
    call_backward(c);
    return;
  }
  DeviceGradients& dg = work.device_gradients();
  for (testing::DeviceTensor* t : {&dg.dq, &dg.dk, &dg.dv}) t->buffer.fill_bytes(0xFF);
  if (dg.dsinks.data() != nullptr) dg.dsinks.buffer.fill_bytes(0xFF);
  call_backward(c);
  cuda_synchronize(c.q.device.index);
  dg.dq.buffer.copy_to_host(g.dq.bytes.data(), g.dq.bytes.size());
  dg.dk.buffer.copy_to_host(g.dk.bytes.data(), g.dk.bytes.size());
  dg.dv.buffer.copy_to_host(g.dv.bytes.data(), g.dv.bytes.size());
  if (!g.dsinks.empty())
    dg.dsinks.buffer.copy_to_host(g.dsinks.data(), g.dsinks.size() * sizeof(float));
}

double median_backward_ms(Workload& work, Backend backend, const TimingSettings& settings,
                          bool with_forward) {
  const BackwardCall c = make_backward_call(work, backend);
  const Call forward_call = make_call(work, backend);
  auto call = [&] {
    if (with_forward) run_call(forward_call);
    call_backward(c);
  };
  // A CUDA backward runs asynchronously: host clocks would time its launches only.
  if (on_gpu(backend_device(backend)))
    return gpu_median_ms(forward_call.q.device.index, call, settings);
  return cpu_median_ms(call, settings);
}

GradientVerification verify_gradients_of(const Workload& work) {
  const AttentionCase& h = work.host;
  const Gradients& g = *work.grads;
  const std::optional<Varlen> varlen = h.varlen();
  Options o = h.reference_options();
  o.dlse = g.dlse.empty() ? nullptr : g.dlse.data();
  return verify_backward(h.q.view, h.k.view, h.v.view, g.dout.view, g.dq.view, g.dk.view,
                         g.dv.view, g.dsinks.empty() ? nullptr : g.dsinks.data(), o,
                         varlen ? &*varlen : nullptr);
}

double gradient_max_abs_error(const Workload& work) {
  const AttentionCase& h = work.host;
  const Gradients& g = *work.grads;
  const std::optional<Varlen> varlen = h.varlen();
  Options o = h.reference_options();
  o.dlse = g.dlse.empty() ? nullptr : g.dlse.data();
  const ReferenceGradients ref =
      varlen ? reference_attention_backward_varlen(h.q.view, h.k.view, h.v.view, g.dout.view,
                                                   *varlen, o)
             : reference_attention_backward(h.q.view, h.k.view, h.v.view, g.dout.view, o);
  double err = std::max({compare_to_reference(g.dq.view, ref.dq).max_abs,
                         compare_to_reference(g.dk.view, ref.dk).max_abs,
                         compare_to_reference(g.dv.view, ref.dv).max_abs});
  for (size_t n = 0; n < g.dsinks.size(); ++n)
    err = std::max(err, std::isfinite(g.dsinks[n]) ? std::fabs(g.dsinks[n] - ref.dsinks[n])
                                                   : std::numeric_limits<double>::infinity());
  return err;
}

std::string human_bytes(int64_t bytes) {
  char text[32];
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = double(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

}  // namespace flashtile::cli
