// cpu_flash internals shared by the backend glue (flash.cpp), the SIMD code
// (flash_hwy.cpp, one copy per Highway target) and the tests/benchmarks.
//
// Everything here exists only when the build found Google Highway
// (FLASHTILE_WITH_HWY=1); without it cpu_flash is registered but unavailable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "api/params.hpp"

namespace flashtile::detail::cpu_flash {

// Head dims the backend serves: any up to 256 (the register tiles walk the head dim in
// whole vectors over zero-padded scratch, and the output's tail channels are scalar).
inline constexpr int64_t kMaxHeadDim = 256;

// Block sizes and scratch of the SIMD target this CPU runs (see Tiles in flash_kernels-inl.hpp).
struct Geometry {
  int64_t block_m;            // query rows per task
  int64_t block_n;            // keys per step of the online softmax
  int64_t lanes;              // floats per vector
  int64_t scratch_floats;     // per-thread scratch for this head dim, in floats, cache aside
  int64_t cache_slot_floats;  // one packed K/V block of the cache below (a multiple of 16)
  const char* target;         // Highway's name for the target, e.g. "AVX3", "AVX2", "NEON"
};
Geometry geometry(int64_t head_dim);

// The packed K/V block cache. Under a sliding window, neighbouring query blocks of one head
// see nearly the same keys (1024 of 1216 at window 1024); a thread that runs them one after
// the other keeps each packed K/V block in slot `block % slots` of its scratch and packs
// only the blocks it does not hold. A slot is tagged with the block it holds; packing is
// deterministic, so a hit gives bitwise what a repack would.
struct CacheTag {
  int64_t batch = -1, kv_head = -1, block = -1;
};
struct KvCache {
  int64_t slots = 0;  // 0: no cache, every block is packed into the task's own buffers
  CacheTag* tags = nullptr;
  float* blocks = nullptr;  // (slots, cache_slot_floats)
};
// Where the cache lies in a thread's scratch (after the task's own buffers), and the size of
// a scratch holding `slots` slots.
inline int64_t cache_tag_floats(int64_t slots) {
  return (slots * int64_t(sizeof(CacheTag) / sizeof(float)) + 15) / 16 * 16;
}
inline int64_t scratch_floats(const Geometry& g, int64_t slots) {
  return g.scratch_floats + (slots > 0 ? cache_tag_floats(slots) + slots * g.cache_slot_floats : 0);
}
inline KvCache kv_cache(float* scratch, const Geometry& g, int64_t slots) {
  if (slots == 0) return {};
  float* tags = scratch + g.scratch_floats;
  return {slots, reinterpret_cast<CacheTag*>(tags), tags + cache_tag_floats(slots)};
}

// Which keys of its query block a task folds, and where its result goes: the whole tile
// into out and lse, or, under split-KV (attn/split_kv.hpp), split `split` of `splits` into a
// partial output (fp32, normalised by the split's own denominator) and its LSE, which the
// backend's combine pass merges.
struct TaskSplit {
  int split = 0, splits = 1;
  float* partial_out = nullptr;  // (block_m, head_dim); nullptr: the whole tile, into out
  float* partial_lse = nullptr;  // (block_m)
};

// One task: query block `qb` of head `h` of sequence (batch entry) `b`. `scratch` holds
// scratch_floats(geometry(head_dim), cache.slots) floats, 64-byte aligned, and `cache` lies
// inside it (kv_cache).
using QueryBlockFn = void (*)(const AttentionParams& p, int64_t b, int64_t h, int64_t qb,
                              float* scratch, const KvCache& cache, const TaskSplit& split);
QueryBlockFn query_block_kernel();

// ---- hooks for tests and micro-benchmarks ---------------------------------------------
// Highway targets compiled into this build that this CPU supports, best first.
std::vector<std::string> available_targets();
// Makes every later call use target `name` (one of available_targets()); "" restores the
// best one. Returns false (and changes nothing) for an unknown name. Not thread-safe.
bool force_target(const std::string& name);
// y[i] = the kernels' vectorised exp(x[i]).
void vector_exp(const float* x, float* y, size_t n);
// y[i] = the kernels' vectorised tanh(x[i]) (the softcap's).
void vector_tanh(const float* x, float* y, size_t n);
// The kernels' lane-wise online-softmax step over a block of scores laid out as
// scores[j * rows + r] (key j, query row r; rows a multiple of `lanes`):
// rescales m[r], l[r] (returning alpha[r]) and turns scores into probabilities in place.
void online_softmax_lanes(float* scores, int64_t keys, int64_t rows, float* m, float* l,
                          float* alpha);

}  // namespace flashtile::detail::cpu_flash
