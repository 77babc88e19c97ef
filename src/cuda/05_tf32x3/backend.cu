// cuda_tf32x3 as a backend: what it accepts (checked on the host, before anything runs), how
// many key splits a call gets, its workspace, and the two launches (forward, then the
// split-KV combine when the keys are split, as a programmatic dependent launch on sm_90+).
// The kernel and its journey note are in kernel.cuh.
//
// Five environment knobs, read per call in one pass (plan() and forward() agree on them):
//   FLASHTILE_TF32X3_SPLITS=N  pins the key splits to N (1 = never split; at most 16)
//                              instead of choosing them from the SM count
//   FLASHTILE_TF32X3_MODE=single  plain TF32 (one product, ~1e-3 relative error: it fails
//                              the fp32 rule and is never the default); "split" = 3xTF32
//   FLASHTILE_TF32X3_PATH=mma     the mma.sync kernel even where the wgmma one (step 2c,
//                              sm_90a) would serve; "unsplit" the wgmma kernel only for
//                              calls it runs without a key split (the sixth session's
//                              choice, split calls on mma.sync); "auto" (default): the
//                              wgmma kernel for every call it covers, split or not (2c.3)
//   FLASHTILE_TF32X3_SM90_SCHEDULE=producer|pingpong|together  the wgmma path's d=128
//                              pipeline: a producer warpgroup for the K/V split, or the
//                              order of the two warpgroups with the split between barriers
//                              (sm90.hpp)
//   FLASHTILE_TF32X3_MERGE=combine  a split call's partials always go to the combine kernel;
//                              "auto" (default): the d=64 wgmma kernel merges them itself
//                              behind a grid barrier where its grid fits the GPU at once (2c.5)
#include <climits>
#include <cstdint>
#include <string>

#include "common/environment.hpp"
#include "cuda/05_tf32x3/kernel.cuh"
#include "cuda/05_tf32x3/selection.hpp"
#include "cuda/device_guard.cuh"
#include "cuda/split_kv_launch.hpp"
#if FLASHTILE_TF32X3_WITH_SM90
#include "cuda/05_tf32x3/sm90.hpp"
#endif

namespace flashtile::detail {
namespace {

constexpr int kMinComputeCapability = 80;  // mma.sync tf32, cp.async
constexpr int kMaxHeadDim = 128;
constexpr const char* kPinSplits = "FLASHTILE_TF32X3_SPLITS";

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

// The tile of the mma.sync kernel that serves a head dim.
SplitTile geometry(int64_t head_dim) {
  switch (tf32x3::specialised_head_dim(head_dim)) {
    case 64: return split_tile_of<tf32x3::Tf32Traits<64>>();
    case 128: return split_tile_of<tf32x3::Tf32Traits<128>>();
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

// The knobs' values (null: unset), read once per call.
struct Tf32x3Environment {
  const char *splits, *mode, *path, *merge, *schedule;
};
Tf32x3Environment read_environment() {
  const auto v = environment_values<5>(
      "FLASHTILE_TF32X3_", {kPinSplits, "FLASHTILE_TF32X3_MODE", "FLASHTILE_TF32X3_PATH",
                            "FLASHTILE_TF32X3_MERGE", "FLASHTILE_TF32X3_SM90_SCHEDULE"});
  return {v[0], v[1], v[2], v[3], v[4]};
}

tf32x3::Precision precision_of(const char* value) {
  if (value == nullptr || *value == '\0' || std::string(value) == "split")
    return tf32x3::Precision::split3;
  if (std::string(value) == "single") return tf32x3::Precision::single;
  throw Error(ErrorKind::invalid_argument,
              std::string("FLASHTILE_TF32X3_MODE must be \"split\" or \"single\"; got \"") +
                  value + "\"");
}

// The split plan of a call on the kernel with `tile` (split_kv_launch.hpp). The write-up's
// case (1024 rows, d=64) on the wgmma kernel: 8 query blocks of 128 rows, 16 splits of one
// 64-key tile each, 128 CTAs (JOURNEY 2c.3).
SplitPlan tf32x3_split_plan(const AttentionParams& p, const SplitTile& tile,
                            const Tf32x3Environment& env) {
  return split_plan(p, tile, pinned_splits(kPinSplits, env.splits));
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
// FLASHTILE_TF32X3_PATH (read only where the wgmma path exists).
enum class WgmmaPath { every_call, unsplit_calls, never };
WgmmaPath wgmma_path_of(const char* value) {
  if (value == nullptr || *value == '\0' || std::string(value) == "auto")
    return WgmmaPath::every_call;
  if (std::string(value) == "unsplit") return WgmmaPath::unsplit_calls;
  if (std::string(value) == "mma") return WgmmaPath::never;
  throw Error(ErrorKind::invalid_argument,
              std::string("FLASHTILE_TF32X3_PATH must be \"auto\", \"unsplit\" or \"mma\"; "
                          "got \"") +
                  value + "\"");
}

// The wgmma kernel's tile for head dim 64 or 128: one CTA per SM (225 KB).
SplitTile sm90_geometry(int64_t head_dim) {
  const tf32x3::Tf32Sm90Tile tile =
      head_dim == 64 ? tf32x3::tf32x3_sm90_tile<64>() : tf32x3::tf32x3_sm90_tile<128>();
  return {tile.block_m, tile.block_n, tile.smem_bytes, 1, static_cast<int>(head_dim)};
}
#endif

// FLASHTILE_TF32X3_MERGE (read only where the wgmma path runs a split call).
bool merge_in_grid_allowed(const char* value) {
  if (value == nullptr || *value == '\0' || std::string(value) == "auto") return true;
  if (std::string(value) == "combine") return false;
  throw Error(ErrorKind::invalid_argument,
              std::string("FLASHTILE_TF32X3_MERGE must be \"auto\" or \"combine\"; got \"") +
                  value + "\"");
}

// Whether a split call on the d=64 wgmma kernel (the overlapped pipeline, the only one with
// the in-kernel merge) merges its partials itself: each split takes block_m / splits rows,
// and the grid barrier needs every CTA resident at once (a cooperative launch).
bool merges_in_grid(const AttentionParams& p, const SplitPlan& split, const char* merge) {
  if (split.splits == 1 || p.head_dim != 64 || split.tile.block_m % split.splits != 0)
    return false;
  if (!device_facts(p.device_index).cooperative_launch) return false;
  return split.tiles * split.splits <= resident_ctas(p, split.tile) && merge_in_grid_allowed(merge);
}

// A call's kernel and precision, the split plan worked out for that kernel's tile, and where
// the splits are merged.
struct CallPlan {
  Tf32x3Kernel kernel = Tf32x3Kernel::mma_sync;
  tf32x3::Precision precision = tf32x3::Precision::split3;
  SplitPlan split;
  bool merge_in_grid = false;
  const char* schedule = nullptr;  // FLASHTILE_TF32X3_SM90_SCHEDULE's value
};

// Which kernel a call runs (selection.hpp), and its split plan. The wgmma path (step 2c)
// serves what its kernels cover: sm_90a code built and a 9.0 device, 3xTF32, head_dim 64 or
// 128 exactly, rows on 16 bytes; split or not (2c.3: a split call's partials go to the same
// combine as mma.sync's). Measured (H200, one call, fp32 field grid, 16k tokens, seqlen
// 1k-16k, full and causal; docs/JOURNEY.md step 2c): wgmma 47.3-60.6 TFLOP/s at d=64 and
// 50.2-64.0 at d=128 against mma.sync's 36.0-40.9 and 33.3-42.1, 1.31-1.54x at every
// point, so it takes every call it covers. Not timed apart: varlen, windows, softcap,
// ALiBi, sinks (correct on both: tests/cuda/test_cuda_tf32x3_sm90.cpp).
CallPlan call_plan(const AttentionParams& p) {
  const Tf32x3Environment env = read_environment();
  const tf32x3::Precision precision = precision_of(env.mode);
#if FLASHTILE_TF32X3_WITH_SM90
  const bool covered = device_facts(p.device_index).cc.number() == 90 &&
                       (p.head_dim == 64 || p.head_dim == 128) && tf32x3::rows_aligned_16(p) &&
                       precision == tf32x3::Precision::split3;
  if (covered) {
    const WgmmaPath path = wgmma_path_of(env.path);
    if (path != WgmmaPath::never) {
      const SplitPlan split = tf32x3_split_plan(p, sm90_geometry(p.head_dim), env);
      if (path == WgmmaPath::every_call || split.splits == 1)
        return {Tf32x3Kernel::wgmma, precision, split, merges_in_grid(p, split, env.merge),
                env.schedule};
    }
  }
#endif
  return {Tf32x3Kernel::mma_sync, precision, tf32x3_split_plan(p, geometry(p.head_dim), env),
          false, env.schedule};
}

int64_t tf32x3_workspace_bytes(const AttentionParams& p) {
  return call_plan(p).split.workspace_bytes();
}

}  // namespace

// selection.hpp: the same choice, from the environment and the SM count.
Tf32x3Kernel tf32x3_kernel_for(const AttentionParams& p) {
  return call_plan(p).kernel;
}
int tf32x3_splits_for(const AttentionParams& p) {
  return call_plan(p).split.splits;
}
bool tf32x3_merges_in_grid_for(const AttentionParams& p) {
  return call_plan(p).merge_in_grid;
}

namespace {

void run_tf32x3(const AttentionParams& p) {
  const DeviceGuard on_device(p.device_index);
  auto stream = static_cast<cudaStream_t>(p.stream);
  const CallPlan call = call_plan(p);
  // The chosen kernel's forward: finished rows, or with splits > 1 the partials.
  auto forward = [&](const tf32x3::SplitArgs& args) {
#if FLASHTILE_TF32X3_WITH_SM90
    if (call.kernel == Tf32x3Kernel::wgmma) {
      const tf32x3::Tf32Sm90Schedule schedule = tf32x3::tf32x3_sm90_schedule_of(call.schedule);
      if (p.head_dim == 64)
        tf32x3::run_tf32x3_sm90_forward<64>(p, args, schedule, stream);
      else
        tf32x3::run_tf32x3_sm90_forward<128>(p, args, schedule, stream);
      return;
    }
#endif
    launch_forward(p, args, call.precision, stream);
  };
  run_split_forward(
      p, call.split, stream,
      [&](const SplitPartials& partials) {
        tf32x3::SplitArgs args;
        args.splits = call.split.splits;
        args.partials = partials;
        args.merge_in_grid = call.merge_in_grid;
        forward(args);
      },
      call.merge_in_grid);
}

}  // namespace

BackendEntry make_cuda_tf32x3_backend() {
  // Above cuda_tiled (20): auto takes it for the fp32 calls it covers.
  return {Backend::cuda_tf32x3, DeviceType::cuda, /*priority=*/25, tf32x3_unavailable,
          tf32x3_unsupported, tf32x3_workspace_bytes, run_tf32x3};
}

}  // namespace flashtile::detail
