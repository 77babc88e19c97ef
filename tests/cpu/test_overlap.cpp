// Exact overlap of strided views (src/api/overlap.hpp) against brute force, and the
// validator's use of it: interleaved disjoint views are accepted, aliasing ones refused.
#include <gtest/gtest.h>

#include <random>
#include <map>
#include <set>
#include <vector>

#include "api/overlap.hpp"
#include "testing/attention_case.hpp"

namespace flashtile {
namespace {

using detail::Overlap;
using detail::StridedBytes;

// Every byte of every element, as (element index, byte address) pairs.
std::vector<std::pair<int64_t, int64_t>> bytes_of(const StridedBytes& v) {
  std::vector<std::pair<int64_t, int64_t>> bytes;
  int64_t count = 1;
  for (int64_t e : v.extents) count *= e;
  for (int64_t n = 0; n < count; ++n) {
    int64_t rest = n, address = int64_t(v.address);
    for (size_t i = v.extents.size(); i-- > 0;) {
      address += (rest % v.extents[i]) * v.byte_strides[i];
      rest /= v.extents[i];
    }
    for (int64_t b = 0; b < v.element_bytes; ++b) bytes.push_back({n, address + b});
  }
  return bytes;
}

StridedBytes random_view(std::mt19937& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  StridedBytes v;
  v.address = uintptr_t(1000 + pick(0, 40));
  v.element_bytes = pick(1, 4);
  const int dims = pick(1, 3);
  for (int i = 0; i < dims; ++i) {
    v.extents.push_back(pick(1, 4));
    v.byte_strides.push_back(pick(-12, 12));
  }
  return v;
}

TEST(Overlap, TwoViewsMatchBruteForce) {
  std::mt19937 rng(17);
  for (int t = 0; t < 3000; ++t) {
    const StridedBytes a = random_view(rng), b = random_view(rng);
    std::set<int64_t> in_a;
    for (auto [n, address] : bytes_of(a)) in_a.insert(address);
    bool shared = false;
    for (auto [n, address] : bytes_of(b)) shared |= in_a.count(address) > 0;
    ASSERT_EQ(detail::views_overlap(a, b), shared ? Overlap::yes : Overlap::no) << "case " << t;
  }
}

TEST(Overlap, SelfOverlapMatchesBruteForce) {
  std::mt19937 rng(29);
  for (int t = 0; t < 3000; ++t) {
    const StridedBytes v = random_view(rng);
    std::map<int64_t, int64_t> owner;  // byte -> element
    bool aliased = false;
    for (auto [n, address] : bytes_of(v)) {
      auto [it, inserted] = owner.insert({address, n});
      aliased |= !inserted && it->second != n;
    }
    ASSERT_EQ(detail::self_overlap(v), aliased ? Overlap::yes : Overlap::no) << "case " << t;
  }
}

TEST(Overlap, InterleavedHeadsOfOneBufferAreDisjoint) {
  // (B, S, H, D) = (2, 4096, 16, 64) bf16 buffer: heads 0::2 and 1::2 as two views.
  const int64_t S = 4096, H = 16, D = 64, e = 2;
  StridedBytes even{0x10000, e, {2, S, H / 2, D}, {S * H * D * e, H * D * e, 2 * D * e, e}};
  StridedBytes odd = even;
  odd.address += D * e;
  EXPECT_EQ(detail::views_overlap(even, odd), Overlap::no);
  odd.address -= e;  // one element earlier: its last element shares the even head's
  EXPECT_EQ(detail::views_overlap(even, odd), Overlap::yes);
}

TEST(Overlap, HugeStridesDoNotWrap) {
  // Strides near 2^62 bytes: 64-bit sums would wrap around and "meet".
  const int64_t big = int64_t(1) << 62;
  StridedBytes a{0, 4, {2, 2}, {big, 4}};
  StridedBytes b{8, 4, {2}, {big}};
  EXPECT_EQ(detail::views_overlap(a, b), Overlap::no);
  b.address = 4;
  EXPECT_EQ(detail::views_overlap(a, b), Overlap::yes);
}

// --- in the validator ---------------------------------------------------------------------

testing::Shape small() {
  testing::Shape s;
  s.batch = 2, s.seqlen_q = s.seqlen_k = 5, s.heads_q = s.heads_kv = 4, s.head_dim = 8;
  return s;
}

TEST(OverlapValidation, OutInterleavedWithQIsAccepted) {
  // q and out are heads 0::2 and 1::2 of one (2, 5, 8, 8) buffer.
  testing::AttentionCase c(small());
  std::vector<float> shared(2 * 5 * 8 * 8);
  for (size_t i = 0; i < shared.size(); ++i) shared[i] = float(i % 7) * 0.1f;
  const std::array<int64_t, 4> strides{5 * 8 * 8, 8 * 8, 2 * 8, 1};
  TensorView q{shared.data(), DType::f32, Device::cpu(), {2, 5, 4, 8}, strides};
  TensorView out{shared.data() + 8, DType::f32, Device::cpu(), {2, 5, 4, 8}, strides};
  Options o;
  o.backend = Backend::cpu_reference;
  EXPECT_NO_THROW(forward(q, c.k.view, c.v.view, out, o));
  out.data = shared.data() + 7;  // now the last channel of each out head is q's first
  EXPECT_THROW(forward(q, c.k.view, c.v.view, out, o), Error);
}

TEST(OverlapValidation, OutThatAliasesItselfIsRefused) {
  testing::AttentionCase c(small());
  const testing::HostBytes before = c.out.bytes;
  for (std::array<int64_t, 4> strides : {std::array<int64_t, 4>{0, 0, 0, 1},       // broadcast
                                         std::array<int64_t, 4>{160, 32, 7, 1}}) {  // heads < d apart
    TensorView out = c.out.view;
    out.strides = strides;
    Options o;
    o.backend = Backend::cpu_reference;
    try {
      forward(c.q.view, c.k.view, c.v.view, out, o);
      ADD_FAILURE() << "accepted an out that aliases itself";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("out must not overlap itself"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(c.out.bytes, before);
}

}  // namespace
}  // namespace flashtile
