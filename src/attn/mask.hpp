// Which keys a query sees: the causal / sliding-window mask of one sequence (the idea of
// FlashAttention-2's mask.h). Query i sees key j when j - (i + seqlen_k - seqlen_q) lies in
// [-left, right]; a side of -1 is unbounded, causal is right = 0 (bottom-right aligned).
// Every backend, the oracle included, asks this struct; none writes the bound itself.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace flashtile::detail {

// Int: the position type of the kernel (int on the GPU, int64_t on the CPU). The bounds are
// computed in int64 and clamped to [0, seqlen_k], so they fit Int whenever seqlen_k does.
template <class Int>
struct Mask {
  int64_t left = -1, right = -1;  // window sides, -1 = unbounded
  int64_t offset = 0;             // seqlen_k - seqlen_q: where the diagonal lies
  Int seqlen_k = 0;

  FT_HOST_DEVICE Mask(int64_t window_left, int64_t window_right, Int seqlen_q, Int seqlen_k_)
      : left(window_left), right(window_right),
        offset(int64_t(seqlen_k_) - int64_t(seqlen_q)), seqlen_k(seqlen_k_) {}

  // First key query row i sees (may be >= key_end(i): the row sees nothing).
  FT_HOST_DEVICE Int first_key(Int i) const {
    if (left < 0) return 0;
    return clamp_key(int64_t(i) + offset - left);
  }
  // One past the last key query row i sees.
  FT_HOST_DEVICE Int key_end(Int i) const {
    if (right < 0) return seqlen_k;
    return clamp_key(int64_t(i) + offset + right + 1);
  }
  FT_HOST_DEVICE bool visible(Int i, Int j) const { return j >= first_key(i) && j < key_end(i); }
  // Keys row i sees (0 for an empty row).
  FT_HOST_DEVICE Int visible_keys(Int i) const {
    const Int first = first_key(i), end = key_end(i);
    return end > first ? end - first : Int(0);
  }
  // i + seqlen_k - seqlen_q: the key on row i's diagonal (what causal is aligned to). It
  // lies in [seqlen_k - seqlen_q, seqlen_k) for every row i < seqlen_q, so it fits Int.
  FT_HOST_DEVICE Int diagonal(Int i) const { return static_cast<Int>(int64_t(i) + offset); }

  // The inverse, for the backward pass's key-major loop: the query rows that see key j
  // (j < seqlen_k) are [first_query(j), query_end(j)), empty when first >= end. From the
  // rule: i >= j - offset - right and i <= j - offset + left, clamped to [0, seqlen_q].
  FT_HOST_DEVICE Int first_query(Int j) const {
    if (right < 0) return 0;
    return clamp_query(int64_t(j) - offset - right);
  }
  FT_HOST_DEVICE Int query_end(Int j) const {
    if (left < 0) return seqlen_q();
    return clamp_query(int64_t(j) - offset + left + 1);
  }
  FT_HOST_DEVICE Int seqlen_q() const { return static_cast<Int>(int64_t(seqlen_k) - offset); }

 private:
  FT_HOST_DEVICE Int clamp_key(int64_t key) const {
    return static_cast<Int>(key < 0 ? 0 : (key > int64_t(seqlen_k) ? int64_t(seqlen_k) : key));
  }
  FT_HOST_DEVICE Int clamp_query(int64_t row) const {
    const int64_t rows = int64_t(seqlen_k) - offset;
    return static_cast<Int>(row < 0 ? 0 : (row > rows ? rows : row));
  }
};

}  // namespace flashtile::detail
