// Split-KV on the GPU, host side, for every kernel family (cuda_mma, cuda_sm90, cuda_tf32x3):
// how many splits a call's tiles get, the workspace their partials take, and the sequence
// that runs a split forward (workspace from a pool, the forward writing partials, the
// combine kernel of split_kv_combine.cuh, the workspace handed back). Defined in
// split_kv.cu, which also holds the combine's only instantiations.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "api/params.hpp"
#include "common/function_ref.hpp"
#include "cuda/split_kv_combine.cuh"

namespace flashtile::detail {

// What the split decision needs of the kernel that serves a call: its tile, its shared
// memory and CTAs per SM (how many CTAs the GPU holds at once), and the partials' pitch
// (the kernel's specialised head dim: fp32 columns per partial row).
struct SplitTile {
  int block_m = 0, block_n = 0, smem_bytes = 0, ctas_per_sm = 1, pitch = 0;
};

// The tile of a kernel configuration Cfg (kBlockM, kBlockN, kSmemBytes, kMinBlocks CTAs a
// SM); its partials' pitch is the configuration's (specialised) head dim.
template <class Cfg>
SplitTile split_tile_of() {
  return {Cfg::kBlockM, Cfg::kBlockN, Cfg::kSmemBytes, Cfg::kMinBlocks, Cfg::kHeadDim};
}

// How a call's keys are split and what its partials take.
struct SplitPlan {
  int splits = 1, query_blocks = 0;
  int64_t tiles = 0;  // (query block, head, batch entry) tiles
  SplitTile tile;
  int64_t workspace_bytes() const {
    return splits > 1 ? SplitPartials::bytes(tiles, splits, tile.block_m, tile.pitch) : 0;
  }
};

// The environment variable `name` as a pinned split count (1 = never split, at most
// kMaxSplits), or 0 when it is unset or empty; anything else is an invalid_argument error.
int pinned_splits(const char* name);
// The same for `value`, already read from `name` (null when unset).
int pinned_splits(const char* name, const char* value);

// CTAs of a kernel with `tile` that device p.device_index holds at once (at least one a SM).
int64_t resident_ctas(const AttentionParams& p, const SplitTile& tile);

// The splits of a call on the kernel with `tile`: `pin_variable`'s count when set, else as
// many as fill the resident CTAs (choose_splits: at least one key block a split, at most
// kMaxSplits), 1 when the tiles already fill them.
SplitPlan split_plan(const AttentionParams& p, const SplitTile& tile, const char* pin_variable);
// The same with the pinned count already read (0: none).
SplitPlan split_plan(const AttentionParams& p, const SplitTile& tile, int pinned);

// Runs `forward` (which launches the kernel on `stream`) for `plan`: with one split it gets
// empty partials (splits = 1) and writes out and lse itself; with more, it gets partials in
// a workspace (on the legacy default stream one kept per device, else from the device's
// pool) and, unless `merged_in_forward`, the combine kernel merges them into p.o and p.lse
// after it (a programmatic dependent launch on sm_90+: the forward should call
// allow_dependent_launch()).
void run_split_forward(const AttentionParams& p, const SplitPlan& plan, cudaStream_t stream,
                       FunctionRef<void(const SplitPartials&)> forward,
                       bool merged_in_forward = false);

}  // namespace flashtile::detail
