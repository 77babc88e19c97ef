// Step 4.6's scheduling arithmetic, host-testable (tests/cpu/test_sm90_tile_schedule.cpp):
// which (batch, head, query block) a persistent CTA computes next, and where a count of
// tiles or items kept over the CTA's lifetime puts it in an mbarrier ring.
//
// The persistent kernel launches one CTA per resident slot (SMs x CTAs per SM) and each
// CTA takes one item of each round of G (= the grid) consecutive items of one list ordered
// heaviest first: a static schedule, not a global atomic counter. Every thread of the CTA
// (the producer and both consumers) computes the same sequence on its own, so no item has
// to be fetched, broadcast through shared memory and fenced, and no counter has to be reset
// before each call (no workspace); runs are deterministic. The cost: a CTA cannot take
// over work another one has not started. The rounds snake: CTA x takes the x-th item of
// even rounds and the (G-1-x)-th of odd ones. With a plain stride (x, x + G, ...) over a
// list sorted heaviest first, CTA 0 would take the heaviest item of every round (causal
// d=128 16k, 16 heads: ~12% more tiles than CTA 131); snaking, each pair of rounds evens
// out, leaving about one round's spread of weights.
#pragma once

#include <cstdint>
#include <climits>

#include "attn/block_range.hpp"
#include "common/host_device.hpp"

namespace flashtile::detail::sm90 {

// One CTA's unit of work: query block `m_block` (rows m_block * block_m ...) of one
// (batch entry, query head).
struct WorkItem {
  int batch, head, m_block;
};

// The dense call's work items in the order CTAs take them. With a mask (causal, window) the
// blocks differ in weight: the list runs over ranks of heaviest_first_block (the heaviest
// query block of every (batch, head) first, then the second heaviest, ...), heads fastest
// within a rank. Without one every item weighs the same, so the list keeps each (batch,
// head)'s blocks together (what the non-persistent grid does): CTAs running at the same
// time then read the same K/V from L2.
// Indices are 32-bit (the kernel's divisions then stay inline: a 64-bit one is a call, and
// its saved registers spilled the d=256 consumers); the launch checks fits_int32().
struct TileSchedule {
  int batch = 0, heads = 0, m_blocks = 0;
  int64_t window_left = -1, window_right = -1;

  FT_HOST_DEVICE int64_t items_64() const { return int64_t(batch) * heads * m_blocks; }
  // Every index the kernel forms, up to rounds x grid <= items + grid, fits an int.
  FT_HOST_DEVICE bool fits_int32(int grid) const {
    return items_64() + grid <= int64_t(INT_MAX);
  }
  FT_HOST_DEVICE int items() const { return batch * heads * m_blocks; }
  FT_HOST_DEVICE bool masked() const { return window_left >= 0 || window_right >= 0; }

  FT_HOST_DEVICE WorkItem item(int index) const {
    const int heads_total = batch * heads;
    WorkItem w{};
    if (masked()) {
      const int rank = index / heads_total, bh = index % heads_total;
      w.batch = bh / heads;
      w.head = bh % heads;
      w.m_block = heaviest_first_block(window_left, window_right, rank, m_blocks);
    } else {
      const int bh = index / m_blocks;
      w.batch = bh / heads;
      w.head = bh % heads;
      w.m_block = index % m_blocks;
    }
    return w;
  }

  // Rounds of `grid` items; the last may be partial.
  FT_HOST_DEVICE int rounds(int grid) const { return (items() + grid - 1) / grid; }
  // The item CTA `cta` of `grid` takes in round `round`; in the last round it may lie past
  // items() (the CTA then has no item left).
  FT_HOST_DEVICE static int item_index(int cta, int grid, int round) {
    return round * grid + (round % 2 == 0 ? cta : grid - 1 - cta);
  }
};

// The non-persistent grid's order under a mask (steps 4.3-4.5 where the head dim's traits
// take it, Sm90Traits::kGroupedMaskedGrid: d=128 and 256; JOURNEY 4.9). CTAs start roughly
// in the order of their linear block index. The plain grid (x fastest: each (batch, head)'s
// query blocks heaviest first, then the next head's) starts the last heads' heaviest blocks
// in the last wave, so at causal 4k the tail runs them alone (a greedy model of 132 SMs: 6%
// over the balanced time at d=128, 12% at d=256). Here the (batch, head) pairs go in groups
// of `heads_per_group`, and each group's items are listed by rank of heaviest_first_block,
// heads fastest within a rank: a group holds about one wave (heads_per_launch_group), so the
// CTAs running at once span about as many heads as in the plain grid (the same K/V in L2)
// while the last group runs heaviest first. One head per group is the plain grid. `index` is
// the CTA's linear block index, m_blocks the grid's x.
FT_HOST_DEVICE WorkItem grouped_heaviest_first_item(int index, int heads, int heads_total,
                                                    int m_blocks, int heads_per_group,
                                                    int64_t window_left, int64_t window_right) {
  const int group_items = heads_per_group * m_blocks;
  const int group = index / group_items, first_head = group * heads_per_group;
  const int in_group = index - group * group_items;
  const int width = heads_total - first_head < heads_per_group ? heads_total - first_head
                                                               : heads_per_group;
  const int rank = in_group / width, bh = first_head + in_group % width;
  return WorkItem{bh / heads, bh % heads,
                  heaviest_first_block(window_left, window_right, rank, m_blocks)};
}

// Heads per group for grouped_heaviest_first_item: as many as one wave of `resident_ctas`
// covers whole, at least one (so a head with at least a wave of query blocks keeps the plain
// grid's order: causal 16k at every head dim).
FT_HOST_DEVICE int heads_per_launch_group(int64_t resident_ctas, int m_blocks) {
  const int64_t heads = m_blocks > 0 ? resident_ctas / m_blocks : 1;
  return heads < 1 ? 1 : heads > INT_MAX ? INT_MAX : static_cast<int>(heads);
}

// Where the count-th use (0-based, counted over the CTA's lifetime, not per item) of a
// ring of kSlots buffers lands: slot count % kSlots, on lap count / kSlots of the ring. The
// consumer waits for lap r's "full" phase of the slot's barrier (parity r % 2); the
// producer, before refilling the slot for lap r >= 1, waits for the "empty" phase the
// consumers completed when they released lap r - 1 (parity (r - 1) % 2). A parity tells
// apart a barrier's current and previous phase only; that suffices because neither side
// gets a whole lap ahead of the other (each waits for the other's phase before moving on).
template <int kSlots>
struct RingSlot {
  static_assert(kSlots >= 1, "a ring has at least one slot");
  uint32_t count;

  FT_HOST_DEVICE int slot() const { return static_cast<int>(count % kSlots); }
  FT_HOST_DEVICE uint32_t lap() const { return count / kSlots; }
  // Parity of the "full" phase this use's data completes when it lands.
  FT_HOST_DEVICE uint32_t full_parity() const { return lap() % 2; }
  // Whether the slot held an earlier lap that must be released before it is refilled.
  FT_HOST_DEVICE bool reused() const { return lap() > 0; }
  // Parity of the "empty" phase the release of the previous lap completed (reused only).
  FT_HOST_DEVICE uint32_t released_parity() const { return (lap() + 1) % 2; }
};

// How many of an item's key tiles the producer issues before the item's Q. With a second Q
// buffer none: Q goes first, into the buffer the consumers are not using. With one, the
// first min(n_tiles, kStages) tiles: their stages were released by the previous item's
// tiles, so they land during its epilogue, and then Q, once the consumers release the
// buffer after that epilogue. Issuing more first would deadlock: tile kStages waits for the
// release of tile 0, which waits for this Q.
template <int kStages, int kQBuffers>
FT_HOST_DEVICE int tiles_before_q(int n_tiles) {
  static_assert(kQBuffers == 1 || kQBuffers == 2, "Q is single or double buffered");
  if (kQBuffers > 1) return 0;
  return n_tiles < kStages ? n_tiles : kStages;
}

}  // namespace flashtile::detail::sm90
