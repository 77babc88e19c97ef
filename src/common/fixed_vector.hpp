// A vector of at most N elements held in place. The validator builds a handful of small
// lists on every call, and a call as small as the write-up's (about 20 us) waits for each
// heap allocation in front of its launch.
#pragma once

#include <array>
#include <cstddef>
#include <initializer_list>
#include <stdexcept>

namespace flashtile::detail {

template <class T, std::size_t N>
class FixedVector {
 public:
  FixedVector() = default;
  FixedVector(std::initializer_list<T> values) {
    for (const T& v : values) push_back(v);
  }
  template <class It>
  FixedVector(It first, It last) {
    for (; first != last; ++first) push_back(*first);
  }

  void push_back(const T& v) {
    if (size_ == N) throw std::length_error("FixedVector: more than its capacity");
    items_[size_++] = v;
  }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](std::size_t i) { return items_[i]; }
  const T& operator[](std::size_t i) const { return items_[i]; }
  T* begin() { return items_.data(); }
  T* end() { return items_.data() + size_; }
  const T* begin() const { return items_.data(); }
  const T* end() const { return items_.data() + size_; }

 private:
  std::array<T, N> items_{};
  std::size_t size_ = 0;
};

}  // namespace flashtile::detail
