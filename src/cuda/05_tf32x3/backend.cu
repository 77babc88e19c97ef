// cuda_tf32x3 as a backend: what it accepts (checked on the host, before anything runs), how
// many key splits a call gets, its workspace, and the two launches (forward, then the
// split-KV combine when the keys are split, as a programmatic dependent launch on sm_90+).
// The kernel and its journey note are in kernel.cuh.
//
// Four environment knobs, read per call (plan() and forward() agree on them):
//   FLASHTILE_TF32X3_SPLITS=N  pins the key splits to N (1 = never split; at most 16)
//                              instead of choosing them from the SM count
//   FLASHTILE_TF32X3_MODE=single  plain TF32 (one product, ~1e-3 relative error: it fails
//                              the fp32 rule and is never the default); "split" = 3xTF32
//   FLASHTILE_TF32X3_PATH=mma     the mma.sync kernel even where the wgmma one (step 2c,
//                              sm_90a) would serve; "auto" (default) picks per call
//   FLASHTILE_TF32X3_SM90_SCHEDULE=pingpong|together  the order of the wgmma path's two
//                              warpgroups at d=128 (sm90.hpp)
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "cuda/05_tf32x3/kernel.cuh"
#include "cuda/05_tf32x3/selection.hpp"
#include "cuda/device_guard.cuh"
#if FLASHTILE_TF32X3_WITH_SM90
#include "cuda/05_tf32x3/sm90.hpp"
#endif

namespace flashtile::detail {
namespace {

constexpr int kMinComputeCapability = 80;  // mma.sync tf32, cp.async
constexpr int kMaxHeadDim = 128;
// A split keeps at least this many key blocks of its tile's heaviest range.
constexpr int kMinBlocksPerSplit = 1;

// From the cached facts: the driver is asked once per device, not on every call.
std::string device_unsuitable(int device_index) {
  std::string why;
  const DeviceFacts* facts = find_device_facts(device_index, why);
  if (facts == nullptr) return why;
  if (facts->cc.number() < kMinComputeCapability)
    return "cuda_tf32x3 needs compute capability >= 8.0 (sm_80); device " +
           std::to_string(device_index) + " has " + facts->cc.text();
  return "";
}

// Whether the backend can run at all (a CUDA device, device 0 sm_80+): the same answer for
// the whole process, so it is worked out on the first call only.
std::string tf32x3_unavailable() {
  static const std::string reason = [] {
    if (std::string why = cuda_backend_unavailable(); !why.empty()) return why;
    return device_unsuitable(0);
  }();
  return reason;
}

// The geometry of the kernel that serves a head dim.
struct Geometry {
  int block_m = 0, block_n = 0, smem_bytes = 0, ctas_per_sm = 0, head_dim = 0;
};
template <class Cfg>
Geometry geometry_of() {
  return {Cfg::kBlockM, Cfg::kBlockN, Cfg::kSmemBytes, Cfg::kMinBlocks, Cfg::kHeadDim};
}
Geometry geometry(int64_t head_dim) {
  switch (tf32x3::specialised_head_dim(head_dim)) {
    case 64: return geometry_of<tf32x3::Tf32Traits<64>>();
    case 128: return geometry_of<tf32x3::Tf32Traits<128>>();
  }
  return {};
}

std::string tf32x3_unsupported(const AttentionParams& p) {
  if (p.dtype != DType::f32)
    return "cuda_tf32x3 supports float32; got " + std::string(dtype_name(p.dtype));
  if (p.head_dim < 1 || p.head_dim > kMaxHeadDim)
    return "cuda_tf32x3 supports head_dim 1 to " + std::to_string(kMaxHeadDim) + "; got " +
           std::to_string(p.head_dim);
  // Sequence positions are 32-bit inside the kernel (element offsets stay 64-bit).
  constexpr int64_t kMaxSeqlen = INT_MAX - 1024;
  if (p.seqlen_q > kMaxSeqlen || p.seqlen_k > kMaxSeqlen)
    return "cuda_tf32x3 supports seqlen up to " + std::to_string(kMaxSeqlen) + "; got seqlen_q " +
           std::to_string(p.seqlen_q) + ", seqlen_k " + std::to_string(p.seqlen_k);
  if (std::string why = grid_unsupported(p); !why.empty()) return why;
  if (std::string why = device_unsuitable(p.device_index); !why.empty()) return why;
  const int smem_optin = device_facts(p.device_index).smem_optin;
  if (const int needed = geometry(p.head_dim).smem_bytes; needed > smem_optin)
    return "cuda_tf32x3 at head_dim " + std::to_string(p.head_dim) + " needs " +
           std::to_string(needed) + " bytes of shared memory per block; device " +
           std::to_string(p.device_index) + " allows " + std::to_string(smem_optin);
  return "";
}

// FLASHTILE_TF32X3_SPLITS, or 0 when unset.
int pinned_splits() {
  const char* value = std::getenv("FLASHTILE_TF32X3_SPLITS");
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  if (*end != '\0' || n < 1 || n > kMaxSplits)
    throw Error(ErrorKind::invalid_argument,
                "FLASHTILE_TF32X3_SPLITS must be an integer from 1 to " +
                    std::to_string(kMaxSplits) + "; got \"" + value + "\"");
  return static_cast<int>(n);
}

tf32x3::Precision precision_from_environment() {
  const char* value = std::getenv("FLASHTILE_TF32X3_MODE");
  if (value == nullptr || *value == '\0' || std::string(value) == "split")
    return tf32x3::Precision::split3;
  if (std::string(value) == "single") return tf32x3::Precision::single;
  throw Error(ErrorKind::invalid_argument,
              std::string("FLASHTILE_TF32X3_MODE must be \"split\" or \"single\"; got \"") +
                  value + "\"");
}

// How a call's keys are split, and what its partials take.
struct SplitPlan {
  int splits = 1, query_blocks = 0;
  int64_t tiles = 0;
  Geometry geo;
  int64_t workspace_bytes() const {
    return splits > 1 ? SplitPartials::bytes(tiles, splits, geo.block_m, geo.head_dim) : 0;
  }
};

// Splits when the (query block, head, batch) tiles cannot fill the SMs (CTAs that fit at
// once: SMs x CTAs per SM), as choose_splits decides for cpu_flash's threads.
SplitPlan split_plan(const AttentionParams& p) {
  SplitPlan plan;
  plan.geo = geometry(p.head_dim);
  plan.query_blocks = static_cast<int>((p.seqlen_q + plan.geo.block_m - 1) / plan.geo.block_m);
  plan.tiles = p.batch * p.heads_q * plan.query_blocks;
  if (const int pinned = pinned_splits(); pinned > 0) {
    plan.splits = pinned;
    return plan;
  }
  const DeviceFacts& facts = device_facts(p.device_index);
  const int sms = facts.sms;
  const int by_smem = facts.smem_per_sm / plan.geo.smem_bytes;
  const int ctas_per_sm = by_smem < plan.geo.ctas_per_sm ? by_smem : plan.geo.ctas_per_sm;
  const int64_t key_blocks = (p.seqlen_k + plan.geo.block_n - 1) / plan.geo.block_n;
  plan.splits = choose_splits(plan.tiles, key_blocks, int64_t(sms) * (ctas_per_sm > 0 ? ctas_per_sm : 1),
                              kMinBlocksPerSplit, kMaxSplits);
  return plan;
}

int64_t tf32x3_workspace_bytes(const AttentionParams& p) { return split_plan(p).workspace_bytes(); }

// The split partials come from a stream-ordered pool of the backend's own per device, which
// keeps up to kPoolKeepBytes between calls (the default pool would return them to the
// driver at every synchronisation and pay for the allocation again).
constexpr uint64_t kPoolKeepBytes = uint64_t(64) << 20;
cudaMemPool_t workspace_pool(int device) {
  static std::mutex mutex;
  static auto* pools = new std::map<int, cudaMemPool_t>();  // lives as long as the process
  const std::lock_guard<std::mutex> lock(mutex);
  if (auto found = pools->find(device); found != pools->end()) return found->second;
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  check_cuda(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
  uint64_t keep = kPoolKeepBytes;
  check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
             "cudaMemPoolSetAttribute(ReleaseThreshold)");
  (*pools)[device] = pool;
  return pool;
}

void launch_forward(const AttentionParams& p, const tf32x3::SplitArgs& args,
                    tf32x3::Precision precision, cudaStream_t stream) {
  switch (tf32x3::specialised_head_dim(p.head_dim)) {
    case 64: tf32x3::run_tf32x3_forward<64>(p, args, precision, stream); break;
    case 128: tf32x3::run_tf32x3_forward<128>(p, args, precision, stream); break;
    default: throw Error(ErrorKind::unsupported, tf32x3_unsupported(p));  // validated before
  }
}

#if FLASHTILE_TF32X3_WITH_SM90
// FLASHTILE_TF32X3_PATH: false when pinned to "mma" (read only where the wgmma path exists).
bool wgmma_path_allowed() {
  const char* value = std::getenv("FLASHTILE_TF32X3_PATH");
  if (value == nullptr || *value == '\0' || std::string(value) == "auto") return true;
  if (std::string(value) == "mma") return false;
  throw Error(ErrorKind::invalid_argument,
              std::string("FLASHTILE_TF32X3_PATH must be \"auto\" or \"mma\"; got \"") + value +
                  "\"");
}
#endif

// Which kernel a call runs (selection.hpp). The wgmma path (step 2c) serves what its
// kernels cover: sm_90a code built and a 9.0 device, 3xTF32, head_dim 64 or 128 exactly,
// rows on 16 bytes, and no key split (calls small enough to split keep the mma.sync kernel
// and its split-KV combine). Measured (H200, one call, fp32 field grid, 16k tokens, seqlen
// 1k-16k, full and causal; docs/JOURNEY.md step 2c): wgmma 47.3-60.6 TFLOP/s at d=64 and
// 50.2-64.0 at d=128 against mma.sync's 36.0-40.9 and 33.3-42.1, 1.31-1.54x at every
// point, so it takes every call it covers. Not timed apart: varlen, windows, softcap,
// ALiBi, sinks (correct on both: tests/cuda/test_cuda_tf32x3_sm90.cpp).
Tf32x3Kernel kernel_for(const AttentionParams& p, tf32x3::Precision precision,
                        const SplitPlan& plan) {
#if FLASHTILE_TF32X3_WITH_SM90
  const bool covered = device_facts(p.device_index).cc.number() == 90 &&
                       (p.head_dim == 64 || p.head_dim == 128) && tf32x3::rows_aligned_16(p) &&
                       precision == tf32x3::Precision::split3 && plan.splits == 1;
  if (covered && wgmma_path_allowed()) return Tf32x3Kernel::wgmma;
#else
  (void)p, (void)precision, (void)plan;
#endif
  return Tf32x3Kernel::mma_sync;
}

}  // namespace

// selection.hpp: the same choice, from the environment and the SM count.
Tf32x3Kernel tf32x3_kernel_for(const AttentionParams& p) {
  return kernel_for(p, precision_from_environment(), split_plan(p));
}

namespace {

void run_tf32x3(const AttentionParams& p) {
  const DeviceGuard on_device(p.device_index);
  auto stream = static_cast<cudaStream_t>(p.stream);
  const tf32x3::Precision precision = precision_from_environment();
  const SplitPlan plan = split_plan(p);
#if FLASHTILE_TF32X3_WITH_SM90
  if (kernel_for(p, precision, plan) == Tf32x3Kernel::wgmma) {
    if (p.head_dim == 64)
      tf32x3::run_tf32x3_sm90_forward<64>(p, stream);
    else
      tf32x3::run_tf32x3_sm90_forward<128>(p, stream);
    return;
  }
#endif
  tf32x3::SplitArgs args;
  args.splits = plan.splits;
  if (plan.splits == 1) {
    launch_forward(p, args, precision, stream);
    return;
  }
  void* workspace = nullptr;
  check_cuda(cudaMallocFromPoolAsync(&workspace, static_cast<size_t>(plan.workspace_bytes()),
                                     workspace_pool(p.device_index), stream),
             "cudaMallocFromPoolAsync(cuda_tf32x3 split-KV workspace)");
  args.partials = SplitPartials::at(workspace, plan.tiles, plan.splits, plan.geo.block_m,
                                    plan.geo.head_dim, plan.query_blocks);
  try {
    launch_forward(p, args, precision, stream);
    // sm_90+: the combine's launch overlaps the forward's tail (the forward kernel allows it).
    launch_split_kv_combine<float>(p, args.partials, stream,
                                   device_facts(p.device_index).cc.number() >= 90);
  } catch (...) {
    cudaFreeAsync(workspace, stream);
    throw;
  }
  check_cuda(cudaFreeAsync(workspace, stream), "cudaFreeAsync(cuda_tf32x3 split-KV workspace)");
}

}  // namespace

BackendEntry make_cuda_tf32x3_backend() {
  // Above cuda_tiled (20): auto takes it for the fp32 calls it covers.
  return {Backend::cuda_tf32x3, DeviceType::cuda, /*priority=*/25, tf32x3_unavailable,
          tf32x3_unsupported, tf32x3_workspace_bytes, run_tf32x3};
}

}  // namespace flashtile::detail
