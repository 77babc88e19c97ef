#include "workload.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "flashtile/device.hpp"
#include "flashtile/reference.hpp"

namespace flashtile::cli {

double attention_flops(const Shape& s) {
  const double flops = 4.0 * s.batch * s.heads_q * double(s.seqlen_q) * s.seqlen_k * s.head_dim;
  return s.causal ? flops / 2 : flops;
}

DeviceCase& Workload::on_device() {
  if (!device) device = std::make_unique<DeviceCase>(host);
  return *device;
}

namespace {

bool on_gpu(Backend backend) { return backend_device(backend) == DeviceType::cuda; }

// The call `forward` gets for this workload and backend.
struct Call {
  TensorView q, k, v, out;
  Options options;
};

Call make_call(Workload& work, Backend backend) {
  if (on_gpu(backend)) {
    DeviceCase& d = work.on_device();
    return {d.q.view, d.k.view, d.v.view, d.out.view, d.options(work.host, backend)};
  }
  AttentionCase& h = work.host;
  return {h.q.view, h.k.view, h.v.view, h.out.view, h.options(backend)};
}

}  // namespace

Plan plan_for(Workload& work, Backend backend) {
  if (on_gpu(backend) && cuda_device_count() == 0)
    throw Error(ErrorKind::unsupported, cuda_unavailable_reason());
  const Call c = make_call(work, backend);
  return plan(c.q, c.k, c.v, c.out, c.options);
}

void run_once(Workload& work, Backend backend) {
  if (on_gpu(backend)) {
    DeviceCase& d = work.on_device();
    d.poison();
    d.run(work.host, backend);
  } else {
    work.host.poison();
    const Call c = make_call(work, backend);
    forward(c.q, c.k, c.v, c.out, c.options);
  }
}

double median_ms(Workload& work, Backend backend, const TimingSettings& settings) {
  const Call c = make_call(work, backend);
  auto call = [&] { forward(c.q, c.k, c.v, c.out, c.options); };
  using Clock = std::chrono::steady_clock;
  if (on_gpu(backend)) {
    const int device = c.q.device.index;
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
      if (settings.flush_l2) flush.fill_bytes(0x5A);
    });
  }
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

ErrorReport measure_error(const Workload& work, int64_t full_oracle_limit_flops) {
  const AttentionCase& h = work.host;
  const Shape& s = h.shape;
  Options options;
  options.causal = s.causal;
  ErrorReport report;
  if (attention_flops(s) <= double(full_oracle_limit_flops)) {
    const ReferenceResult ref = reference_attention(h.q.view, h.k.view, h.v.view, options);
    report.max_abs_err = compare_to_reference(h.out.view, ref.out).max_abs;
    return report;
  }
  // Sampled rows: row i of (b, head) is standard attention of that one query over the keys
  // it may see, so a 1-row query view against a key prefix reproduces it exactly (with
  // bottom-right causal, a 1-row query sees the whole prefix it is given).
  report.sampled = true;
  constexpr int kSamples = 12;
  for (int n = 0; n < kSamples; ++n) {
    const int64_t b = n % s.batch, head = (n * 7) % s.heads_q;
    const int64_t i = (s.seqlen_q - 1) * n / (kSamples - 1);
    const int64_t keys =
        s.causal ? std::min<int64_t>(s.seqlen_k, i + s.seqlen_k - s.seqlen_q + 1) : s.seqlen_k;
    auto row_view = [&](const TensorView& t, int64_t row, int64_t hd, int64_t rows) {
      TensorView v = t;
      v.data = static_cast<unsigned char*>(t.data) +
               (b * t.strides[0] + row * t.strides[1] + hd * t.strides[2]) * dtype_size(t.dtype);
      v.shape = {1, rows, 1, t.shape[3]};
      return v;
    };
    const int64_t kv_head = head / (s.heads_q / s.heads_kv);
    const TensorView out_row = row_view(h.out.view, i, head, 1);
    if (keys <= 0) {  // fully masked row: the output must be exactly 0
      const std::vector<double> zeros(s.head_dim, 0.0);
      report.max_abs_err = std::max(report.max_abs_err, compare_to_reference(out_row, zeros).max_abs);
      continue;
    }
    Options row_options;
    row_options.causal = false;
    const ReferenceResult ref =
        reference_attention(row_view(h.q.view, i, head, 1), row_view(h.k.view, 0, kv_head, keys),
                            row_view(h.v.view, 0, kv_head, keys), row_options);
    report.max_abs_err = std::max(report.max_abs_err, compare_to_reference(out_row, ref.out).max_abs);
  }
  return report;
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
