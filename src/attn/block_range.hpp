// The key blocks one block of query rows must visit, split into the blocks that need the
// mask and those every row sees whole (FlashAttention-3's block.h, the masked / unmasked
// trip counts of CUTLASS example 88). Kernels visit [begin, end), evaluate the mask only
// where needs_mask(n) says so, and skip every block outside: under a causal or sliding
// window mask, that is what makes time proportional to the visible keys.
#pragma once

#include "attn/mask.hpp"

namespace flashtile::detail {

template <class Int>
struct KeyBlocks {
  Int begin = 0, end = 0;            // blocks [begin, end) hold every key some row sees
  Int full_begin = 0, full_end = 0;  // blocks [full_begin, full_end) are seen whole by every row

  FT_HOST_DEVICE bool empty() const { return end <= begin; }
  FT_HOST_DEVICE Int count() const { return end > begin ? end - begin : Int(0); }
  // A block outside [full_begin, full_end) holds keys some row must not see (or keys past
  // seqlen_k, in a last partial block).
  FT_HOST_DEVICE bool needs_mask(Int n) const { return n < full_begin || n >= full_end; }
};

template <class Int>
FT_HOST_DEVICE Int ceil_div(Int a, Int b) {
  return (a + b - 1) / b;
}

// Blocks of `block_n` keys for query rows [row_begin, row_end) of one sequence (row_end
// clamped to its seqlen_q by the caller). The bounds of the rows move monotonically with the
// row, so the first and last rows bound the union and the intersection of what rows see.
template <class Int>
FT_HOST_DEVICE KeyBlocks<Int> key_blocks(const Mask<Int>& mask, Int row_begin, Int row_end,
                                         Int block_n) {
  KeyBlocks<Int> blocks;
  if (row_end <= row_begin) return blocks;
  const Int first = mask.first_key(row_begin), last_end = mask.key_end(row_end - 1);
  if (last_end <= first) return blocks;
  blocks.begin = first / block_n;
  blocks.end = ceil_div(last_end, block_n);
  // Keys every row sees: from the last row's first key to the first row's end. key_end is
  // at most seqlen_k, so a partial last block is never "full".
  Int full_begin = ceil_div(mask.first_key(row_end - 1), block_n);
  Int full_end = mask.key_end(row_begin) / block_n;
  full_begin = full_begin > blocks.begin ? full_begin : blocks.begin;
  full_end = full_end < blocks.end ? full_end : blocks.end;
  blocks.full_begin = full_begin;
  blocks.full_end = full_end > full_begin ? full_end : full_begin;
  return blocks;
}

// The backward pass's inverse: the blocks of query rows that see keys [key_begin, key_end)
// of one sequence (key_end clamped to its seqlen_k by the caller), those where the mask must
// be evaluated and those whose every row sees every key. A partial last query block (rows
// past seqlen_q) is never "full", as a partial last key block is never full above.
template <class Int>
struct QueryBlocks {
  Int begin = 0, end = 0;            // blocks [begin, end) hold every row that sees a key
  Int full_begin = 0, full_end = 0;  // blocks [full_begin, full_end): every row sees every key

  FT_HOST_DEVICE bool empty() const { return end <= begin; }
  FT_HOST_DEVICE Int count() const { return end > begin ? end - begin : Int(0); }
  FT_HOST_DEVICE bool needs_mask(Int m) const { return m < full_begin || m >= full_end; }
};

// Blocks of `block_m` query rows for keys [key_begin, key_end). The rows that see a key move
// monotonically with the key, so the first and last keys bound the union and intersection.
template <class Int>
FT_HOST_DEVICE QueryBlocks<Int> query_blocks(const Mask<Int>& mask, Int key_begin, Int key_end,
                                             Int block_m) {
  QueryBlocks<Int> blocks;
  if (key_end <= key_begin) return blocks;
  const Int first = mask.first_query(key_begin), last_end = mask.query_end(key_end - 1);
  if (last_end <= first) return blocks;
  blocks.begin = first / block_m;
  blocks.end = ceil_div(last_end, block_m);
  // Rows every key is seen by: from the last key's first row to the first key's end.
  Int full_begin = ceil_div(mask.first_query(key_end - 1), block_m);
  Int full_end = mask.query_end(key_begin) / block_m;
  full_begin = full_begin > blocks.begin ? full_begin : blocks.begin;
  full_end = full_end < blocks.end ? full_end : blocks.end;
  blocks.full_begin = full_begin;
  blocks.full_end = full_end > full_begin ? full_end : full_begin;
  return blocks;
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
