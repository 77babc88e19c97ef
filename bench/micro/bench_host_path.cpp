// Google Benchmark of the host path every forward() call takes before a backend runs: the
// validator, and plan() (validator, backend choice, workspace size), on the write-up's shape
// (B=1, H=1, N=1024, d=64, fp32, with an LSE). A GPU call adds its CUDA runtime calls to
// these; bench/tf32x3_breakdown.cu times those on the GPU machine.
//   host/validate            detail::validate alone
//   host/plan/<backend>      flashtile::plan with that backend named
//   host/plan/auto           flashtile::plan choosing among the CPU backends
#include <benchmark/benchmark.h>

#include <vector>

#include "api/params.hpp"
#include "flashtile/flashtile.hpp"

namespace {

using namespace flashtile;

struct WriteupCase {
  static constexpr int64_t kN = 1024, kD = 64;
  std::vector<float> q, k, v, out, lse;
  Options options;
  WriteupCase() : q(kN * kD, 0.5f), k(kN * kD, 0.5f), v(kN * kD, 0.5f), out(kN * kD), lse(kN) {
    options.lse = lse.data();
  }
  TensorView view(std::vector<float>& t) const {
    return TensorView::contiguous(t.data(), DType::f32, Device::cpu(), {1, kN, 1, kD});
  }
};

void validate_bench(benchmark::State& state) {
  WriteupCase c;
  const TensorView q = c.view(c.q), k = c.view(c.k), v = c.view(c.v), out = c.view(c.out);
  for (auto _ : state) {
    detail::AttentionParams p = detail::validate({q, k, v, &out, nullptr, c.options});
    benchmark::DoNotOptimize(p);
  }
}

void plan_bench(benchmark::State& state, Backend backend) {
  WriteupCase c;
  c.options.backend = backend;
  const TensorView q = c.view(c.q), k = c.view(c.k), v = c.view(c.v), out = c.view(c.out);
  for (auto _ : state) {
    Plan planned = plan(q, k, v, out, c.options);
    benchmark::DoNotOptimize(planned);
  }
}

BENCHMARK(validate_bench)->Name("host/validate");
BENCHMARK_CAPTURE(plan_bench, cpu_flash, Backend::cpu_flash)->Name("host/plan/cpu_flash");
BENCHMARK_CAPTURE(plan_bench, cpu_reference, Backend::cpu_reference)->Name("host/plan/cpu_reference");
BENCHMARK_CAPTURE(plan_bench, automatic, Backend::automatic)->Name("host/plan/auto");

}  // namespace

BENCHMARK_MAIN();
