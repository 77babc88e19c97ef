// Where cuda_tf32x3's time goes on the write-up's case (B=1, H=1, N=1024, d=64, fp32,
// non-causal; issue 11), one line per measurement, medians of --repeats (default 200) calls:
//   call         CUDA events around flashtile::forward() after an L2 flush: what `flashtile
//                bench` reports (the host's validation, plan and launches are inside it,
//                since the GPU is idle when the start event is recorded)
//   host         the host's time inside forward(), to the return of its last launch
//   gpu          the same call with a 200 us hold kernel in front, so that the events see
//                the GPU's work alone (launch gaps included, host submission hidden)
//   empty        an empty kernel the same way: one launch's floor on this GPU
//   forward s=N  the forward kernel alone, N key splits (hold in front; N = 1 writes out)
//   combine      the split-KV combine alone, after a forward of --splits splits
//   pair ...     forward + combine, normal launch and programmatic dependent launch
//   wgmma ...    the same on the wgmma kernel (sm_90a), and its split forward that merges
//                its own partials behind a grid barrier (a cooperative launch, no combine)
//   host: ...    the host steps of one call on their own, each the mean of a batch of calls
//                (median of 15 batches): the validator, plan() (validator, backend choice,
//                split plan), the device guard (cudaGetDevice + two cudaSetDevice), a
//                stream-ordered allocation and free of the partials from a pool like the
//                backend's, and the submission of an empty kernel, of the forward (16
//                splits) and of the combine; what `host` above adds up, step by step
// The per-split forward times give a CTA's fixed cost (intercept) and its cost per key tile
// (slope: 32 key tiles per query block are shared among N splits).
//
//   flashtile_tf32x3_breakdown [--repeats N] [--splits N] [--csv FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "api/params.hpp"
#include "cuda/05_tf32x3/kernel.cuh"
#if FLASHTILE_WITH_SM90
#include "cuda/05_tf32x3/sm90.hpp"
#endif
#include "cuda/device_guard.cuh"
#include "flashtile/device.hpp"
#include "flashtile/flashtile.hpp"

namespace {

using namespace flashtile;
using detail::AttentionParams;
using detail::SplitPartials;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

// Keeps the GPU busy for `ns` nanoseconds, so that the work queued behind it starts back to
// back, whatever the host's submission costs.
__global__ void hold_kernel(long long ns) {
  long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (long long now = start; now - start < ns;) {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  }
}
__global__ void empty_kernel() {}

constexpr long long kHoldNs = 200000;

struct Timer {
  cudaEvent_t start, stop;
  Timer() {
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
  }
  float ms() {
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return ms;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Row {
  std::string what;
  double us;
};

}  // namespace

int main(int argc, char** argv) {
  int repeats = 200, splits = 16;
  std::string csv;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--splits")) splits = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--csv")) csv = argv[i + 1];
  }
  constexpr int64_t kN = 1024, kD = 64;
  const size_t elems = size_t(kN) * kD;
  std::vector<float> host(3 * elems);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& x : host) x = uniform(rng);
  DeviceBuffer q(elems * 4), k(elems * 4), v(elems * 4), out(elems * 4), lse(kN * 4);
  q.copy_from_host(host.data(), elems * 4);
  k.copy_from_host(host.data() + elems, elems * 4);
  v.copy_from_host(host.data() + 2 * elems, elems * 4);
  DeviceBuffer flush(size_t(256) << 20);
  auto view = [&](DeviceBuffer& b) {
    return TensorView::contiguous(b.data(), DType::f32, Device::cuda(0), {1, kN, 1, kD});
  };
  const TensorView tq = view(q), tk = view(k), tv = view(v), tout = view(out);
  Options o;
  o.backend = Backend::cuda_tf32x3;
  o.lse = static_cast<float*>(lse.data());
  const Plan planned = plan(tq, tk, tv, tout, o);
  const AttentionParams p = detail::validate({tq, tk, tv, &tout, nullptr, o, "breakdown"});
  using Cfg = detail::tf32x3::Tf32Traits<64>;
  const int query_blocks = int((kN + Cfg::kBlockM - 1) / Cfg::kBlockM);
  std::printf("write-up case: plan() workspace %lld bytes (%d splits would take %lld)\n",
              static_cast<long long>(planned.workspace_bytes), splits,
              static_cast<long long>(SplitPartials::bytes(query_blocks, splits, Cfg::kBlockM, Cfg::kHeadDim)));
  DeviceBuffer workspace(SplitPartials::bytes(query_blocks, detail::kMaxSplits, Cfg::kBlockM, Cfg::kHeadDim));
  auto partials = [&](int n) {
    return SplitPartials::at(workspace.data(), query_blocks, n, Cfg::kBlockM, Cfg::kHeadDim, query_blocks);
  };
  cudaStream_t stream = nullptr;  // the legacy default stream, as forward() uses here
  Timer timer;
  std::vector<Row> rows;
  // Runs `body` `repeats` times after warm-up; `held` puts the hold kernel in front.
  auto time_us = [&](const char* what, bool held, auto&& body) {
    for (int i = 0; i < 20; ++i) body();
    check(cudaDeviceSynchronize(), "warm-up");
    std::vector<double> us;
    for (int i = 0; i < repeats; ++i) {
      flush.fill_bytes(0x5A);
      if (held) hold_kernel<<<1, 1, 0, stream>>>(kHoldNs);
      check(cudaEventRecord(timer.start, stream), "cudaEventRecord");
      body();
      check(cudaEventRecord(timer.stop, stream), "cudaEventRecord");
      us.push_back(timer.ms() * 1e3);
    }
    check(cudaGetLastError(), what);
    rows.push_back({what, median(us)});
    std::printf("%-28s %8.2f us\n", what, rows.back().us);
  };
  auto call = [&] { forward(tq, tk, tv, tout, o); };
  time_us("call", false, call);
  {  // host submission time
    for (int i = 0; i < 20; ++i) call();
    std::vector<double> us;
    for (int i = 0; i < repeats; ++i) {
      flush.fill_bytes(0x5A);
      const auto t0 = std::chrono::steady_clock::now();
      call();
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      check(cudaDeviceSynchronize(), "host");
    }
    rows.push_back({"host", median(us)});
    std::printf("%-28s %8.2f us\n", "host", rows.back().us);
  }
  time_us("gpu", true, call);
  time_us("empty", true, [&] { empty_kernel<<<1, 32, 0, stream>>>(); });
  const auto precision = detail::tf32x3::Precision::split3;
  for (int n : {1, 2, 4, 8, 16}) {
    detail::tf32x3::SplitArgs args;
    args.splits = n;
    args.partials = partials(n);
    const std::string what = "forward s=" + std::to_string(n);
    time_us(what.c_str(), true, [&] { detail::tf32x3::run_tf32x3_forward<64>(p, args, precision, stream); });
  }
  detail::tf32x3::SplitArgs args;
  args.splits = splits;
  args.partials = partials(splits);
  detail::tf32x3::run_tf32x3_forward<64>(p, args, precision, stream);
  time_us("combine", true, [&] { detail::launch_split_kv_combine<float>(p, args.partials, stream); });
  for (bool overlap : {false, true})
    time_us(overlap ? "pair, programmatic launch" : "pair, normal launch", true, [&] {
      detail::tf32x3::run_tf32x3_forward<64>(p, args, precision, stream);
      detail::launch_split_kv_combine<float>(p, args.partials, stream, overlap);
    });
#if FLASHTILE_WITH_SM90
  // The wgmma kernel (2c.3) on the same call: its own tile (128 rows), so its own partials.
  {
    const detail::tf32x3::Tf32Sm90Tile wg = detail::tf32x3::tf32x3_sm90_tile<64>();
    const int wg_query_blocks = int((kN + wg.block_m - 1) / wg.block_m);
    DeviceBuffer wg_workspace(
        SplitPartials::bytes(wg_query_blocks, detail::kMaxSplits, wg.block_m, int(kD)));
    auto wg_args = [&](int n) {
      detail::tf32x3::SplitArgs a;
      a.splits = n;
      if (n > 1)
        a.partials = SplitPartials::at(wg_workspace.data(), wg_query_blocks, n, wg.block_m,
                                       int(kD), wg_query_blocks);
      return a;
    };
    // d=64 runs the overlapped pipeline whatever the schedule.
    constexpr auto kSchedule = detail::tf32x3::Tf32Sm90Schedule::producer;
    for (int n : {1, 2, 4, 8, 16}) {
      const detail::tf32x3::SplitArgs a = wg_args(n);
      const std::string what = "wgmma forward s=" + std::to_string(n);
      time_us(what.c_str(), true,
              [&] { detail::tf32x3::run_tf32x3_sm90_forward<64>(p, a, kSchedule, stream); });
    }
    const detail::tf32x3::SplitArgs a = wg_args(16);
    detail::tf32x3::run_tf32x3_sm90_forward<64>(p, a, kSchedule, stream);
    time_us("wgmma combine s=16", true,
            [&] { detail::launch_split_kv_combine<float>(p, a.partials, stream); });
    time_us("wgmma pair s=16, programmatic", true, [&] {
      detail::tf32x3::run_tf32x3_sm90_forward<64>(p, a, kSchedule, stream);
      detail::launch_split_kv_combine<float>(p, a.partials, stream, true);
    });
    detail::tf32x3::SplitArgs merged = a;  // 2c.5: the splits merge behind a grid barrier
    merged.merge_in_grid = true;
    time_us("wgmma s=16, merged in grid", true,
            [&] { detail::tf32x3::run_tf32x3_sm90_forward<64>(p, merged, kSchedule, stream); });
  }
#endif
  // The host steps, each timed over batches of calls with the GPU left to drain between
  // batches (a full launch queue would block the host and count the GPU's time instead).
  auto host_step_us = [&](const char* what, int batch, auto&& body) {
    for (int i = 0; i < batch; ++i) body();
    check(cudaDeviceSynchronize(), what);
    std::vector<double> us;
    for (int r = 0; r < 15; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < batch; ++i) body();
      const auto t1 = std::chrono::steady_clock::now();
      us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / batch);
      check(cudaDeviceSynchronize(), what);
    }
    rows.push_back({what, median(us)});
    std::printf("%-28s %8.2f us\n", what, rows.back().us);
  };
  volatile int64_t kept_result = 0;  // keeps the timed calls' results alive
  host_step_us("host: validate", 1000, [&] {
    const AttentionParams q_params = detail::validate({tq, tk, tv, &tout, nullptr, o, "breakdown"});
    kept_result = q_params.head_dim;
  });
  host_step_us("host: plan()", 1000, [&] {
    const Plan again = plan(tq, tk, tv, tout, o);
    kept_result = again.workspace_bytes;
  });
  host_step_us("host: device guard", 1000, [&] { const detail::DeviceGuard on_device(0); });
  {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t pool = nullptr;
    check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
    uint64_t keep = uint64_t(64) << 20;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "pool threshold");
    const size_t bytes = static_cast<size_t>(planned.workspace_bytes);
    host_step_us("host: pool alloc + free", 200, [&] {
      void* at = nullptr;
      check(cudaMallocFromPoolAsync(&at, bytes, pool, stream), "cudaMallocFromPoolAsync");
      check(cudaFreeAsync(at, stream), "cudaFreeAsync");
    });
    check(cudaMemPoolDestroy(pool), "cudaMemPoolDestroy");
  }
  host_step_us("host: empty launch", 200, [&] { empty_kernel<<<1, 32, 0, stream>>>(); });
  host_step_us("host: forward launch", 20, [&] {
    detail::tf32x3::run_tf32x3_forward<64>(p, args, precision, stream);
  });
  host_step_us("host: combine launch", 20, [&] {
    detail::launch_split_kv_combine<float>(p, args.partials, stream, true);
  });
  if (!csv.empty()) {
    std::ofstream f(csv);
    f << "what,us\n";
    for (const Row& r : rows) f << r.what << "," << r.us << "\n";
  }
  return 0;
}
