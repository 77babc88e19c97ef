// `flashtile bench`: the write-up's table for this machine (or the field's sweep grid).
// Every row is checked against the oracle before it is timed.
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "commands.hpp"
#include "flashtile/device.hpp"
#include "workload.hpp"

namespace flashtile::cli {
namespace {

struct Row {
  Backend backend = Backend::automatic;
  Shape shape;
  VariantValues values;
  double flops = 0;  // attention_flops: what tflops divides
  double ms = 0;
  double tflops = 0;
  std::optional<double> speedup;  // over cpu_standard in the same run
  double max_abs_err = 0;
  bool error_sampled = false;
  bool error_checked = true;  // bwd: false when the oracle's gradients would be too slow
  int64_t workspace_bytes = 0;
  Pass pass = Pass::fwd;
  // How ms was taken: "queued" or "isolated" CUDA events (TimingSettings), "wall" on the CPU.
  const char* timing = "wall";
};

std::vector<Backend> default_backends() {
  std::vector<Backend> out;
  for (Backend b : all_backends())
    if (b != Backend::cpu_reference && backend_available(b)) out.push_back(b);
  return out;
}

std::vector<Shape> sweep_shapes(const BenchOptions& o) {
  std::vector<Shape> shapes;
  for (int64_t d : o.sweep_head_dims)
    for (int causal : o.sweep_causal)
      for (int64_t s : o.sweep_seqlens) {
        Shape shape = o.shape;
        shape.seqlen_q = shape.seqlen_k = s;
        shape.batch = std::max<int64_t>(1, 16384 / s);
        shape.heads_q = shape.heads_kv = std::max<int64_t>(1, 2048 / d);
        shape.head_dim = d;
        shape.causal = causal != 0;
        shapes.push_back(shape);
      }
  return shapes;
}

std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  std::ostringstream s;
  s.precision(6);
  s << x;
  return s.str();
}

// An integer-valued double (FLOPs) in full.
std::string json_count(double x) {
  std::ostringstream s;
  s.precision(17);
  s << x;
  return s.str();
}

std::string json_list(const std::vector<int64_t>& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

// The variant columns, null / empty when a feature is off.
std::string sinks_text(const Row& r) {
  if (!r.shape.sinks) return "";
  return r.values.sink_logit ? json_number(*r.values.sink_logit) : "random";
}

std::string to_json(const std::vector<Row>& rows) {
  std::ostringstream j;
  j << "[\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const Shape& s = r.shape;
    j << "  {\"backend\": \"" << backend_name(r.backend) << "\", \"dtype\": \""
      << dtype_name(s.dtype) << "\", \"batch\": " << s.batch << ", \"heads\": " << s.heads_q
      << ", \"heads_kv\": " << s.heads_kv << ", \"seqlen_q\": " << s.seqlen_q
      << ", \"seqlen_k\": " << s.seqlen_k << ", \"head_dim\": " << s.head_dim
      << ", \"causal\": " << (s.causal ? "true" : "false") << ", \"ms\": " << json_number(r.ms)
      << ", \"tflops\": " << json_number(r.tflops)
      << ", \"speedup\": " << (r.speedup ? json_number(*r.speedup) : "null")
      << ", \"max_abs_err\": " << (r.error_checked ? json_number(r.max_abs_err) : "null")
      << ", \"error_sampled\": " << (r.error_sampled ? "true" : "false")
      << ", \"workspace_bytes\": " << r.workspace_bytes << ", \"flops\": " << json_count(r.flops)
      << ", \"pass\": \"" << pass_name(r.pass) << "\""
      << ", \"timing\": \"" << r.timing << "\""
      << ", \"window\": "
      << (s.window.bounded() ? json_list({s.window.left, s.window.right}) : "null")
      << ", \"softcap\": " << (s.softcap != 0.0f ? json_number(s.softcap) : "null")
      << ", \"alibi\": " << (s.alibi ? "true" : "false") << ", \"sinks\": "
      << (!s.sinks ? "null" : r.values.sink_logit ? sinks_text(r) : "\"random\"")
      << ", \"varlen\": ";
    if (s.is_varlen())
      j << "{\"sequences\": " << s.sequences() << ", \"total_q\": " << s.total_q()
        << ", \"total_k\": " << s.total_k() << ", \"lengths_q\": " << json_list(s.varlen_q)
        << ", \"lengths_k\": " << json_list(s.varlen_k) << "}";
    else
      j << "null";
    j << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  j << "]\n";
  return j.str();
}

std::string to_csv(const std::vector<Row>& rows) {
  std::ostringstream c;
  c << "backend,dtype,batch,heads,heads_kv,seqlen_q,seqlen_k,head_dim,causal,ms,tflops,speedup,"
       "max_abs_err,error_sampled,workspace_bytes,flops,window_left,window_right,softcap,alibi,"
       "sinks,varlen_sequences,varlen_total_q,varlen_total_k,pass,timing\n";
  for (const Row& r : rows) {
    const Shape& s = r.shape;
    c << backend_name(r.backend) << ',' << dtype_name(s.dtype) << ',' << s.batch << ','
      << s.heads_q << ',' << s.heads_kv << ',' << s.seqlen_q << ',' << s.seqlen_k << ','
      << s.head_dim << ',' << (s.causal ? 1 : 0) << ',' << json_number(r.ms) << ','
      << json_number(r.tflops) << ',' << (r.speedup ? json_number(*r.speedup) : "") << ','
      << (r.error_checked ? json_number(r.max_abs_err) : "") << ',' << (r.error_sampled ? 1 : 0) << ','
      << r.workspace_bytes << ',' << json_count(r.flops) << ',';
    if (s.window.bounded()) c << s.window.left << ',' << s.window.right;
    else c << ',';
    c << ',' << (s.softcap != 0.0f ? json_number(s.softcap) : "") << ',' << (s.alibi ? 1 : 0)
      << ',' << sinks_text(r) << ',';
    if (s.is_varlen()) c << s.sequences() << ',' << s.total_q() << ',' << s.total_k();
    else c << ",,";
    c << ',' << pass_name(r.pass) << ',' << r.timing << "\n";
  }
  return c.str();
}

void print_table(const std::vector<Row>& rows, const std::vector<std::string>& skipped) {
  const Shape* last = nullptr;
  for (const Row& r : rows) {
    if (last == nullptr || last->describe() != r.shape.describe()) {
      std::printf("\n%s\n", r.shape.describe().c_str());
      std::printf("%-18s %12s %10s %10s %13s %14s\n", "backend", "ms", "speedup", "TFLOP/s",
                  "max_abs_err", "extra memory");
      last = &r.shape;
    }
    char speedup[32] = "-";
    if (r.speedup) std::snprintf(speedup, sizeof speedup, "%.1fx", *r.speedup);
    char error[32] = "unchecked";
    if (r.error_checked) std::snprintf(error, sizeof error, "%.2e", r.max_abs_err);
    const std::string name = std::string(backend_name(r.backend)) +
                             (r.pass == Pass::fwd ? "" : std::string(" ") + pass_name(r.pass));
    std::printf("%-18s %12.4f %10s %10.3f %12s%s %14s\n", name.c_str(), r.ms, speedup, r.tflops,
                error, r.error_sampled ? "*" : " ", human_bytes(r.workspace_bytes).c_str());
  }
  for (const std::string& line : skipped) std::printf("%s\n", line.c_str());
  for (const Row& r : rows)
    if (r.pass != Pass::fwd) {
      std::printf("bwd/fwdbwd rows: TFLOP/s count 2.5x / 3.5x the forward's FLOPs; max_abs_err is "
                  "the largest over dq, dk, dv against the oracle's gradients (unchecked: too "
                  "large for the double oracle)\n");
      break;
    }
  bool any_sampled = false;
  for (const Row& r : rows) any_sampled |= r.error_sampled;
  if (any_sampled)
    std::printf("* error measured on %d sampled query rows (full oracle too slow)\n", kSampledRows);
}

// The backend `auto` picks for this workload: on the GPU when one is present, else the CPU.
std::string auto_choice(Workload& work) {
  for (DeviceType device : {DeviceType::cuda, DeviceType::cpu}) {
    if (device == DeviceType::cuda && cuda_device_count() == 0) continue;
    try {
      return std::string(backend_name(plan_auto(work, device).backend));
    } catch (const Error&) {
    }
  }
  return "nothing (no backend supports this call)";
}

}  // namespace

std::vector<Backend> parse_backend_list(const std::vector<std::string>& names) {
  std::vector<Backend> out;
  for (const std::string& name : names) {
    const auto b = parse_backend(name);
    if (!b || *b == Backend::automatic) {
      std::string known;
      for (Backend k : all_backends()) known += (known.empty() ? "" : ", ") + std::string(backend_name(k));
      throw Error(ErrorKind::invalid_argument,
                  "unknown backend '" + name + "' (expected one of: " + known + ")");
    }
    out.push_back(*b);
  }
  return out;
}

int run_bench(const BenchOptions& o) {
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const std::vector<Backend> backends =
      o.backends.empty() ? default_backends() : parse_backend_list(o.backends);
  const std::vector<Shape> shapes = o.sweep ? sweep_shapes(o) : std::vector<Shape>{o.shape};

  std::fprintf(stderr, "flashtile bench: %d CPU threads", omp_get_max_threads());
  if (cuda_device_count() > 0)
    std::fprintf(stderr, ", %s (sm_%d), GPU calls timed %s\n", cuda_device_name(0).c_str(),
                 cuda_compute_capability(0),
                 o.isolated ? "each from an idle GPU" : "queued back to back");
  else
    std::fprintf(stderr, "\n");

  TimingSettings timing;
  timing.warmup = o.warmup;
  timing.repeats = o.repeats;
  timing.flush_l2 = !o.no_flush;
  timing.isolated = o.isolated;

  std::vector<Row> rows;
  std::vector<std::string> skipped, auto_choices;
  const size_t total = shapes.size() * backends.size();
  size_t step = 0;
  for (const Shape& shape : shapes) {
    Workload work(shape, 1234, o.values);
    const Pass pass = o.pass;
    const double flops = pass_flops(work, pass);
    std::optional<double> baseline_ms;
    const size_t first_row = rows.size();
    for (Backend backend : backends) {
      ++step;
      std::fprintf(stderr, "[%zu/%zu] %s %s\n", step, total,
                   std::string(backend_name(backend)).c_str(), shape.describe().c_str());
      Plan plan;
      try {
        plan = plan_for(work, backend);
        if (pass != Pass::fwd) {
          const Plan backward_plan = plan_backward_for(work, backend);
          plan.workspace_bytes = pass == Pass::bwd
                                     ? backward_plan.workspace_bytes
                                     : std::max(plan.workspace_bytes, backward_plan.workspace_bytes);
        }
      } catch (const Error& e) {
        skipped.push_back(std::string(backend_name(backend)) + " skipped (" + shape.describe() +
                          "): " + e.what());
        continue;
      }
      Row row;
      row.backend = backend;
      row.shape = work.host.shape;  // varlen: batch = sequences, the longest lengths
      row.values = o.values;
      row.flops = flops;
      row.workspace_bytes = plan.workspace_bytes;
      row.pass = pass;
      if (backend_device(backend) == DeviceType::cuda) row.timing = o.isolated ? "isolated" : "queued";
      run_once(work, backend);  // checked before it is timed
      if (pass == Pass::fwd) {
        const ErrorReport error = measure_error(work);
        row.max_abs_err = error.max_abs_err;
        row.error_sampled = error.sampled;
        row.ms = median_ms(work, backend, timing);
      } else {
        run_backward_once(work, backend);  // from this backend's own out and lse
        row.error_checked = attention_flops(work) <= kBackwardOracleLimitFlops;
        if (row.error_checked) row.max_abs_err = gradient_max_abs_error(work);
        row.ms = median_backward_ms(work, backend, timing, /*with_forward=*/pass == Pass::fwdbwd);
      }
      row.tflops = flops / (row.ms * 1e-3) / 1e12;
      // Each row as it is measured, so a sweep cut off by a time limit keeps what it timed.
      std::fprintf(stderr, "    %.4f ms, %.3g TFLOP/s\n", row.ms, row.tflops);
      if (backend == Backend::cpu_standard) baseline_ms = row.ms;
      rows.push_back(row);
    }
    if (baseline_ms)
      for (size_t i = first_row; i < rows.size(); ++i) rows[i].speedup = *baseline_ms / rows[i].ms;
    auto_choices.push_back(shape.describe() + ": auto runs " + auto_choice(work));
  }

  if (o.json) {
    std::fputs(to_json(rows).c_str(), stdout);
    for (const std::string& line : skipped) std::fprintf(stderr, "%s\n", line.c_str());
  } else {
    print_table(rows, skipped);
    for (const std::string& line : auto_choices) std::printf("%s\n", line.c_str());
  }
  if (cuda_device_count() == 0)
    std::fprintf(o.json ? stderr : stdout, "GPU rows missing: %s\n",
                 cuda_unavailable_reason().c_str());
  if (!o.output.empty()) {
    std::ofstream file(o.output);
    if (!file) throw Error(ErrorKind::runtime, o.output + ": cannot open for writing");
    const bool csv = o.output.size() >= 4 && o.output.substr(o.output.size() - 4) == ".csv";
    file << (csv ? to_csv(rows) : to_json(rows));
  }
  return rows.empty() ? 1 : 0;
}

}  // namespace flashtile::cli
