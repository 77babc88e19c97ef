// cuda_sm90 step 4.6's scheduling arithmetic on the host (src/cuda/04_sm90/tile_schedule.hpp):
// the persistent CTAs' item sequences cover every (batch, head, query block) exactly once,
// heaviest first under a causal mask, with balanced totals; and the ring counts kept over a
// CTA's lifetime (tiles across items, Q buffers across items) drive a model of the kernel's
// mbarrier protocol without a deadlock, a stale read or an overwrite of unread data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attn/block_range.hpp"
#include "attn/mask.hpp"
#include "cuda/04_sm90/tile_schedule.hpp"

namespace flashtile::detail::sm90 {
namespace {

constexpr int kBlockM = 128, kBlockN = 128;  // cuda_sm90's tiles at d=64 and 128

struct MaskCase {
  int64_t left, right;
  const char* name;
};
constexpr MaskCase kMasks[] = {
    {-1, -1, "full"}, {-1, 0, "causal"}, {300, 0, "causal window"}, {40, -1, "left only"},
    {-1, 3, "right only"}, {5, 7, "both sides"}};

// Key tiles query block m visits: the weight the heaviest-first order sorts by.
int item_tiles(const MaskCase& mask, int sq, int sk, int m_block) {
  const Mask<int> m(mask.left, mask.right, sq, sk);
  const int row0 = m_block * kBlockM;
  return key_blocks(m, row0, std::min(row0 + kBlockM, sq), kBlockN).count();
}

std::string describe(const TileSchedule& s, int sq, int sk, int grid, const char* mask) {
  return std::string(mask) + " batch " + std::to_string(s.batch) + " heads " +
         std::to_string(s.heads) + " sq " + std::to_string(sq) + " sk " + std::to_string(sk) +
         " grid " + std::to_string(grid);
}

// Every CTA of every grid size walks its stride; together they name each item once.
TEST(Sm90TileSchedule, PersistentCtasCoverEveryItemOnce) {
  for (const MaskCase& mask : kMasks)
    for (int batch : {1, 2, 3})
      for (int heads : {1, 2, 5, 16})
        for (int sq : {1, 100, 128, 129, 1000, 4096})
          for (int sk : {1, 129, 1000, 4096})
            for (int grid : {1, 2, 7, 64, 132, 264, 5000}) {
              const TileSchedule s{batch, heads, (sq + kBlockM - 1) / kBlockM, mask.left, mask.right};
              SCOPED_TRACE(describe(s, sq, sk, grid, mask.name));
              ASSERT_TRUE(s.fits_int32(grid));
              std::vector<int> seen(size_t(s.items()), 0);
              for (int cta = 0; cta < grid; ++cta)
                for (int round = 0; round < s.rounds(grid); ++round) {
                  const int index = TileSchedule::item_index(cta, grid, round);
                  ASSERT_GE(index, 0);
                  if (index >= s.items()) {
                    ASSERT_EQ(round, s.rounds(grid) - 1) << "only the last round is partial";
                    continue;
                  }
                  const WorkItem w = s.item(index);
                  ASSERT_TRUE(w.batch >= 0 && w.batch < batch && w.head >= 0 && w.head < heads &&
                              w.m_block >= 0 && w.m_block < s.m_blocks)
                      << "item " << index << " -> (" << w.batch << ", " << w.head << ", "
                      << w.m_block << ")";
                  ++seen[(size_t(w.batch) * heads + w.head) * s.m_blocks + w.m_block];
                }
              for (size_t i = 0; i < seen.size(); ++i)
                ASSERT_EQ(seen[i], 1) << "item (b·h, m) = (" << i / s.m_blocks << ", "
                                      << i % s.m_blocks << ")";
            }
}

// Causal and one-sided windows: the list never gets heavier, and the snaking rounds balance
// the CTAs' totals: within two rounds' spread of weights, plus the last round's heaviest
// item when that round is partial (a plain stride x, x + G, ... fails this on the causal
// cases). Full attention: each (batch, head)'s blocks stay
// together (and weigh the same).
TEST(Sm90TileSchedule, HeaviestFirstAndBalanced) {
  for (const MaskCase& mask : kMasks)
    for (int heads : {1, 3, 16})
      for (int sq : {129, 1000, 4096, 16384})
        for (int sk : {sq, sq / 2 + 1, 2 * sq})
          for (int grid : {7, 132}) {
            const TileSchedule s{2, heads, (sq + kBlockM - 1) / kBlockM, mask.left, mask.right};
            SCOPED_TRACE(describe(s, sq, sk, grid, mask.name));
            const bool sorted = mask.right == 0 || (mask.left >= 0 && mask.right < 0) ||
                                (mask.left < 0 && mask.right < 0);
            int heaviest = 0;
            for (int i = 0; i < s.items(); ++i) {
              const WorkItem w = s.item(i);
              const int tiles = item_tiles(mask, sq, sk, w.m_block);
              heaviest = std::max(heaviest, tiles);
              if (i == 0) continue;
              const WorkItem prev = s.item(i - 1);
              if (sorted)
                ASSERT_LE(tiles, item_tiles(mask, sq, sk, prev.m_block)) << "item " << i;
              if (!s.masked() && w.m_block != 0)
                ASSERT_TRUE(w.batch == prev.batch && w.head == prev.head &&
                            w.m_block == prev.m_block + 1)
                    << "item " << i;
            }
            if (!sorted) continue;
            std::vector<int64_t> total(size_t(grid), 0);
            int64_t widest_round = 0;  // the largest spread of weights inside one round
            int64_t partial_round = 0;  // the heaviest item of a partial last round: some CTAs
                                        // have none
            for (int round = 0; round < s.rounds(grid); ++round) {
              int lightest = heaviest, heaviest_here = 0;
              for (int cta = 0; cta < grid; ++cta) {
                const int index = TileSchedule::item_index(cta, grid, round);
                if (index >= s.items()) continue;
                const int tiles = item_tiles(mask, sq, sk, s.item(index).m_block);
                total[size_t(cta)] += tiles;
                lightest = std::min(lightest, tiles), heaviest_here = std::max(heaviest_here, tiles);
              }
              widest_round = std::max<int64_t>(widest_round, heaviest_here - lightest);
              if (round == s.rounds(grid) - 1 && s.items() % grid != 0) partial_round = heaviest_here;
            }
            const auto [lo, hi] = std::minmax_element(total.begin(), total.end());
            EXPECT_LE(*hi - *lo, 2 * widest_round + partial_round)
                << "spread " << *hi - *lo << ", widest round " << widest_round
                << ", partial last round's heaviest " << partial_round;
          }
}

// The non-persistent grid's grouped order (grouped_heaviest_first_item): every block index
// names one item, inside the grid; each group's items are its heads' and come heaviest first;
// one head per group is the plain grid (x fastest, heaviest_first_block of x).
TEST(Sm90TileSchedule, GroupedGridOrderCoversEveryItemHeaviestFirstPerGroup) {
  for (const MaskCase& mask : kMasks)
    for (int batch : {1, 3})
      for (int heads : {1, 5, 16})
        for (int sq : {1, 129, 1100, 4096})
          for (int group : {1, 2, 3, 4, 7, 64}) {
            const int m_blocks = (sq + kBlockM - 1) / kBlockM, heads_total = batch * heads;
            const int sk = sq;
            SCOPED_TRACE(std::string(mask.name) + " batch " + std::to_string(batch) + " heads " +
                         std::to_string(heads) + " sq " + std::to_string(sq) + " group " +
                         std::to_string(group));
            const bool sorted = mask.right == 0 || (mask.left >= 0 && mask.right < 0) ||
                                (mask.left < 0 && mask.right < 0);
            std::vector<int> seen(size_t(heads_total) * m_blocks, 0);
            for (int index = 0; index < heads_total * m_blocks; ++index) {
              const WorkItem w = grouped_heaviest_first_item(index, heads, heads_total, m_blocks,
                                                             group, mask.left, mask.right);
              ASSERT_TRUE(w.batch >= 0 && w.batch < batch && w.head >= 0 && w.head < heads &&
                          w.m_block >= 0 && w.m_block < m_blocks)
                  << "index " << index;
              const int bh = w.batch * heads + w.head;
              ++seen[size_t(bh) * m_blocks + w.m_block];
              const int in_group = group < heads_total ? group : heads_total;
              EXPECT_EQ(bh / in_group, index / (in_group * m_blocks))
                  << "index " << index << " left its group of heads";
              if (group == 1) {  // the plain grid: x = index % m_blocks, y = head, z = batch
                const int x = index % m_blocks, yz = index / m_blocks;
                EXPECT_EQ(w.batch, yz / heads);
                EXPECT_EQ(w.head, yz % heads);
                EXPECT_EQ(w.m_block, heaviest_first_block(mask.left, mask.right, x, m_blocks));
              }
              if (sorted && index % (in_group * m_blocks) != 0) {
                const WorkItem prev = grouped_heaviest_first_item(
                    index - 1, heads, heads_total, m_blocks, group, mask.left, mask.right);
                ASSERT_LE(item_tiles(mask, sq, sk, w.m_block), item_tiles(mask, sq, sk, prev.m_block))
                    << "index " << index << " is heavier than the one before it in its group";
              }
            }
            for (size_t i = 0; i < seen.size(); ++i)
              ASSERT_EQ(seen[i], 1) << "item (b·h, m) = (" << i / m_blocks << ", " << i % m_blocks << ")";
          }
}

// The backward's key-major grid (sm90_ws_backward_kernel's backward_grid_item) takes the
// same order with each block index reversed: its key blocks then run heaviest first (the
// most query blocks) in each group wherever the forward's query blocks do.
TEST(Sm90TileSchedule, ReversedBlocksListKeyBlocksHeaviestFirst) {
  auto key_block_weight = [](const MaskCase& mask, int sq, int sk, int n_block) {
    const Mask<int> m(mask.left, mask.right, sq, sk);
    const int key0 = n_block * kBlockN;
    return query_blocks(m, key0, std::min(key0 + kBlockN, sk), kBlockM).count();
  };
  for (const MaskCase& mask : kMasks) {
    const bool sorted = mask.right == 0 || (mask.left >= 0 && mask.right < 0) ||
                        (mask.left < 0 && mask.right < 0);
    if (!sorted) continue;
    for (int sq : {129, 1100, 4096})
      for (int group : {1, 4}) {
        SCOPED_TRACE(std::string(mask.name) + " sq " + std::to_string(sq) + " group " +
                     std::to_string(group));
        const int heads = 8, n_blocks = (sq + kBlockN - 1) / kBlockN;
        auto key_block = [&](int index) {
          return n_blocks - 1 - grouped_heaviest_first_item(index, heads, heads, n_blocks, group,
                                                            mask.left, mask.right)
                                    .m_block;
        };
        for (int index = 1; index < heads * n_blocks; ++index) {
          if (index % (std::min(group, heads) * n_blocks) == 0) continue;  // a group's first
          ASSERT_LE(key_block_weight(mask, sq, sq, key_block(index)),
                    key_block_weight(mask, sq, sq, key_block(index - 1)))
              << "index " << index;
        }
      }
  }
}

TEST(Sm90TileSchedule, HeadsPerLaunchGroupCoverOneWave) {
  EXPECT_EQ(heads_per_launch_group(132, 32), 4);   // causal 4k, 128-row blocks
  EXPECT_EQ(heads_per_launch_group(132, 64), 2);   // 8k
  EXPECT_EQ(heads_per_launch_group(132, 128), 1);  // 16k: the plain grid
  EXPECT_EQ(heads_per_launch_group(132, 86), 1);   // 16k, 192-row blocks
  EXPECT_EQ(heads_per_launch_group(132, 1000), 1);
  EXPECT_EQ(heads_per_launch_group(264, 4), 66);
  EXPECT_EQ(heads_per_launch_group(132, 0), 1);
}

// Why the grouped order (JOURNEY 4.9): CTAs modelled as starting in block order on the first
// free SM, each taking F + n·t cycles for n key tiles (4.8's fit: t = 2768, F = 8480), on 132
// SMs. At causal 4k (128-row blocks and tiles, 32 query blocks per head) the plain grid ends
// over 5% past the balanced time sum / 132 at 64 heads (d=128), and the grouped order within 1%.
TEST(Sm90TileSchedule, GroupedOrderShortensTheCausalTailInAGreedyModel) {
  constexpr int kSms = 132;
  constexpr double kTile = 2768, kFixed = 8480;
  const MaskCase causal{-1, 0, "causal"};
  for (int heads_total : {32, 64, 128}) {
    const int sq = 4096, m_blocks = sq / kBlockM;
    auto finish = [&](int group) {
      std::vector<double> sm(kSms, 0.0);
      for (int index = 0; index < heads_total * m_blocks; ++index) {
        const WorkItem w = grouped_heaviest_first_item(index, heads_total, heads_total, m_blocks,
                                                       group, causal.left, causal.right);
        auto first_free = std::min_element(sm.begin(), sm.end());
        *first_free += kFixed + kTile * item_tiles(causal, sq, sq, w.m_block);
      }
      return *std::max_element(sm.begin(), sm.end());
    };
    double balanced = 0;
    for (int m = 0; m < m_blocks; ++m) balanced += kFixed + kTile * item_tiles(causal, sq, sq, m);
    balanced *= double(heads_total) / kSms;
    SCOPED_TRACE("heads " + std::to_string(heads_total));
    const double plain = finish(1) / balanced;
    const double grouped = finish(heads_per_launch_group(kSms, m_blocks)) / balanced;
    EXPECT_LT(grouped, 1.01);
    EXPECT_LT(grouped, plain);
    if (heads_total == 64) EXPECT_GT(plain, 1.05);
  }
}

TEST(Sm90TileSchedule, RingSlotCountsLapsAndParities) {
  for (uint32_t count = 0; count < 40; ++count) {
    const RingSlot<3> three{count};
    EXPECT_EQ(three.slot(), int(count % 3));
    EXPECT_EQ(three.full_parity(), (count / 3) % 2);
    EXPECT_EQ(three.reused(), count >= 3);
    if (count >= 3) EXPECT_EQ(three.released_parity(), ((count - 3) / 3) % 2);
    const RingSlot<1> one{count};
    EXPECT_EQ(one.slot(), 0);
    EXPECT_EQ(one.full_parity(), count % 2);
  }
}

// A model of an mbarrier: phases complete one after another; a wait for parity P passes once
// the phase of that parity has completed, i.e. while the current phase's parity is not P
// (the PTX ISA's mbarrier.try_wait.parity).
struct ModelBarrier {
  uint32_t completed = 0;
  bool passes(uint32_t parity) const { return completed % 2 != parity; }
};

// One buffer ring with its full/empty barriers; each buffer remembers which use it holds.
struct ModelRing {
  std::vector<ModelBarrier> full, empty;
  std::vector<int64_t> held;     // the use a buffer holds, -1 if none
  std::vector<bool> read;        // whether the consumer is done with it
  explicit ModelRing(int slots) : full(slots), empty(slots), held(slots, -1), read(slots, true) {}
};

// The kernel's protocol (sm90_persistent_forward_kernel), one step at a time: the producer
// walks its items issuing tiles_before_q tiles, the item's Q, then the rest; the consumer
// waits for the item's Q, consumes each tile (waiting for it to be full, then releasing it),
// and releases Q after the epilogue. Both count tiles and items over the CTA's lifetime
// through RingSlot. Random interleavings; every blocked wait must eventually pass.
template <int kStages, int kQBuffers>
void run_protocol(const std::vector<int>& tiles_per_item, std::mt19937& gen) {
  struct Op {
    bool is_q;
    int64_t use;  // the tile's lifetime count, or the item's ordinal
  };
  std::vector<Op> producer, consumer;
  int64_t tile_count = 0;
  for (size_t item = 0; item < tiles_per_item.size(); ++item) {
    const int n = tiles_per_item[item];
    const int before_q = tiles_before_q<kStages, kQBuffers>(n);
    ASSERT_TRUE(before_q >= 0 && before_q <= n);
    for (int t = 0; t < before_q; ++t) producer.push_back({false, tile_count + t});
    producer.push_back({true, int64_t(item)});
    for (int t = before_q; t < n; ++t) producer.push_back({false, tile_count + t});
    consumer.push_back({true, int64_t(item)});  // waits for Q, releases it after the item
    for (int t = 0; t < n; ++t) consumer.push_back({false, tile_count + t});
    consumer.push_back({true, -1 - int64_t(item)});  // the release of Q after the epilogue
    tile_count += n;
  }
  ModelRing kv(kStages), q(kQBuffers);
  size_t next_produce = 0, next_consume = 0;
  std::bernoulli_distribution producer_turn(0.5);
  while (next_produce < producer.size() || next_consume < consumer.size()) {
    bool moved = false;
    const bool producer_first = producer_turn(gen);
    for (int side = 0; side < 2 && !moved; ++side) {
      const bool is_producer = (side == 0) == producer_first;
      if (is_producer && next_produce < producer.size()) {
        const Op op = producer[next_produce];
        ModelRing& ring = op.is_q ? q : kv;
        const uint32_t use = static_cast<uint32_t>(op.use);
        const int slot = op.is_q ? RingSlot<kQBuffers>{use}.slot() : RingSlot<kStages>{use}.slot();
        const bool reused = op.is_q ? RingSlot<kQBuffers>{use}.reused() : RingSlot<kStages>{use}.reused();
        const uint32_t parity = op.is_q ? RingSlot<kQBuffers>{use}.released_parity()
                                        : RingSlot<kStages>{use}.released_parity();
        if (reused && !ring.empty[slot].passes(parity)) continue;  // blocked
        ASSERT_TRUE(ring.read[slot]) << (op.is_q ? "Q" : "tile") << " use " << use
                                     << " overwrites unread use " << ring.held[slot];
        ring.held[slot] = op.use, ring.read[slot] = false;
        ++ring.full[slot].completed;  // the copy lands
        ++next_produce, moved = true;
      } else if (!is_producer && next_consume < consumer.size()) {
        const Op op = consumer[next_consume];
        if (op.is_q && op.use < 0) {  // release Q
          const uint32_t item = static_cast<uint32_t>(-1 - op.use);
          const int slot = RingSlot<kQBuffers>{item}.slot();
          q.read[slot] = true;
          ++q.empty[slot].completed;
          ++next_consume, moved = true;
          continue;
        }
        ModelRing& ring = op.is_q ? q : kv;
        const uint32_t use = static_cast<uint32_t>(op.use);
        const int slot = op.is_q ? RingSlot<kQBuffers>{use}.slot() : RingSlot<kStages>{use}.slot();
        const uint32_t parity = op.is_q ? RingSlot<kQBuffers>{use}.full_parity()
                                        : RingSlot<kStages>{use}.full_parity();
        if (!ring.full[slot].passes(parity)) continue;  // blocked
        ASSERT_EQ(ring.held[slot], op.use) << (op.is_q ? "Q" : "tile") << " read the wrong use";
        if (!op.is_q) {  // a tile is released once read; Q only after the epilogue
          ring.read[slot] = true;
          ++ring.empty[slot].completed;
        }
        ++next_consume, moved = true;
      }
    }
    ASSERT_TRUE(moved) << "deadlock: producer at op " << next_produce << " of " << producer.size()
                       << ", consumer at op " << next_consume << " of " << consumer.size();
  }
}

TEST(Sm90TileSchedule, LifetimeCountsDriveTheRingsAcrossItems) {
  std::mt19937 gen(9);
  std::uniform_int_distribution<int> items(1, 12), tiles(0, 9);
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<int> tiles_per_item(size_t(items(gen)));
    for (int& n : tiles_per_item) n = trial % 7 == 0 ? 0 : tiles(gen);  // some with no tile
    SCOPED_TRACE("trial " + std::to_string(trial));
    ASSERT_NO_FATAL_FAILURE((run_protocol<2, 2>(tiles_per_item, gen)));
    ASSERT_NO_FATAL_FAILURE((run_protocol<2, 1>(tiles_per_item, gen)));
    ASSERT_NO_FATAL_FAILURE((run_protocol<3, 1>(tiles_per_item, gen)));
  }
}

}  // namespace
}  // namespace flashtile::detail::sm90
