// Every CUDA backend against the double-precision oracle. Each test skips when no CUDA
// device is present (CI); on the H200 they run, also under compute-sanitizer.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "support/oracle_check.hpp"
#include "support/backend_grid.hpp"
#include "support/device_case.hpp"
#include "support/concurrent_runs.hpp"
#include "support/nonfinite_cases.hpp"
#include "cuda/workspace_pool.hpp"
#include "flashtile/device.hpp"

namespace flashtile {
namespace {

using testing::AttentionCase;
using testing::DeviceCase;
using testing::Shape;

// The CUDA backends of this build that serve `dtype` (asked through the selector, so a new
// backend is tested as soon as it is registered).
std::vector<Backend> cuda_backends_for(DType dtype) {
  std::vector<Backend> out;
  for (Backend b : all_backends()) {
    if (backend_device(b) != DeviceType::cuda || !backend_available(b)) continue;
    Shape s;
    s.dtype = dtype;
    AttentionCase c(s);
    DeviceCase d(c);
    Options o;
    o.backend = b;
    try {
      plan(d.q.view, d.k.view, d.v.view, d.out.view, o);
      out.push_back(b);
    } catch (const Error&) {
    }
  }
  return out;
}

using testing::small_grid;

void expect_matches_oracle(Backend backend, const Shape& shape) {
  AttentionCase c(shape);
  DeviceCase d(c);
  d.run(c, backend);
  EXPECT_TRUE(testing::matches_oracle(c)) << backend_name(backend);
}

TEST(CudaF32, MatchesOracleOnGrid) {
  FLASHTILE_SKIP_WITHOUT_CUDA();
  const auto backends = cuda_backends_for(DType::f32);
  ASSERT_FALSE(backends.empty());
  for (Backend b : backends)
    for (const Shape& s : testing::backend_grid({32, 64, 128}, DType::f32, !small_grid()))
      expect_matches_oracle(b, s);
}

TEST(CudaF32, UnsupportedHeadDimIsRefusedClearly) {
  FLASHTILE_SKIP_WITHOUT_CUDA();
  for (Backend b : {Backend::cuda_naive, Backend::cuda_tiled}) {
    Shape s;
    s.head_dim = 40;
    AttentionCase c(s);
    DeviceCase d(c);
    Options o;
    o.backend = b;
    try {
      forward(d.q.view, d.k.view, d.v.view, d.out.view, o);
      FAIL() << backend_name(b) << " accepted head_dim 40";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("head_dim 32, 64, 128; got 40"), std::string::npos)
          << e.what();
      EXPECT_EQ(e.kind(), ErrorKind::unsupported);
    }
  }
}

TEST(CudaF32, DeterministicOver100Runs) {
  FLASHTILE_SKIP_WITHOUT_CUDA();
  Shape s;
  s.batch = 2;
  s.seqlen_q = 257;
  s.seqlen_k = 300;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.causal = true;
  for (Backend b : cuda_backends_for(DType::f32)) {
    AttentionCase c(s);
    DeviceCase d(c);
    d.run(c, b);
    const testing::HostBytes first = c.out.bytes;
    for (int run = 1; run < 100; ++run) {
      d.poison();
      d.run(c, b);
      ASSERT_EQ(c.out.bytes, first) << backend_name(b) << " run " << run;
    }
  }
}

TEST(CudaF32, CpuTensorsAreRefusedByCudaBackend) {
  FLASHTILE_SKIP_WITHOUT_CUDA();
  AttentionCase c(Shape{});
  Options o = c.options(Backend::cuda_tiled);
  const auto before = c.out.bytes;
  EXPECT_THROW(forward(c.q.view, c.k.view, c.v.view, c.out.view, o), Error);
  EXPECT_EQ(c.out.bytes, before);
}

// N = 131072 on one head: S would need 64 GiB; the flash kernels need none. Rows are
// independent (non-causal), so a few sampled rows are checked against the oracle.
TEST(CudaF32, LongSequenceWithoutScoreMatrix) {
  FLASHTILE_SKIP_WITHOUT_CUDA();
  Shape s;
  s.seqlen_q = s.seqlen_k = 131072;
  s.head_dim = 64;
  AttentionCase c(s);
  DeviceCase d(c);
  for (Backend b : {Backend::cuda_naive, Backend::cuda_tiled}) {
    Options o = c.options(b);
    EXPECT_EQ(plan(d.q.view, d.k.view, d.v.view, d.out.view, o).workspace_bytes, 0);
    d.poison();
    d.run(c, b);
    testing::expect_rows_match_oracle(c, {0, 77777, 131071}, std::string(backend_name(b)) + " ");
  }
}

// Every CUDA backend runs on the tensors' device and gives the caller back its current one.
TEST(CudaDevices, CallersCurrentDeviceIsRestored) {
  FLASHTILE_SKIP_WITHOUT_CUDA();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  for (DType dtype : {DType::f32, DType::bf16}) {
    Shape s;
    s.dtype = dtype;
    s.seqlen_q = s.seqlen_k = 70;
    AttentionCase c(s);
    DeviceCase d(c, /*device_index=*/0);
    for (Backend backend : cuda_backends_for(dtype)) {
      ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
      d.run(c, backend);
      int current = -1;
      ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
      EXPECT_EQ(current, 1) << backend_name(backend) << " left the current device changed";
      EXPECT_TRUE(testing::matches_oracle(c)) << backend_name(backend);
    }
  }
}

// The NaN/Inf rule (docs/VARIANTS.md) on every CUDA backend and the dtypes it serves,
// variants included where the backend takes them.
TEST(CudaBackends, NonFiniteValuesFollowTheRule) {
  FLASHTILE_SKIP_WITHOUT_CUDA();
  int ran = 0;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (Backend b : cuda_backends_for(dtype))
      for (const testing::NonFiniteCase& nf : testing::nonfinite_cases(dtype, /*variants=*/true)) {
        AttentionCase c(nf.shape);
        nf.plant(c);
        DeviceCase d(c);
        const Options o = d.options(c, b);
        try {
          plan(d.q.view, d.k.view, d.v.view, d.out.view, o);
        } catch (const Error&) {
          continue;  // a journey step and a variant
        }
        d.run(c, o);
        EXPECT_TRUE(testing::matches_nonfinite_oracle(c, testing::nonfinite_tolerance(dtype), nf.expect_nan,
                                                      nf.spreading_v_channel))
            << backend_name(b) << " " << dtype_name(dtype) << " " << nf.name;
        ++ran;
      }
  EXPECT_GE(ran, 10);
}

// Eight host threads on four CUDA streams get bitwise the results of one thread: the CUDA
// backends and the varlen validation (its pinned staging is per thread) keep no shared
// mutable state between calls.
TEST(CudaThreads, EightThreadsOnFourStreamsMatchSerialBitwise) {
  FLASHTILE_SKIP_WITHOUT_CUDA();
  constexpr int kThreads = 8, kStreams = 4;
  std::vector<std::pair<Backend, DType>> runs;  // every backend in each dtype it serves
  for (DType dtype : {DType::f32, DType::bf16})
    for (Backend b : cuda_backends_for(dtype)) runs.emplace_back(b, dtype);
  std::vector<cudaStream_t> streams(kStreams);
  for (cudaStream_t& st : streams) ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  int tested = 0;
  for (const auto& run : runs) {
    const Backend backend = run.first;
    const DType dtype = run.second;
    // Varlen batches in a quarter of the threads, where the backend takes them.
    std::vector<AttentionCase> cases;
    std::vector<DeviceCase> device;
    std::vector<Options> options;
    auto build = [&](bool with_varlen) {
      cases.clear(), device.clear(), options.clear();
      cases.reserve(kThreads), device.reserve(kThreads);
      for (int t = 0; t < kThreads; ++t) {
        Shape s;
        s.batch = 1 + t % 2, s.heads_q = 4, s.heads_kv = 2, s.head_dim = 64;
        s.seqlen_q = 100 + 37 * t, s.seqlen_k = 130 + 29 * t;
        s.causal = t % 2 == 1;
        s.dtype = dtype;
        if (with_varlen && t % 4 == 3) s.varlen_q = {17, 1, 90 + t}, s.varlen_k = {40, 0, 70 + t};
        cases.emplace_back(s, 300 + t);
      }
      for (const AttentionCase& c : cases) device.emplace_back(c);
      for (int t = 0; t < kThreads; ++t) {
        options.push_back(device[t].options(cases[t], backend));
        options.back().stream = streams[t % kStreams];
        try {
          testing::plan_call(device[t].q.view, device[t].k.view, device[t].v.view, device[t].out.view,
                    options.back(), device[t].varlen(cases[t]));
        } catch (const Error&) {
          return false;
        }
      }
      return true;
    };
    if (!build(/*with_varlen=*/true)) ASSERT_TRUE(build(/*with_varlen=*/false)) << backend_name(backend);
    auto run_on_stream = [&](int t) {
      DeviceCase& d = device[t];
      d.poison();
      testing::run_forward(d.q.view, d.k.view, d.v.view, d.out.view, options[t], d.varlen(cases[t]));
      if (cudaStreamSynchronize(streams[t % kStreams]) != cudaSuccess)
        throw std::runtime_error("cudaStreamSynchronize failed");
      d.copy_back(cases[t]);
    };
    std::vector<testing::HostBytes> serial_out;
    std::vector<std::vector<float>> serial_lse;
    for (int t = 0; t < kThreads; ++t) {
      run_on_stream(t);
      EXPECT_TRUE(testing::matches_oracle(cases[t])) << backend_name(backend) << " case " << t;
      serial_out.push_back(cases[t].out.bytes);
      serial_lse.push_back(cases[t].lse);
    }
    testing::expect_concurrent_runs_match(kThreads, /*repeats=*/5, cases, serial_out, serial_lse,
                                          run_on_stream, std::string(backend_name(backend)));
    ++tested;
  }
  for (cudaStream_t st : streams) cudaStreamDestroy(st);
  EXPECT_GE(tested, 3);  // cuda_naive, cuda_tiled (fp32) and cuda_mma (bf16) at least
}

// cuda_median_ms queues its calls: while the GPU runs before_each's work (a 4 GiB fill, about
// a millisecond), the host gets through a call's own host time (a 0.3 ms sleep) and queues
// its launch, so the call's time is the GPU's alone. Waiting for the device in before_each
// (the CLI's --isolated) times the sleep as well.
TEST(CudaTiming, QueuedCallsExcludeTheHostsTimeBeforeTheLaunch) {
  FLASHTILE_SKIP_WITHOUT_CUDA();
  DeviceBuffer busy(size_t(4) << 30, 0), small(size_t(16) << 20, 0);
  auto call = [&] {
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    small.fill_bytes_async(0x11);
  };
  const double queued = cuda_median_ms(0, 1, 9, call, [&] { busy.fill_bytes_async(0x22); });
  const double isolated = cuda_median_ms(0, 1, 9, call, [&] {
    busy.fill_bytes_async(0x22);
    cuda_synchronize(0);
  });
  EXPECT_LT(queued, 0.15) << "queued calls should not time the host's sleep";
  EXPECT_GT(isolated, 0.28) << "a call from an idle GPU times the host's sleep";
}

// The workspace pool keeps a large workspace across a synchronisation (the default pool
// would hand it back to the driver there, and the next backward would map it again).
TEST(CudaWorkspacePool, KeepsTheLargestWorkspaceAcrossSynchronisations) {
  FLASHTILE_SKIP_WITHOUT_CUDA();
  constexpr size_t kBytes = size_t(300) << 20;  // over the pool's 64 MiB floor
  void* workspace = detail::allocate_workspace(kBytes, 0, cudaStreamLegacy);
  ASSERT_EQ(cudaFreeAsync(workspace, cudaStreamLegacy), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaMemPool_t pool = detail::workspace_pool(0);
  uint64_t reserved = 0;
  ASSERT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved), cudaSuccess);
  EXPECT_GE(reserved, kBytes);
  // The next call of that size is served from what was kept.
  workspace = detail::allocate_workspace(kBytes, 0, cudaStreamLegacy);
  uint64_t reserved_again = 0;
  ASSERT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved_again),
            cudaSuccess);
  EXPECT_EQ(reserved_again, reserved);
  ASSERT_EQ(cudaFreeAsync(workspace, cudaStreamLegacy), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace flashtile
