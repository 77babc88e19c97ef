// Shapes for the backends' suites: shape_of, and the grid every backend is checked on: odd lengths (1, 17, 113, 127, 129, 1023,
// 1025), seqlen_q != seqlen_k both ways, causal or not, MHA/GQA/MQA, strided views.
#pragma once

#include <vector>

#include "testing/attention_case.hpp"

namespace flashtile::testing {

// A dense shape: batch entries, query and key lengths, query and kv heads, head dim.
inline Shape shape_of(DType dtype, int64_t batch, int64_t sq, int64_t sk, int64_t hq,
                      int64_t hkv, int64_t d) {
  Shape s;
  s.dtype = dtype;
  s.batch = batch, s.seqlen_q = sq, s.seqlen_k = sk;
  s.heads_q = hq, s.heads_kv = hkv, s.head_dim = d;
  return s;
}

inline std::vector<Shape> backend_grid(const std::vector<int64_t>& head_dims, DType dtype,
                                       bool large) {
  struct Lengths {
    int64_t q, k;
  };
  std::vector<Lengths> lengths = {{1, 1},   {17, 17}, {113, 127}, {129, 113},
                                  {1, 129}, {127, 1}, {128, 129}};
  if (large) lengths.insert(lengths.end(), {{1023, 1025}, {1025, 1023}});
  std::vector<Shape> grid;
  int variant = 0;
  for (int64_t d : head_dims)
    for (const auto& len : lengths)
      for (bool causal : {false, true}) {
        Shape s;
        s.seqlen_q = len.q;
        s.seqlen_k = len.k;
        s.head_dim = d;
        s.causal = causal;
        s.dtype = dtype;
        // Rotate through batch/heads layouts and strides so each combination meets them.
        switch (variant++ % 4) {
          case 0: s.batch = 1, s.heads_q = 1, s.heads_kv = 1; break;
          case 1: s.batch = 2, s.heads_q = 4, s.heads_kv = 2, s.strided = true; break;  // GQA
          case 2: s.batch = 3, s.heads_q = 3, s.heads_kv = 1; break;                    // MQA
          case 3: s.batch = 1, s.heads_q = 2, s.heads_kv = 2, s.strided = true; break;  // MHA
        }
        grid.push_back(s);
      }
  return grid;
}

// The packed varlen batches the GPU suites run: empty sequences (no queries, no keys),
// length-1 sequences, sq != sk per sequence, seqused_k (`used`, empty for none).
struct VarlenBatch {
  std::vector<int64_t> q, k, used;
};
inline const std::vector<VarlenBatch>& varlen_batches() {
  static const std::vector<VarlenBatch> batches = {
      {{1, 1, 1}, {1, 1, 1}, {}},
      {{0, 5, 130, 1, 64}, {7, 0, 129, 1, 300}, {}},
      {{33, 0, 200, 17}, {60, 12, 150, 17}, {41, 0, 150, 3}},
      {{128, 257, 2}, {128, 257, 2}, {128, 100, 0}},
  };
  return batches;
}

}  // namespace flashtile::testing
