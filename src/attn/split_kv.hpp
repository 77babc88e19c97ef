// Split-KV (FlashDecoding; FlashAttention-2's num_splits): when a call has too few tiles
// (sequence, head, query block) to keep every worker busy, each tile's key blocks are cut
// into `splits` contiguous ranges that run as separate tasks. A range folds into a partial
// output, normalised by its own denominator, and its log-sum-exp; combine_partials merges
// the partials of a row with merge_states (a partial's state is state_from_lse) and then
// finishes the row as an unsplit kernel does: the NaN rule over the whole row, then the
// sink. Partials therefore never apply either.
#pragma once

#include <cstdint>
#include <limits>

#include "attn/block_range.hpp"
#include "attn/softmax_state.hpp"

namespace flashtile::detail {

// Split `split` of `splits` of a tile's key blocks: a contiguous share of [begin, end), with
// the whole blocks kept where they fall. Some splits are empty when blocks < splits.
template <class Int>
FT_HOST_DEVICE KeyBlocks<Int> split_key_blocks(const KeyBlocks<Int>& blocks, int split, int splits) {
  const int64_t count = blocks.count();
  KeyBlocks<Int> part = blocks;
  part.begin = static_cast<Int>(blocks.begin + count * split / splits);
  part.end = static_cast<Int>(blocks.begin + count * (split + 1) / splits);
  return part;  // full_begin/full_end still name the whole blocks: needs_mask stays right
}

// How many splits a call gets: 1 when `tiles` already reach `target_tiles` (the workers:
// threads, or CTAs the GPU holds at once), else as many as fit in them (tiles x splits <=
// target_tiles: one more would start a second wave, whose tail costs what the split saved),
// keeping at least `min_blocks_per_split` key blocks (of the tile that sees the most) in each
// and at most `max_splits`.
inline int choose_splits(int64_t tiles, int64_t max_key_blocks, int64_t target_tiles,
                         int64_t min_blocks_per_split, int max_splits) {
  if (tiles <= 0 || tiles >= target_tiles) return 1;
  int64_t splits = target_tiles / tiles;
  const int64_t by_blocks = max_key_blocks / min_blocks_per_split;
  splits = splits < by_blocks ? splits : by_blocks;
  splits = splits < max_splits ? splits : max_splits;
  return splits > 1 ? static_cast<int>(splits) : 1;
}

// The weights of a row's partials in its output (out = Σ_s weight[s] · partial_out[s]) and
// the row's log-sum-exp, from the partials' LSEs: merged with merge_states, then the NaN rule
// (a row that sees keys but has no finite score is NaN) and the sink. An empty row gets
// weights 0 and LSE -inf; a NaN LSE makes every weight and the LSE NaN.
template <class T>
FT_HOST_DEVICE T combine_partials(const T* partial_lse, int splits, T sink, bool row_sees_keys,
                                  T* weight) {
  SoftmaxState<T> state;
  for (int s = 0; s < splits; ++s) merge_states(state, state_from_lse(partial_lse[s]));
  nan_if_no_finite_score(state, row_sees_keys);
  add_sink(state, sink);
  const T shift = safe_shift(state.m), scale = output_scale(state);
  for (int s = 0; s < splits; ++s) weight[s] = softmax_exp(partial_lse[s] - shift) * scale;
  return log_sum_exp(state);
}

// combine_partials for registers: the same weights and LSE (same NaN rule, same sink), with
// the split count bounded at compile time so that a GPU thread keeps both arrays in registers
// (fully unrolled, no stack) and no step waits on the previous split. The largest LSE comes
// first, then every exponential independently, then their sum in split order: so the
// denominator rounds differently from combine_partials' chain of merges (a few ulp), and the
// result is the same from run to run. Entries from `splits` on are ignored; their weights
// are 0. cpu_flash keeps combine_partials; tests/cpu/test_split_kv_combine.cpp holds the two
// to each other.
template <int kMaxSplits, class T>
FT_HOST_DEVICE T combine_partials_unrolled(const T (&partial_lse)[kMaxSplits], int splits, T sink,
                                           bool row_sees_keys, T (&weight)[kMaxSplits]) {
  constexpr T kEmpty = -std::numeric_limits<T>::infinity();
  T row_max = kEmpty;  // a NaN LSE never wins here; it reaches the denominator below
  FT_UNROLL
  for (int s = 0; s < kMaxSplits; ++s) {
    const T lse = s < splits ? partial_lse[s] : kEmpty;
    row_max = lse > row_max ? lse : row_max;
  }
  // A partial's state is (lse, 1): relative to row_max it adds exp(lse - row_max) to l.
  const T shift = safe_shift(row_max);
  T denominator = T(0);
  FT_UNROLL
  for (int s = 0; s < kMaxSplits; ++s) {
    weight[s] = softmax_exp(s < splits ? partial_lse[s] - shift : kEmpty);  // a select, no branch
    denominator += weight[s];
  }
  SoftmaxState<T> state{row_max, denominator};
  nan_if_no_finite_score(state, row_sees_keys);
  const T scale = add_sink(state, sink) * output_scale(state);
  FT_UNROLL
  for (int s = 0; s < kMaxSplits; ++s) weight[s] = s < splits ? weight[s] * scale : T(0);
  return log_sum_exp(state);
}

}  // namespace flashtile::detail
