// Split-KV on the GPU, host side (split_kv_launch.hpp), and the combine kernel's
// instantiations for the three output dtypes: one translation unit for every kernel family.
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "attn/split_kv.hpp"
#include "cuda/common.cuh"
#include "cuda/split_kv_combine.cuh"
#include "cuda/split_kv_launch.hpp"
#include "cuda/workspace_pool.hpp"

namespace flashtile::detail {
namespace {

// A split keeps at least this many key blocks of its tile's heaviest range.
constexpr int kMinBlocksPerSplit = 1;

// A split call on the legacy default stream reuses one workspace per device instead of an
// allocation and a free from the pool (1.3 us of host time a call on the H200 host, more than
// a tenth of the write-up's case: docs/JOURNEY.md, 2c.7). That stream orders every call made
// on it and is never destroyed, so one buffer serves them all; the mutex is held until the
// call's kernels are queued, so that growing the buffer (a stream-ordered free and
// allocation) can never pass a call that still holds the old one. Other streams (which may
// run at once, or be destroyed with work in flight), and larger calls, keep the pool.
constexpr uint64_t kReusedWorkspaceMaxBytes = uint64_t(64) << 20;
struct LegacyStreamWorkspace {
  std::mutex mutex;
  void* data = nullptr;
  size_t bytes = 0;
};
LegacyStreamWorkspace& legacy_stream_workspace(int device) {
  static std::mutex mutex;
  static auto* workspaces = new std::map<int, LegacyStreamWorkspace>();  // as the pools
  const std::lock_guard<std::mutex> lock(mutex);
  return (*workspaces)[device];
}
bool is_legacy_stream(cudaStream_t stream) {
  return stream == nullptr || stream == cudaStreamLegacy;
}

void combine_split_kv(const AttentionParams& p, const SplitPartials& parts, cudaStream_t stream,
                      bool overlap_with_producer) {
  switch (p.dtype) {
    case DType::f32: launch_split_kv_combine<float>(p, parts, stream, overlap_with_producer); break;
    case DType::f16: launch_split_kv_combine<__half>(p, parts, stream, overlap_with_producer); break;
    case DType::bf16:
      launch_split_kv_combine<__nv_bfloat16>(p, parts, stream, overlap_with_producer);
      break;
  }
}

// The forward and, unless it merges its partials itself, the combine after it.
void launch_split(const AttentionParams& p, const SplitPartials& parts, cudaStream_t stream,
                  FunctionRef<void(const SplitPartials&)> forward,
                  bool merged_in_forward) {
  forward(parts);
  // sm_90+: the combine's launch overlaps the forward's tail (the forward allows it).
  if (!merged_in_forward)
    combine_split_kv(p, parts, stream, device_facts(p.device_index).cc.number() >= 90);
}

}  // namespace

int pinned_splits(const char* name) { return pinned_splits(name, std::getenv(name)); }

int pinned_splits(const char* name, const char* value) {
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  if (*end != '\0' || n < 1 || n > kMaxSplits)
    throw Error(ErrorKind::invalid_argument, std::string(name) + " must be an integer from 1 to " +
                                                 std::to_string(kMaxSplits) + "; got \"" + value +
                                                 "\"");
  return static_cast<int>(n);
}

int64_t resident_ctas(const AttentionParams& p, const SplitTile& tile) {
  const DeviceFacts& facts = device_facts(p.device_index);
  const int by_smem = facts.smem_per_sm / tile.smem_bytes;
  const int ctas_per_sm = by_smem < tile.ctas_per_sm ? by_smem : tile.ctas_per_sm;
  return int64_t(facts.sms) * (ctas_per_sm > 0 ? ctas_per_sm : 1);
}

SplitPlan split_plan(const AttentionParams& p, const SplitTile& tile, const char* pin_variable) {
  return split_plan(p, tile, pinned_splits(pin_variable));
}

SplitPlan split_plan(const AttentionParams& p, const SplitTile& tile, int pinned) {
  SplitPlan plan;
  plan.tile = tile;
  plan.query_blocks = static_cast<int>((p.seqlen_q + tile.block_m - 1) / tile.block_m);
  plan.tiles = p.batch * p.heads_q * plan.query_blocks;
  if (pinned > 0) {
    plan.splits = pinned;
    return plan;
  }
  const int64_t key_blocks = (p.seqlen_k + tile.block_n - 1) / tile.block_n;
  plan.splits = choose_splits(plan.tiles, key_blocks, resident_ctas(p, tile), kMinBlocksPerSplit,
                              kMaxSplits);
  return plan;
}

void run_split_forward(const AttentionParams& p, const SplitPlan& plan, cudaStream_t stream,
                       FunctionRef<void(const SplitPartials&)> forward,
                       bool merged_in_forward) {
  if (plan.splits == 1) {
    forward(SplitPartials{});
    return;
  }
  const auto bytes = static_cast<size_t>(plan.workspace_bytes());
  auto partials_at = [&](void* workspace) {
    return SplitPartials::at(workspace, plan.tiles, plan.splits, plan.tile.block_m,
                             plan.tile.pitch, plan.query_blocks);
  };
  if (is_legacy_stream(stream) && bytes <= kReusedWorkspaceMaxBytes) {
    LegacyStreamWorkspace& reused = legacy_stream_workspace(p.device_index);
    const std::lock_guard<std::mutex> lock(reused.mutex);
    if (reused.bytes < bytes) {
      if (reused.data != nullptr)
        check_cuda(cudaFreeAsync(reused.data, stream), "cudaFreeAsync(split-KV workspace)");
      reused.data = nullptr;
      reused.bytes = 0;
      reused.data = allocate_workspace(bytes, p.device_index, stream);
      reused.bytes = bytes;
    }
    launch_split(p, partials_at(reused.data), stream, forward, merged_in_forward);
    return;
  }
  void* workspace = allocate_workspace(bytes, p.device_index, stream);
  try {
    launch_split(p, partials_at(workspace), stream, forward, merged_in_forward);
  } catch (...) {
    cudaFreeAsync(workspace, stream);
    throw;
  }
  check_cuda(cudaFreeAsync(workspace, stream), "cudaFreeAsync(split-KV workspace)");
}

}  // namespace flashtile::detail
