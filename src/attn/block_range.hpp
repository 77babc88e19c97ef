// The key blocks one block of query rows must visit, split into the blocks that need the
// mask and those every row sees whole (FlashAttention-3's block.h, the masked / unmasked
// trip counts of CUTLASS example 88). Kernels visit [begin, end), evaluate the mask only
// where needs_mask(n) says so, and skip every block outside: under a causal or sliding
// window mask, that is what makes time proportional to the visible keys.
#pragma once

#include "attn/mask.hpp"

namespace flashtile::detail {

// Blocks [begin, end) of a range (key blocks for a query block, or query blocks for a key
// block, in the backward pass) and the blocks [full_begin, full_end) where every pair is
// visible. A block outside the full ones holds pairs the mask hides (or positions past the
// sequence, in a last partial block), so the kernel evaluates the mask there.
template <class Int>
struct BlockRange {
  Int begin = 0, end = 0;
  Int full_begin = 0, full_end = 0;

  FT_HOST_DEVICE bool empty() const { return end <= begin; }
  FT_HOST_DEVICE Int count() const { return end > begin ? end - begin : Int(0); }
  FT_HOST_DEVICE bool needs_mask(Int n) const { return n < full_begin || n >= full_end; }
};
template <class Int>
using KeyBlocks = BlockRange<Int>;
template <class Int>
using QueryBlocks = BlockRange<Int>;

template <class Int>
FT_HOST_DEVICE Int ceil_div(Int a, Int b) {
  return (a + b - 1) / b;
}

// The blocks of `block` positions seen from an interval of the other axis whose bounds move
// monotonically with it: `first_of(x)` / `end_of(x)` bound what position x of the interval
// [lo, hi) sees, so the first and last positions bound the union and the intersection.
template <class Int, class FirstOf, class EndOf>
FT_HOST_DEVICE BlockRange<Int> monotone_blocks(FirstOf first_of, EndOf end_of, Int lo, Int hi,
                                               Int block) {
  BlockRange<Int> blocks;
  if (hi <= lo) return blocks;
  const Int first = first_of(lo), last_end = end_of(hi - 1);
  if (last_end <= first) return blocks;
  blocks.begin = first / block;
  blocks.end = ceil_div(last_end, block);
  // Seen by every position: from the last one's first to the first one's end. An end is at
  // most the sequence length, so a partial last block is never "full".
  Int full_begin = ceil_div(first_of(hi - 1), block);
  Int full_end = end_of(lo) / block;
  full_begin = full_begin > blocks.begin ? full_begin : blocks.begin;
  full_end = full_end < blocks.end ? full_end : blocks.end;
  blocks.full_begin = full_begin;
  blocks.full_end = full_end > full_begin ? full_end : full_begin;
  return blocks;
}

// Blocks of `block_n` keys for query rows [row_begin, row_end) of one sequence (row_end
// clamped to its seqlen_q by the caller).
template <class Int>
FT_HOST_DEVICE KeyBlocks<Int> key_blocks(const Mask<Int>& mask, Int row_begin, Int row_end,
                                         Int block_n) {
  return monotone_blocks([&](Int i) { return mask.first_key(i); },
                         [&](Int i) { return mask.key_end(i); }, row_begin, row_end, block_n);
}

// The backward pass's inverse: blocks of `block_m` query rows that see keys
// [key_begin, key_end) of one sequence (key_end clamped to its seqlen_k by the caller).
template <class Int>
FT_HOST_DEVICE QueryBlocks<Int> query_blocks(const Mask<Int>& mask, Int key_begin, Int key_end,
                                             Int block_m) {
  return monotone_blocks([&](Int j) { return mask.first_query(j); },
                         [&](Int j) { return mask.query_end(j); }, key_begin, key_end, block_m);
}

// The query block that the x-th of `blocks` launched CTAs computes, so that CTAs, which start
// in order of x, take the heaviest blocks first and the light ones fill the tail. Rows see
// more keys the later they are unless only the window's left side is bounded (then the
// first rows see the most); with full attention the first rows are the lightest anyway.
FT_HOST_DEVICE int heaviest_first_block(int64_t window_left, int64_t window_right, int x,
                                        int blocks) {
  const bool first_rows_heaviest = window_left >= 0 && window_right < 0;
  return first_rows_heaviest ? x : blocks - 1 - x;
}

}  // namespace flashtile::detail
