// Google Benchmark micro-benchmarks for cpu_flash, on every SIMD target this CPU runs:
//   qk/<target>/<d>      one key block of S^T = K·Q^T (the Q·Kᵀ micro-kernel), FLOP/s
//   pv/<target>/<d>      one key block of O = alpha·O + P·V (the P·V micro-kernel), FLOP/s
//   exp/<target>         the kernels' vectorised exp, floats/s
//   hwy_exp/<target>     Highway's contrib Exp for comparison, floats/s
//   fma_peak/<target>    independent multiply-add chains, FLOP/s: one core's FMA peak on that
//                          target, the yardstick of the kernels' "% of peak"
//   forward/<backend>/N/d/causal/threads/H/window_left/features  whole forward() calls
//                          (batch 1, fp32; window_left -1 = none, features: 1 softcap 30,
//                          2 ALiBi), FLOP/s with FLOPs = 4·B·H·pairs·d: pairs = N² for
//                          full, N²/2 causal, what a causal (left, 0) window leaves
// Run e.g. `flashtile_micro_bench --benchmark_filter=qk` or `=forward/cpu_flash/4096`.
// Figures are what the library's own tiles do: the kernels come from the same header.
#include "cpu/flash_targets.hpp"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench_cpu_flash.cpp"
#include "hwy/foreach_target.h"  // re-includes this file once per target
// clang-format on

#include "cpu/flash_kernels-inl.hpp"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace flashtile::detail::cpu_flash::HWY_NAMESPACE {

// One key block through the Q·Kᵀ micro-kernel: st (kBlockN, kBlockM) = k (kBlockN, d) · qt,
// with the block-max epilogue, plain logits and no mask (the common case).
void QkOnce(const float* k, const float* qt, float* st, float* bmax, int64_t d) {
  constexpr int kKeys = Tiles::kQkKeys, kVecs = Tiles::kQkQueryVecs;
  const BlockVisibility whole{Tiles::kBlockN};
  const BlockLogits plain{0.0f, 0.0f, 0};
  for (int64_t i = 0; i < Tiles::kBlockM; i += kVecs * kLanes)
    for (int64_t j = 0; j < Tiles::kBlockN; j += kKeys)
      QkTile<kKeys, kVecs, LogitsFlags<false, false>>(k, d, qt, st, bmax, i, j, plain, whole,
                                                      /*masked=*/false);
}
// One key block through the P·V micro-kernel: o (kBlockM, d) = alpha·o + P·v.
void PvOnce(const float* pt, const float* v, const float* alpha, float* o, int64_t d) {
  PvBlock(pt, BlockVisibility{Tiles::kBlockN}, v, Scratch::padded_dim(d), alpha, o,
          Scratch::padded_dim(d));
}
void HwyExp(const float* x, float* y, size_t n) {
  const DF df;
  for (size_t i = 0; i + kLanes <= n; i += kLanes)
    hn::StoreU(hn::Exp(df, hn::LoadU(df, x + i)), df, y + i);
}

// As many independent multiply-add chains as the P·V tile holds accumulators (24 on 32-register
// targets, 12 on 16-register ones): enough in flight to cover the FMA latency on every port.
void FmaChains(const float* seed, float* out, int64_t iterations) {
  constexpr int kChains = Tiles::kPvRows * Tiles::kPvChanVecs;
  const DF df;
  const VF m = hn::Set(df, 0.999999f), a = hn::Set(df, 1e-7f);
  VF acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = hn::Set(df, seed[c]);
  // Unrolled, so that the accumulators live in registers rather than on the stack.
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 32
    for (int c = 0; c < kChains; ++c) acc[c] = hn::MulAdd(acc[c], m, a);
  }
  for (int c = 0; c < kChains; ++c) out[c] = hn::GetLane(acc[c]);
}
int64_t FmaChainFlops() { return 2 * Tiles::kPvRows * Tiles::kPvChanVecs * kLanes; }

}  // namespace flashtile::detail::cpu_flash::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cpu/flash.hpp"
#include "flashtile/flashtile.hpp"
#include "hwy/aligned_allocator.h"

namespace flashtile::detail::cpu_flash {
HWY_EXPORT(QkOnce);
HWY_EXPORT(PvOnce);
HWY_EXPORT(VectorExp);
HWY_EXPORT(HwyExp);
HWY_EXPORT(FmaChains);
HWY_EXPORT(FmaChainFlops);

namespace {

hwy::AlignedFreeUniquePtr<float[]> random_floats(size_t n, float lo, float hi) {
  auto data = hwy::AllocateAligned<float>(n);
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (size_t i = 0; i < n; ++i) data[i] = dist(rng);
  return data;
}

// Buffers sized for the largest tiles of any target (192 query rows, 64 keys, d + 16).
constexpr int64_t kRows = 192, kKeys = 64, kMaxPad = 16;

void qk(benchmark::State& state, std::string target) {
  force_target(target);
  const int64_t d = state.range(0);
  const Geometry g = geometry(d);
  auto k = random_floats(kKeys * d, -1, 1), qt = random_floats(d * kRows, -1, 1);
  auto st = random_floats(kKeys * kRows, 0, 0), bmax = random_floats(kRows, -1, -1);
  for (auto _ : state) {
    HWY_DYNAMIC_DISPATCH(QkOnce)(k.get(), qt.get(), st.get(), bmax.get(), d);
    benchmark::DoNotOptimize(st[0]);
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * g.block_n * g.block_m * d,
                                                benchmark::Counter::kIsIterationInvariantRate);
  force_target("");
}

void pv(benchmark::State& state, std::string target) {
  force_target(target);
  const int64_t d = state.range(0);
  const Geometry g = geometry(d);
  auto pt = random_floats(kKeys * kRows, 0, 0.02f), v = random_floats(kKeys * (d + kMaxPad), -1, 1);
  auto o = random_floats(kRows * (d + kMaxPad), -1, 1), alpha = random_floats(kRows, 1, 1);
  for (auto _ : state) {
    HWY_DYNAMIC_DISPATCH(PvOnce)(pt.get(), v.get(), alpha.get(), o.get(), d);
    benchmark::DoNotOptimize(o[0]);
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * g.block_n * g.block_m * d,
                                                benchmark::Counter::kIsIterationInvariantRate);
  force_target("");
}

template <bool kHighway>
void exp_bench(benchmark::State& state, std::string target) {
  force_target(target);
  constexpr size_t n = 4096;  // one 64×64 block of scores
  auto x = random_floats(n, -30, 0), y = random_floats(n, 0, 0);
  for (auto _ : state) {
    if (kHighway)
      HWY_DYNAMIC_DISPATCH(HwyExp)(x.get(), y.get(), n);
    else
      HWY_DYNAMIC_DISPATCH(VectorExp)(x.get(), y.get(), n);
    benchmark::DoNotOptimize(y[0]);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * n);
  force_target("");
}

// Query-key pairs the FLOP count uses: the field's N² for full attention and N²/2 causal
// (as `flashtile bench`), and for a (left, 0) window exactly the pairs it leaves (row i sees
// min(i, left) + 1 keys).
double counted_pairs(int64_t n, bool causal, int64_t left) {
  if (!causal) return double(n) * double(n);
  if (left < 0) return 0.5 * double(n) * double(n);
  double pairs = 0;
  for (int64_t i = 0; i < n; ++i) pairs += double(std::min(i, left) + 1);
  return pairs;
}

// forward/<backend>: args {seqlen, head_dim, causal, threads, heads, window_left, features};
// batch 1, fp32.
void fma_peak(benchmark::State& state, std::string target) {
  force_target(target);
  constexpr int64_t kIterations = 1 << 16;
  auto seed = random_floats(64, 0.5f, 1), out = random_floats(64, 0, 0);
  for (auto _ : state) {
    HWY_DYNAMIC_DISPATCH(FmaChains)(seed.get(), out.get(), kIterations);
    benchmark::DoNotOptimize(out[0]);
  }
  state.counters["FLOP/s"] = benchmark::Counter(
      double(HWY_DYNAMIC_DISPATCH(FmaChainFlops)()) * kIterations,
      benchmark::Counter::kIsIterationInvariantRate);
  force_target("");
}

void forward_bench(benchmark::State& state, Backend backend) {
  const int64_t n = state.range(0), d = state.range(1), heads = state.range(4);
  const bool causal = state.range(2) != 0;
  const int threads = static_cast<int>(state.range(3));
  const int64_t window_left = state.range(5), features = state.range(6);
  const std::array<int64_t, 4> shape{1, n, heads, d};
  auto q = random_floats(n * heads * d, -1, 1), k = random_floats(n * heads * d, -1, 1);
  auto v = random_floats(n * heads * d, -1, 1), o = random_floats(n * heads * d, 0, 0);
  std::vector<float> slopes(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) slopes[h] = std::exp2(-8.0f * float(h + 1) / float(heads));
  auto view = [&](float* p) { return TensorView::contiguous(p, DType::f32, Device::cpu(), shape); };
  Options options;
  options.causal = causal;
  options.window.left = window_left;
  if (features & 1) options.softcap = 30.0f;
  if (features & 2) options.alibi_slopes = ParamView::vector(slopes.data(), Device::cpu(), heads);
  options.backend = backend;
  if (window_left >= 0 && !causal) {
    state.SkipWithError("the FLOP count knows windows only with causal (left, 0)");
    return;
  }
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  for (auto _ : state) forward(view(q.get()), view(k.get()), view(v.get()), view(o.get()), options);
  omp_set_num_threads(saved);
  const double pairs = counted_pairs(n, causal, window_left);
  state.counters["FLOP/s"] =
      benchmark::Counter(4.0 * heads * pairs * double(d), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace
}  // namespace flashtile::detail::cpu_flash

// --forward_case=N,d,causal,threads,heads[,window_left[,features]] (repeatable) replaces the
// default forward cases, e.g. for bench/cpu_vs_torch.py when no flashtile CLI is built.
std::vector<std::array<int64_t, 7>> take_forward_cases(int& argc, char** argv) {
  std::vector<std::array<int64_t, 7>> cases;
  const std::string flag = "--forward_case=";
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind(flag, 0) != 0) {
      argv[kept++] = argv[i];
      continue;
    }
    std::array<int64_t, 7> c{0, 0, 0, 0, 0, -1, 0};
    const int read = std::sscanf(arg.c_str() + flag.size(), "%ld,%ld,%ld,%ld,%ld,%ld,%ld", &c[0],
                                 &c[1], &c[2], &c[3], &c[4], &c[5], &c[6]);
    if (read < 5) {
      std::fprintf(stderr, "bad %s (expected N,d,causal,threads,heads[,window_left[,features]])\n",
                   arg.c_str());
      std::exit(2);
    }
    cases.push_back(c);
  }
  argc = kept;
  return cases;
}

int main(int argc, char** argv) {
  namespace cf = flashtile::detail::cpu_flash;
  std::vector<std::array<int64_t, 7>> forward_cases = take_forward_cases(argc, argv);
  const bool custom = !forward_cases.empty();
  if (!custom) {
    const int64_t all = omp_get_max_threads();
    for (int64_t threads : {int64_t(1), all}) {
      for (int64_t causal : {0, 1}) {
        forward_cases.push_back({4096, 64, causal, threads, 8, -1, 0});
        forward_cases.push_back({1024, 64, causal, threads, 1, -1, 0});
      }
      if (all == 1) break;
    }
  }
  if (!custom) {
    for (const std::string& target : cf::available_targets()) {
      benchmark::RegisterBenchmark(("qk/" + target).c_str(), cf::qk, target)
          ->Arg(64)->Arg(128)->Arg(256);
      benchmark::RegisterBenchmark(("pv/" + target).c_str(), cf::pv, target)
          ->Arg(64)->Arg(128)->Arg(256);
      benchmark::RegisterBenchmark(("exp/" + target).c_str(), cf::exp_bench<false>, target);
      benchmark::RegisterBenchmark(("hwy_exp/" + target).c_str(), cf::exp_bench<true>, target);
      benchmark::RegisterBenchmark(("fma_peak/" + target).c_str(), cf::fma_peak, target);
    }
  }
  for (const auto& c : forward_cases)
    benchmark::RegisterBenchmark("forward/cpu_flash", cf::forward_bench,
                                 flashtile::Backend::cpu_flash)
        ->Args({c[0], c[1], c[2], c[3], c[4], c[5], c[6]})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  if (!custom) {
    // The write-up's baseline on its own case: B=1, H=1, N=1024, d=64, one thread.
    benchmark::RegisterBenchmark("forward/cpu_standard", cf::forward_bench,
                                 flashtile::Backend::cpu_standard)
        ->Args({1024, 64, 0, 1, 1, -1, 0})->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
#endif  // HWY_ONCE
