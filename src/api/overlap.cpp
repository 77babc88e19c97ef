// Exact overlap of strided views: a bounded linear Diophantine feasibility problem,
//   does Σ c_i·x_i land in [lo, hi] for integers x_i in [min_i, max_i]?
// solved by depth-first search over the terms in decreasing |c_i|. At each term only the
// x that can still reach [lo, hi] given the span of the remaining terms are tried, so a
// term whose stride exceeds everything after it admits one or two values; dead ends are
// remembered per (term, lo), which collapses the repeated sub-problems of regular layouts
// (every batch entry, every row) into one. A work limit keeps pathological inputs bounded;
// past it the answer is `unknown`.
#include "api/overlap.hpp"

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

namespace flashtile::detail {
namespace {

using Wide = __int128;

struct Term {
  Wide c;
  Wide min, max;  // x in [min, max]
};

Wide floor_div(Wide a, Wide b) {  // b > 0
  Wide q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}
Wide ceil_div(Wide a, Wide b) { return -floor_div(-a, b); }

class Search {
 public:
  explicit Search(std::vector<Term> terms) : terms_(std::move(terms)) {
    std::sort(terms_.begin(), terms_.end(), [](const Term& x, const Term& y) {
      return (x.c < 0 ? -x.c : x.c) > (y.c < 0 ? -y.c : y.c);
    });
    rest_min_.assign(terms_.size() + 1, 0);
    rest_max_.assign(terms_.size() + 1, 0);
    for (size_t k = terms_.size(); k-- > 0;) {
      const Wide a = terms_[k].c * terms_[k].min, b = terms_[k].c * terms_[k].max;
      rest_min_[k] = rest_min_[k + 1] + std::min(a, b);
      rest_max_[k] = rest_max_[k + 1] + std::max(a, b);
    }
  }

  Overlap solve(Wide lo, Wide hi) {
    const bool found = feasible(0, lo, hi);
    if (gave_up_) return Overlap::unknown;
    return found ? Overlap::yes : Overlap::no;
  }

 private:
  static constexpr int64_t kWorkLimit = int64_t(1) << 22;

  bool feasible(size_t k, Wide lo, Wide hi) {
    if (lo > hi || rest_max_[k] < lo || rest_min_[k] > hi) return false;
    if (k == terms_.size()) return true;  // 0 lies in [lo, hi]
    if (++work_ > kWorkLimit) {
      gave_up_ = true;
      return false;
    }
    if (dead_.count({k, lo})) return false;
    const Term& t = terms_[k];
    // c·x must lie in [lo - rest_max, hi - rest_min].
    const Wide want_lo = lo - rest_max_[k + 1], want_hi = hi - rest_min_[k + 1];
    Wide x_lo = t.min, x_hi = t.max;
    if (t.c > 0) {
      x_lo = std::max(x_lo, ceil_div(want_lo, t.c));
      x_hi = std::min(x_hi, floor_div(want_hi, t.c));
    } else if (t.c < 0) {
      x_lo = std::max(x_lo, ceil_div(-want_hi, -t.c));
      x_hi = std::min(x_hi, floor_div(-want_lo, -t.c));
    }
    for (Wide x = x_lo; x <= x_hi && !gave_up_; ++x)
      if (feasible(k + 1, lo - t.c * x, hi - t.c * x)) return true;
    if (!gave_up_) dead_.insert({k, lo});
    return false;
  }

  std::vector<Term> terms_;
  std::vector<Wide> rest_min_, rest_max_;
  std::set<std::pair<size_t, Wide>> dead_;
  int64_t work_ = 0;
  bool gave_up_ = false;
};

}  // namespace

Overlap views_overlap(const StridedBytes& a, const StridedBytes& b) {
  // addr_a(x) - addr_b(y) must lie in (-element_bytes_a, element_bytes_b).
  std::vector<Term> terms;
  for (size_t i = 0; i < a.extents.size(); ++i)
    if (a.extents[i] > 1 && a.byte_strides[i] != 0)
      terms.push_back({a.byte_strides[i], 0, a.extents[i] - 1});
  for (size_t i = 0; i < b.extents.size(); ++i)
    if (b.extents[i] > 1 && b.byte_strides[i] != 0)
      terms.push_back({-Wide(b.byte_strides[i]), 0, b.extents[i] - 1});
  const Wide base = Wide(a.address) - Wide(b.address);
  return Search(std::move(terms)).solve(-(a.element_bytes - 1) - base, (b.element_bytes - 1) - base);
}

// Whether the dimensions nest: sorted by |stride|, each at least the bytes the smaller ones
// span. Then the dimension of the highest index where two elements differ moves them further
// apart than all the others can bring them back, so no byte is shared: every packed or padded
// layout, settled without the search (and its allocations) on every call that validates one.
static bool strides_nest(const StridedBytes& view) {
  struct Dim {
    Wide stride, extent;
  };
  Dim dims[8];
  int n = 0;
  for (size_t i = 0; i < view.extents.size(); ++i) {
    if (view.extents[i] == 1) continue;
    if (n == 8) return false;  // the search decides
    const Wide stride = view.byte_strides[i] < 0 ? -Wide(view.byte_strides[i]) : Wide(view.byte_strides[i]);
    int at = n++;  // insertion by stride
    for (; at > 0 && dims[at - 1].stride > stride; --at) dims[at] = dims[at - 1];
    dims[at] = {stride, view.extents[i]};
  }
  Wide span = view.element_bytes;  // bytes covered by the dimensions below
  for (int i = 0; i < n; ++i) {
    if (dims[i].stride < span) return false;
    span += dims[i].stride * (dims[i].extent - 1);  // span <= 2^64 + 2^126 here: no wrap
    if (span > (Wide(1) << 64)) return false;        // past any address space: the search decides
  }
  return true;
}

Overlap self_overlap(const StridedBytes& view) {
  if (strides_nest(view)) return Overlap::no;
  // Two distinct elements x != x' overlap when Σ s_i·δ_i lies in (-e, e) for δ = x - x' != 0.
  // By symmetry the first non-zero δ_k is positive: one search per k.
  std::vector<Term> dims;
  for (size_t i = 0; i < view.extents.size(); ++i)
    if (view.extents[i] > 1) dims.push_back({view.byte_strides[i], 0, view.extents[i] - 1});
  bool unknown = false;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k].c == 0) return Overlap::yes;  // a broadcast dimension aliases itself
    std::vector<Term> terms;
    terms.push_back({dims[k].c, 1, dims[k].max});
    for (size_t i = k + 1; i < dims.size(); ++i) terms.push_back({dims[i].c, -dims[i].max, dims[i].max});
    const Overlap result =
        Search(std::move(terms)).solve(-(view.element_bytes - 1), view.element_bytes - 1);
    if (result == Overlap::yes) return Overlap::yes;
    unknown |= result == Overlap::unknown;
  }
  return unknown ? Overlap::unknown : Overlap::no;
}

}  // namespace flashtile::detail
