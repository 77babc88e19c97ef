// An instrument for "where a CTA's time goes" (issue 9; docs/JOURNEY.md, "4.13"): clock
// stamps of every work item of the warp-specialised forward kernels (4.3-4.7), per consumer
// warpgroup. Compiled in only by a build configured with -DFLASHTILE_SM90_TIMELINE=ON (a
// build of its own: the stamps' stores change the kernels a little); in every other build
// timeline_mark is empty and the kernels are instruction for instruction the plain ones.
//
// At run time, FLASHTILE_SM90_TIMELINE=FILE makes each forward call of such a build
// synchronise after its launch and write its records to FILE (each call overwrites the
// previous one's, so a `flashtile bench` run leaves its last timed call);
// bench/sm90_timeline.py reads them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda/common.cuh"

#ifndef FLASHTILE_SM90_TIMELINE
#define FLASHTILE_SM90_TIMELINE 0
#endif

namespace flashtile::detail::sm90 {

// The stamps of one work item of one consumer warpgroup, in its SM's clock (clock64).
enum TimelineMark : int {
  kItemStart,     // the item begins: kernel entry (one-block kernels), the item loop's top (4.6)
  kQLanded,       // its Q tile has landed (the wait on Q's full barrier returned)
  kTilesDone,     // its last P·V has landed
  kEpilogueDone,  // O and the LSE are written (4.6: and its Q buffer released)
  kTimelineMarks
};
struct TimelineRecord {
  uint32_t smid, cta, item, tiles;  // tiles: the item's key tiles
  uint64_t global_ns;               // %globaltimer at kItemStart: lines the SMs up
  uint64_t clock[kTimelineMarks];
};
static_assert(sizeof(TimelineRecord) == 56, "bench/sm90_timeline.py reads 56-byte records");

// The file's header (then `records` TimelineRecords; a slot no item used is all zero).
struct TimelineHeader {
  char magic[8];  // "FTSM90T1"
  uint32_t head_dim, block_m, block_n, warpgroups, pipeline, records;
  uint32_t batch, heads, seqlen_q, seqlen_k, causal, reserved;
};
static_assert(sizeof(TimelineHeader) == 56, "bench/sm90_timeline.py reads a 56-byte header");

#if FLASHTILE_SM90_TIMELINE
// This translation unit's buffer (no relocatable device code: every TU has its own copy,
// set by the same TU's launch code through TimelineSession::arm).
static __device__ TimelineRecord* g_timeline_records;
static __device__ uint32_t g_timeline_slots;
#endif

// The linear index of this CTA (one-block kernels: its work item).
__device__ __forceinline__ uint32_t linear_cta() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}

// Stamp `mark` of work item `item` of consumer warpgroup `consumer` (slot item · consumers +
// consumer; consumer < 0 is the producer, which records nothing): the warpgroup's first thread
// stores clock64 as it passes. Stateless, so that no register is held across the tile loop;
// kItemStart also stores the SM, CTA, item and %globaltimer, kTilesDone the item's `tiles`.
__device__ __forceinline__ void timeline_mark(TimelineMark mark, uint32_t item, int consumer,
                                              int consumers, int tiles = 0) {
#if FLASHTILE_SM90_TIMELINE
  TimelineRecord* const records = g_timeline_records;
  if (consumer < 0 || threadIdx.x % 128 != 0 || records == nullptr) return;
  const uint32_t slot = item * static_cast<uint32_t>(consumers) + static_cast<uint32_t>(consumer);
  if (slot >= g_timeline_slots) return;
  TimelineRecord& record = records[slot];
  if (mark == kItemStart) {
    uint32_t smid;
    uint64_t now;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    record.smid = smid;
    record.cta = linear_cta();
    record.item = item;
    record.global_ns = now;
  }
  if (mark == kTilesDone) record.tiles = static_cast<uint32_t>(tiles);
  record.clock[mark] = clock64();
#else
  (void)mark, (void)item, (void)consumer, (void)consumers, (void)tiles;
#endif
}

#if FLASHTILE_SM90_TIMELINE
// One forward call's records: armed before the launch when FLASHTILE_SM90_TIMELINE names a
// file, written there after it. In an unnamed namespace on purpose: each TU's copy must set
// and read that TU's own g_timeline_* symbols (one merged inline copy would not).
namespace {
class TimelineSession {
 public:
  static TimelineSession arm(int64_t slots, cudaStream_t stream) {
    TimelineSession s;
    const char* path = std::getenv("FLASHTILE_SM90_TIMELINE");
    if (path == nullptr || *path == '\0' || slots <= 0 || slots > (int64_t(1) << 26)) return s;
    s.path_ = path;
    s.slots_ = slots;
    s.stream_ = stream;
    check_cuda(cudaMalloc(&s.records_, size_t(slots) * sizeof(TimelineRecord)), "timeline cudaMalloc");
    check_cuda(cudaMemsetAsync(s.records_, 0, size_t(slots) * sizeof(TimelineRecord), stream),
               "timeline cudaMemsetAsync");
    const uint32_t n = static_cast<uint32_t>(slots);
    check_cuda(cudaMemcpyToSymbolAsync(g_timeline_records, &s.records_, sizeof(s.records_), 0,
                                       cudaMemcpyHostToDevice, stream),
               "timeline records symbol");
    check_cuda(cudaMemcpyToSymbolAsync(g_timeline_slots, &n, sizeof(n), 0,
                                       cudaMemcpyHostToDevice, stream),
               "timeline slots symbol");
    return s;
  }
  TimelineSession(TimelineSession&& o) noexcept { *this = static_cast<TimelineSession&&>(o); }
  TimelineSession& operator=(TimelineSession&& o) noexcept {
    path_ = o.path_, slots_ = o.slots_, stream_ = o.stream_, records_ = o.records_;
    o.records_ = nullptr;
    return *this;
  }
  ~TimelineSession() {
    if (records_ != nullptr) cudaFree(records_);
  }
  // After the launch: waits for it, writes header + records to the file.
  void write(TimelineHeader header) {
    if (records_ == nullptr) return;
    TimelineRecord* null = nullptr;
    check_cuda(cudaMemcpyToSymbolAsync(g_timeline_records, &null, sizeof(null), 0,
                                       cudaMemcpyHostToDevice, stream_),
               "timeline records symbol");
    std::string bytes(size_t(slots_) * sizeof(TimelineRecord), '\0');
    check_cuda(cudaMemcpyAsync(bytes.data(), records_, bytes.size(), cudaMemcpyDeviceToHost, stream_),
               "timeline copy");
    check_cuda(cudaStreamSynchronize(stream_), "timeline synchronise");
    header.records = static_cast<uint32_t>(slots_);
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    if (f == nullptr) throw Error(ErrorKind::runtime, "cannot write FLASHTILE_SM90_TIMELINE file " + path_);
    const bool ok = std::fwrite(&header, sizeof(header), 1, f) == 1 &&
                    std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    if (std::fclose(f) != 0 || !ok)
      throw Error(ErrorKind::runtime, "cannot write FLASHTILE_SM90_TIMELINE file " + path_);
  }

 private:
  TimelineSession() = default;
  std::string path_;
  int64_t slots_ = 0;
  cudaStream_t stream_ = nullptr;
  TimelineRecord* records_ = nullptr;
};
}  // namespace
#endif

}  // namespace flashtile::detail::sm90
