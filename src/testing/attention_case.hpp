// Attention cases shared by the test suites and the CLI (`check`, `bench`): random BSHD
// inputs on the host (never zeros), optional strided (non-contiguous) layouts,
// NaN-poisoned outputs, and the oracle.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "common/numeric.hpp"
#include "flashtile/flashtile.hpp"
#include "flashtile/reference.hpp"

namespace flashtile::testing {

struct Shape {
  int64_t batch = 1, seqlen_q = 1, seqlen_k = 1, heads_q = 1, heads_kv = 1, head_dim = 64;
  bool causal = false;
  DType dtype = DType::f32;
  // When set, tensors are views into larger buffers: heads are interleaved with padding
  // (as a transpose or slice would produce), so every stride differs from C order.
  bool strided = false;

  std::string describe() const {
    return "b" + std::to_string(batch) + " sq" + std::to_string(seqlen_q) + " sk" +
           std::to_string(seqlen_k) + " hq" + std::to_string(heads_q) + " hkv" +
           std::to_string(heads_kv) + " d" + std::to_string(head_dim) +
           (causal ? " causal" : "") + " " + std::string(dtype_name(dtype)) +
           (strided ? " strided" : "");
  }
};

// Host memory aligned to a cache line (64 B), as framework allocators give it: a SIMD
// backend timed on 16-byte-aligned std::vector storage would be measured at a disadvantage.
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{64}); }
  friend bool operator==(const CacheLineAllocator&, const CacheLineAllocator&) { return true; }
};
using HostBytes = std::vector<unsigned char, CacheLineAllocator<unsigned char>>;

// A host tensor: its bytes and a view of them. Strided layouts put the head dimension
// outermost inside a batch ((B, H, S, D) storage, like q.transpose(1, 2)) with row padding.
struct HostTensor {
  HostBytes bytes;
  TensorView view;

  HostTensor(DType dtype, std::array<int64_t, 4> shape, bool strided) {
    const int64_t d = shape[3];
    std::array<int64_t, 4> strides;
    int64_t elements;
    if (strided) {
      const int64_t row = d + 8;  // padded rows
      strides = {shape[2] * shape[1] * row, row, shape[1] * row, 1};
      elements = shape[0] * strides[0];
    } else {
      strides = {shape[1] * shape[2] * d, shape[2] * d, d, 1};
      elements = shape[0] * strides[0];
    }
    bytes.assign(static_cast<size_t>(elements) * dtype_size(dtype), 0);
    view = {bytes.data(), dtype, Device::cpu(), shape, strides};
  }

  int64_t index(int64_t b, int64_t s, int64_t h, int64_t c) const {
    return b * view.strides[0] + s * view.strides[1] + h * view.strides[2] + c;
  }
  void fill_random(std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    const int64_t n = static_cast<int64_t>(bytes.size() / dtype_size(view.dtype));
    for (int64_t i = 0; i < n; ++i) detail::store_from_float(view.data, view.dtype, i, dist(rng));
  }
  void poison() {  // all-ones bytes are NaN in f32, f16 and bf16
    std::fill(bytes.begin(), bytes.end(), static_cast<unsigned char>(0xFF));
  }
};

struct AttentionCase {
  Shape shape;
  HostTensor q, k, v, out;
  std::vector<float> lse;

  explicit AttentionCase(const Shape& s, uint32_t seed = 1234)
      : shape(s),
        q(s.dtype, {s.batch, s.seqlen_q, s.heads_q, s.head_dim}, s.strided),
        k(s.dtype, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim}, s.strided),
        v(s.dtype, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim}, s.strided),
        out(s.dtype, {s.batch, s.seqlen_q, s.heads_q, s.head_dim}, s.strided),
        lse(static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q)) {
    std::mt19937 rng(seed);
    q.fill_random(rng);
    k.fill_random(rng);
    v.fill_random(rng);
    poison();
  }

  void poison() {
    out.poison();
    std::fill(lse.begin(), lse.end(), std::numeric_limits<float>::quiet_NaN());
  }

  Options options(Backend backend) {
    Options o;
    o.causal = shape.causal;
    o.backend = backend;
    o.lse = lse.data();
    return o;
  }

  ReferenceResult reference(ReferencePrecision precision = ReferencePrecision::exact) const {
    Options o;
    o.causal = shape.causal;
    return reference_attention(q.view, k.view, v.view, o, precision);
  }
};

}  // namespace flashtile::testing
