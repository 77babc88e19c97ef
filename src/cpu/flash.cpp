// cpu_flash: tiled online-softmax attention on the CPU, the default backend wherever no
// CUDA device is present.
//
// What changed from cpu_standard: no N×N matrix. Each task takes one block of 192 query
// rows of one (sequence, head) and walks the keys in blocks of 64 (48 on 16-register SIMD),
// folding each block of scores through the online softmax, as FlashAttention does on the
// GPU. Q·Kᵀ and P·V are register-blocked SIMD micro-kernels, exp is vectorised, and f16/bf16
// are converted to f32 on load (f32 accumulation, output in the input dtype). Highway picks
// the widest SIMD the CPU has at run time; OpenMP spreads the tasks over the cores.
// The kernels are in flash_kernels-inl.hpp; this file holds the backend entry, the schedule
// and the threads.
//
// Every variant of issue 8 runs here, through the shared core (src/attn/): causal and
// sliding windows visit only the key blocks a task sees (time proportional to the window),
// softcap, ALiBi and sinks, packed varlen batches, any head_dim up to 256. A call with
// fewer tiles than threads splits its keys (split-KV, attn/split_kv.hpp) and combines the
// partials.
//
// Measured (one thread, AVX-512, B=1 H=8 fp32, on the 2-core dev VM whose FMA loop peaks at
// 240 GFLOP/s): N=4096 d=64 ~150 GFLOP/s non-causal, ~140 causal (the same as before the
// variants); window (1024, 0) at N=16384 d=128 8.3x faster than causal with the packed K/V
// cache (7.8x without; the pairs it skips: 8.25x); softcap +7-13%, ALiBi +5%. The steps are
// in docs/JOURNEY.md (cpu_flash).
#include <omp.h>

#include <algorithm>
#include <string>
#include <vector>

#include "api/backend.hpp"
#include "attn/block_range.hpp"
#include "attn/seqlen.hpp"
#include "attn/split_kv.hpp"
#include "attn/variant.hpp"
#include "common/numeric.hpp"
#include "cpu/flash.hpp"
#include "cpu/flash_backward.hpp"

#if FLASHTILE_WITH_HWY
#include "hwy/aligned_allocator.h"
#endif

namespace flashtile::detail {
namespace {

std::string flash_unavailable() {
#if FLASHTILE_WITH_HWY
  return "";
#else
  return "built with FLASHTILE_CPU_SIMD=OFF (no Google Highway: install libhwy-dev and "
         "reconfigure with it ON)";
#endif
}

std::string flash_unsupported(const AttentionParams& p) {
  if (p.head_dim > cpu_flash::kMaxHeadDim)
    return "head_dim must be at most " + std::to_string(cpu_flash::kMaxHeadDim) + ", got " +
           std::to_string(p.head_dim);
  return "";
}

#if FLASHTILE_WITH_HWY

// One query block of one sequence, and its weight: the key blocks it visits.
struct QueryBlockTask {
  int64_t batch, block, key_blocks;
};

int64_t query_blocks(const SeqlenInfo<int64_t>& seq, const cpu_flash::Geometry& g) {
  return (seq.seqlen_q + g.block_m - 1) / g.block_m;
}

// Query blocks of every sequence (every batch entry when dense).
int64_t task_count(const AttentionParams& p, const cpu_flash::Geometry& g) {
  int64_t count = 0;
  for (int64_t b = 0; b < p.batch; ++b) count += query_blocks(SeqlenInfo<int64_t>(p, b), g);
  return count;
}

// The query blocks of every sequence, heaviest first: under a causal mask the last blocks
// of a sequence see the most keys, in a varlen batch the longest sequences do, and they are
// handed out first so that the light ones fill the gaps at the end (longest-processing-time
// order). Ties keep sequence and block order, so neighbouring tasks share K/V.
std::vector<QueryBlockTask> schedule(const AttentionParams& p, const cpu_flash::Geometry& g) {
  std::vector<QueryBlockTask> tasks;
  tasks.reserve(static_cast<size_t>(task_count(p, g)));
  for (int64_t b = 0; b < p.batch; ++b) {
    const SeqlenInfo<int64_t> seq(p, b);
    const Mask<int64_t> mask = seq.mask(p);
    for (int64_t qb = 0; qb < query_blocks(seq, g); ++qb) {
      const int64_t i0 = qb * g.block_m, i1 = std::min(i0 + g.block_m, seq.seqlen_q);
      tasks.push_back({b, qb, key_blocks(mask, i0, i1, g.block_n).count()});
    }
  }
  std::sort(tasks.begin(), tasks.end(), [](const QueryBlockTask& x, const QueryBlockTask& y) {
    if (x.key_blocks != y.key_blocks) return x.key_blocks > y.key_blocks;
    return x.batch != y.batch ? x.batch < y.batch : x.block < y.block;
  });
  return tasks;
}

// Slots of the packed K/V cache (flash.hpp) for this call: under a window bounded on both
// sides (causal bounds the right), enough for the blocks one task sees plus those the next
// task moves on by, when that stays small; otherwise none (a task's blocks would not be
// seen again before they are evicted).
int64_t cache_slots(const AttentionParams& p, const cpu_flash::Geometry& g) {
  constexpr int64_t kMaxSlots = 32;  // 2 MiB per thread at d=128 (AVX-512)
  if (p.window_left < 0 || p.window_right < 0) return 0;
  const int64_t span = p.window_left + g.block_m + p.window_right;  // keys one task sees
  if (span > kMaxSlots * g.block_n) return 0;
  const int64_t seen = (span + g.block_n - 1) / g.block_n + 1;
  const int64_t step = (g.block_m + g.block_n - 1) / g.block_n + 1;
  return seen + step <= kMaxSlots ? seen + step : 0;
}

// Split-KV (attn/split_kv.hpp) for calls with fewer tiles (query blocks × heads) than
// threads, such as the write-up's one head of 1024 rows (6 tiles) on a 16-core host: each
// split re-packs Q and writes a partial, which costs ~10% on one thread, so calls that
// already fill the threads are not split. The split count, and with it the summation
// order, then depends on the thread count for those calls only (every other call is
// bitwise the same for any thread count). At least 4 key blocks (256 keys) per split.
int split_count(const AttentionParams& p, const std::vector<QueryBlockTask>& tasks) {
  const int64_t tiles = int64_t(tasks.size()) * p.heads_q, threads = omp_get_max_threads();
  if (tiles >= threads) return 1;
  int64_t most = 0;
  for (const QueryBlockTask& t : tasks) most = std::max(most, t.key_blocks);
  return choose_splits(tiles, most, threads, /*min_blocks_per_split=*/4, /*max_splits=*/16);
}

// Where the split partials live: per (head, tile) the outputs (splits, block_m, head_dim),
// then the LSEs (splits, block_m), fp32; a tile is head · tiles + its index in the schedule.
struct SplitPartials {
  float* base;
  int splits;
  int64_t block_m, head_dim;

  int64_t tile_floats() const { return splits * block_m * (head_dim + 1); }
  float* out(int64_t tile, int split) const {
    return base + tile * tile_floats() + split * block_m * head_dim;
  }
  float* lse(int64_t tile, int split) const {
    return base + tile * tile_floats() + splits * block_m * head_dim + split * block_m;
  }
};

// Floats of every (head, tile)'s partials when split, 0 when not.
int64_t partial_floats(const AttentionParams& p, const cpu_flash::Geometry& g, int64_t tiles,
                       int splits) {
  if (splits <= 1) return 0;
  return p.heads_q * tiles * SplitPartials{nullptr, splits, g.block_m, p.head_dim}.tile_floats();
}

// One scratch per thread that has work; no more threads than tasks.
int thread_count(int64_t tasks) {
  return static_cast<int>(std::min<int64_t>(omp_get_max_threads(), tasks));
}

// The per-thread scratch, the schedule and the split partials.
int64_t flash_workspace_bytes(const AttentionParams& p) {
  const cpu_flash::Geometry g = cpu_flash::geometry(p.head_dim);
  const std::vector<QueryBlockTask> tasks = schedule(p, g);
  const int splits = split_count(p, tasks);
  const int64_t count = int64_t(tasks.size());
  return (thread_count(count * splits * p.heads_q) * cpu_flash::scratch_floats(g, cache_slots(p, g)) +
          partial_floats(p, g, count, splits)) *
             int64_t(sizeof(float)) +
         count * int64_t(sizeof(QueryBlockTask));
}

// Merges the split partials of every row of every (head, tile) into out and lse, in the
// input dtype, through combine_partials (the NaN rule and the sink included).
void combine_splits(const AttentionParams& p, const cpu_flash::Geometry& g,
                    const std::vector<QueryBlockTask>& tasks, const SplitPartials& partials) {
  const int64_t count = int64_t(tasks.size()), d = p.head_dim;
  const int splits = partials.splits;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < count * p.heads_q; ++t) {
    const QueryBlockTask& task = tasks[t % count];
    const int64_t h = t / count;
    const SeqlenInfo<int64_t> seq(p, task.batch);
    const Mask<int64_t> mask = seq.mask(p);
    const float sink = sink_logit<float>(p, h);
    const int64_t i0 = task.block * g.block_m, rows = std::min(g.block_m, seq.seqlen_q - i0);
    std::vector<float> lse(splits), weight(splits);
    for (int64_t r = 0; r < rows; ++r) {
      for (int s = 0; s < splits; ++s) lse[s] = partials.lse(t, s)[r];
      const float row_lse = combine_partials(lse.data(), splits, sink,
                                             mask.visible_keys(i0 + r) > 0, weight.data());
      const int64_t dst = seq.o_offset(p, task.batch, i0 + r, h);
      for (int64_t c = 0; c < d; ++c) {
        float x = 0;
        for (int s = 0; s < splits; ++s) x += weight[s] * partials.out(t, s)[r * d + c];
        store_from_float(p.o, p.dtype, dst + c, x);
      }
      if (p.lse != nullptr) p.lse[seq.lse_index(p, task.batch, h, i0 + r)] = row_lse;
    }
  }
}

void run_flash(const AttentionParams& p) {
  const cpu_flash::Geometry g = cpu_flash::geometry(p.head_dim);
  const cpu_flash::QueryBlockFn kernel = cpu_flash::query_block_kernel();
  const std::vector<QueryBlockTask> tasks = schedule(p, g);
  const int splits = split_count(p, tasks);
  const int64_t count = int64_t(tasks.size()), total = count * splits * p.heads_q;
  const int threads = thread_count(total);
  if (threads == 0) return;  // no query rows at all
  const int64_t slots = cache_slots(p, g), per_thread = cpu_flash::scratch_floats(g, slots);
  auto scratch = hwy::AllocateAligned<float>(
      static_cast<size_t>(threads * per_thread + partial_floats(p, g, count, splits)));
  if (!scratch) throw Error(ErrorKind::runtime, "cpu_flash: out of memory for its scratch");
  const SplitPartials partials{scratch.get() + threads * per_thread, splits, g.block_m, p.head_dim};
  // With the cache, a thread takes a few neighbouring query blocks at a time, so that most
  // of their K/V blocks are packed once.
  const int chunk = slots > 0 ? 4 : 1;
#pragma omp parallel num_threads(threads)
  {
    float* mine = scratch.get() + omp_get_thread_num() * per_thread;
    const cpu_flash::KvCache cache = cpu_flash::kv_cache(mine, g, slots);
    std::fill(cache.tags, cache.tags + slots, cpu_flash::CacheTag{});
    // Head by head, each in the schedule's order: consecutive tasks then read the same
    // head's K/V, still in cache (the heads inside each query block instead measured 5-7%
    // slower, causal N=16384 d=64, one thread, interleaved runs). Each task's arithmetic
    // does not depend on which thread runs it, so the output is bitwise the same for any
    // thread count (unless split_count splits the keys, see there).
#pragma omp for schedule(dynamic, chunk)
    for (int64_t t = 0; t < total; ++t) {
      // Task t: split t % splits of tile (t / splits) % count of head t / (splits·count).
      const int64_t tile = t / splits, h = tile / count;
      const QueryBlockTask& task = tasks[tile % count];
      cpu_flash::TaskSplit split;
      if (splits > 1) {
        split.split = static_cast<int>(t % splits);
        split.splits = splits;
        split.partial_out = partials.out(tile, split.split);
        split.partial_lse = partials.lse(tile, split.split);
      }
      kernel(p, task.batch, h, task.block, mine, cache, split);
    }
  }
  if (splits > 1) combine_splits(p, g, tasks, partials);
}

#else

int64_t flash_workspace_bytes(const AttentionParams&) { return 0; }
void run_flash(const AttentionParams&) {
  throw Error(ErrorKind::unsupported, "cpu_flash: " + flash_unavailable());
}

#endif

}  // namespace

BackendEntry make_cpu_flash_backend() {
  // Above cpu_standard (1): `automatic` takes cpu_flash for every CPU call it supports.
  return {Backend::cpu_flash, DeviceType::cpu, /*priority=*/5, flash_unavailable,
          flash_unsupported, flash_workspace_bytes, run_flash,
          cpu_flash_backward::workspace_bytes, cpu_flash_backward::run};
}

}  // namespace flashtile::detail
