// Attention cases shared by the test suites and the CLI (`check`, `bench`): random BSHD
// inputs on the host (never zeros), optional strided (non-contiguous) layouts, every
// variant (window, softcap, ALiBi, sinks) and packed varlen batches, NaN-poisoned outputs,
// and the oracle.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <new>
#include <numeric>
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

  // The variant.
  Window window;
  float softcap = 0.0f;
  bool alibi = false;            // random slopes, shaped (heads_q)...
  bool alibi_per_batch = false;  // ... or (batch, heads_q)
  bool sinks = false;            // random sink logits, (heads_q)

  // A packed varlen batch when non-empty: sequence b has varlen_q[b] queries and
  // varlen_k[b] keys (batch, seqlen_q and seqlen_k are then derived); seqused_k, when
  // non-empty, is passed as Varlen::seqused_k.
  std::vector<int64_t> varlen_q, varlen_k, seqused_k;

  bool is_varlen() const { return !varlen_q.empty(); }
  int64_t sequences() const { return is_varlen() ? int64_t(varlen_q.size()) : batch; }
  int64_t total_q() const { return std::accumulate(varlen_q.begin(), varlen_q.end(), int64_t(0)); }
  int64_t total_k() const { return std::accumulate(varlen_k.begin(), varlen_k.end(), int64_t(0)); }
  // The 4-D shapes of q and of k/v ((1, total, heads, d) for varlen).
  std::array<int64_t, 4> q_shape() const {
    return is_varlen() ? std::array<int64_t, 4>{1, total_q(), heads_q, head_dim}
                       : std::array<int64_t, 4>{batch, seqlen_q, heads_q, head_dim};
  }
  std::array<int64_t, 4> kv_shape() const {
    return is_varlen() ? std::array<int64_t, 4>{1, total_k(), heads_kv, head_dim}
                       : std::array<int64_t, 4>{batch, seqlen_k, heads_kv, head_dim};
  }
  bool has_variant() const {
    return window.bounded() || softcap != 0.0f || alibi || sinks || is_varlen();
  }

  std::string describe() const {
    std::string s;
    if (is_varlen()) {
      s = "varlen[";
      for (size_t b = 0; b < varlen_q.size(); ++b)
        s += (b ? " " : "") + std::to_string(varlen_q[b]) + "/" + std::to_string(varlen_k[b]) +
             (seqused_k.empty() ? "" : "(" + std::to_string(seqused_k[b]) + ")");
      s += "]";
    } else {
      s = "b" + std::to_string(batch) + " sq" + std::to_string(seqlen_q) + " sk" +
          std::to_string(seqlen_k);
    }
    s += " hq" + std::to_string(heads_q) + " hkv" + std::to_string(heads_kv) + " d" +
         std::to_string(head_dim) + (causal ? " causal" : "");
    if (window.bounded())
      s += " window(" + std::to_string(window.left) + "," + std::to_string(window.right) + ")";
    if (softcap != 0.0f) {
      char text[32];
      std::snprintf(text, sizeof text, " softcap%g", softcap);  // shortest form: 30, 0.3
      s += text;
    }
    if (alibi) s += alibi_per_batch ? " alibi(b,h)" : " alibi";
    if (sinks) s += " sinks";
    return s + " " + std::string(dtype_name(dtype)) + (strided ? " strided" : "");
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
    for (int64_t extent : shape)
      if (extent <= 0) throw_size_error(shape, "every dimension must be positive");
    const int64_t d = shape[3];
    const int64_t row = strided ? d + 8 : d;  // strided: padded rows, heads outermost
    const std::array<int64_t, 4> order = strided ? std::array<int64_t, 4>{0, 2, 1, 3}
                                                 : std::array<int64_t, 4>{0, 1, 2, 3};
    std::array<int64_t, 4> strides{};
    int64_t elements = 1;
    __int128 wide = 1;
    for (int i = 3; i >= 0; --i) {  // innermost first, in storage order
      strides[order[i]] = elements;
      wide *= i == 3 ? row : shape[order[i]];
      if (wide > INT64_MAX / 8) throw_size_error(shape, "its size overflows 64 bits");
      elements = static_cast<int64_t>(wide);
    }
    const uint64_t needed = uint64_t(elements) * dtype_size(dtype);
    if (const uint64_t memory = host_memory_bytes(); memory > 0 && needed > memory)
      throw_size_error(shape, "it needs " + std::to_string(needed) +
                                  " bytes of host memory and this machine has " +
                                  std::to_string(memory));
    bytes.assign(static_cast<size_t>(needed), 0);
    view = {bytes.data(), dtype, Device::cpu(), shape, strides};
  }
  static uint64_t host_memory_bytes() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
  }
  [[noreturn]] static void throw_size_error(const std::array<int64_t, 4>& shape, const std::string& why) {
    throw Error(ErrorKind::invalid_argument,
                "cannot allocate a tensor of shape (" + std::to_string(shape[0]) + ", " +
                    std::to_string(shape[1]) + ", " + std::to_string(shape[2]) + ", " +
                    std::to_string(shape[3]) + "): " + why);
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

// Cumulative offsets [0, n0, n0+n1, ...] as int32 (the varlen convention).
inline std::vector<int32_t> cumulative(const std::vector<int64_t>& lengths) {
  std::vector<int32_t> cu(lengths.size() + 1, 0);
  for (size_t b = 0; b < lengths.size(); ++b) cu[b + 1] = cu[b] + static_cast<int32_t>(lengths[b]);
  return cu;
}

struct AttentionCase {
  Shape shape;
  HostTensor q, k, v, out;
  std::vector<float> lse;
  std::vector<float> alibi_slopes, sinks;       // empty when the variant has none
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k, seqused_k;  // varlen only

  explicit AttentionCase(const Shape& s, uint32_t seed = 1234)
      : shape(normalised(s)),
        q(s.dtype, shape.q_shape(), s.strided),
        k(s.dtype, shape.kv_shape(), s.strided),
        v(s.dtype, shape.kv_shape(), s.strided),
        out(s.dtype, shape.q_shape(), s.strided),
        lse(static_cast<size_t>(shape.q_shape()[0] * shape.q_shape()[1] * s.heads_q)) {
    std::mt19937 rng(seed);
    q.fill_random(rng);
    k.fill_random(rng);
    v.fill_random(rng);
    if (shape.alibi) {
      // Positive slopes of the size ALiBi uses (2^-8h/H) and larger, so the bias matters.
      std::uniform_real_distribution<float> slope(0.01f, 0.5f);
      alibi_slopes.resize(static_cast<size_t>((shape.alibi_per_batch ? shape.batch : 1) * s.heads_q));
      for (float& x : alibi_slopes) x = slope(rng);
    }
    if (shape.sinks) {
      std::uniform_real_distribution<float> sink(-2.0f, 2.0f);
      sinks.resize(static_cast<size_t>(s.heads_q));
      for (float& x : sinks) x = sink(rng);
    }
    if (shape.is_varlen()) {
      cu_seqlens_q = cumulative(shape.varlen_q);
      cu_seqlens_k = cumulative(shape.varlen_k);
      for (int64_t used : shape.seqused_k) seqused_k.push_back(static_cast<int32_t>(used));
    }
    poison();
  }

  void poison() {
    out.poison();
    std::fill(lse.begin(), lse.end(), std::numeric_limits<float>::quiet_NaN());
  }

  // The options of this case (variant included) on the host, without lse.
  Options reference_options(std::optional<float> scale = std::nullopt) const {
    return options_with(alibi_slopes.data(), sinks.data(), Device::cpu(), scale);
  }
  Options options(Backend backend) {
    Options o = reference_options();
    o.backend = backend;
    o.lse = lse.data();
    return o;
  }
  // The varlen description over host arrays (nullopt for dense cases).
  std::optional<Varlen> varlen() const {
    return varlen_with(cu_seqlens_q.data(), cu_seqlens_k.data(),
                       seqused_k.empty() ? nullptr : seqused_k.data());
  }

  ReferenceResult reference(ReferencePrecision precision = ReferencePrecision::exact) const {
    const std::optional<Varlen> vl = varlen();
    const Options o = reference_options();
    return vl ? reference_attention_varlen(q.view, k.view, v.view, *vl, o, precision)
              : reference_attention(q.view, k.view, v.view, o, precision);
  }

  // Options pointing at copies of the slopes and sinks (host or device).
  Options options_with(const float* slopes, const float* sinks_data, Device device,
                       std::optional<float> scale = std::nullopt) const {
    Options o;
    o.scale = scale;
    o.causal = shape.causal;
    o.window = shape.window;
    o.softcap = shape.softcap;
    if (shape.alibi)
      o.alibi_slopes = shape.alibi_per_batch
                           ? ParamView::matrix(slopes, device, shape.sequences(), shape.heads_q)
                           : ParamView::vector(slopes, device, shape.heads_q);
    if (shape.sinks) o.sinks = ParamView::vector(sinks_data, device, shape.heads_q);
    return o;
  }
  std::optional<Varlen> varlen_with(const int32_t* cu_q, const int32_t* cu_k,
                                    const int32_t* used) const {
    if (!shape.is_varlen()) return std::nullopt;
    Varlen vl;
    vl.cu_seqlens_q = cu_q;
    vl.cu_seqlens_k = cu_k;
    vl.seqused_k = used;
    vl.batch = shape.sequences();
    return vl;
  }

 private:
  // Derives the dense fields of a varlen shape (batch = sequences, longest lengths).
  static Shape normalised(Shape s) {
    if (s.is_varlen()) {
      s.batch = int64_t(s.varlen_q.size());
      s.seqlen_q = s.seqlen_k = 0;
      for (size_t b = 0; b < s.varlen_q.size(); ++b) {
        s.seqlen_q = std::max(s.seqlen_q, s.varlen_q[b]);
        s.seqlen_k = std::max(s.seqlen_k, s.seqused_k.empty() ? s.varlen_k[b] : s.seqused_k[b]);
      }
    }
    return s;
  }
};

// Runs forward or forward_varlen, whichever the call is.
inline void run_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const Options& options,
                        const std::optional<Varlen>& varlen) {
  if (varlen)
    forward_varlen(q, k, v, out, *varlen, options);
  else
    forward(q, k, v, out, options);
}

inline Plan plan_call(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& out, const Options& options,
                      const std::optional<Varlen>& varlen) {
  return varlen ? plan_varlen(q, k, v, out, *varlen, options) : plan(q, k, v, out, options);
}

}  // namespace flashtile::testing
