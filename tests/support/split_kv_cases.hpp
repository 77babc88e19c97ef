// Split-KV cases for the 16-bit tensor-core suites (cuda_mma, cuda_sm90): calls a pinned
// split count cuts into uneven shares of key blocks, some of them empty (few keys, many
// splits): lengths around the tiles, sq != sk both ways with causal masks (rows that see no
// key), GQA/MQA, strides, and, where the backend serves them, the variants (the combine
// applies the NaN rule and the sink to the whole row).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "support/backend_grid.hpp"
#include "support/device_case.hpp"
#include "support/refusal.hpp"
#include "support/scoped_env.hpp"
#include "support/variants.hpp"

namespace flashtile::testing {

inline std::vector<Shape> split_kv_shapes(DType dtype, const std::vector<int64_t>& head_dims,
                                          bool with_variants) {
  struct Lengths {
    int64_t q, k;
  };
  const Lengths lengths[] = {{1, 1}, {17, 300}, {300, 17}, {129, 1025}, {64, 2049}};
  std::vector<Variant> variants = {{"full", {}}, {"causal", {}, true}};
  if (with_variants) {
    variants.push_back({"window", {100, 0}});
    variants.push_back({"causal + sinks", {}, true, 0, false, false, true});
    variants.push_back({"softcap + ALiBi", {}, false, 20.0f, true});
    variants.push_back({"everything", {64, 0}, false, 12.0f, true, true, true});
  }
  // Each (head dim, lengths) pair takes the next two variants in turn, and the next layout.
  std::vector<Shape> shapes;
  size_t rotate = 0;
  for (int64_t d : head_dims)
    for (const Lengths& len : lengths)
      for (int i = 0; i < 2; ++i, ++rotate) {
        Shape s = with_variant(shape_of(dtype, 1, len.q, len.k, 1, 1, d),
                               variants[rotate % variants.size()]);
        switch (rotate % 3) {
          case 0: break;                                                   // one head
          case 1: s.heads_q = 4, s.heads_kv = 2, s.strided = true; break;  // GQA
          case 2: s.batch = 2, s.heads_q = 2, s.heads_kv = 1; break;       // MQA
        }
        shapes.push_back(s);
      }
  return shapes;
}

// A split count pinned out of range through `variable` is refused before anything runs.
inline void expect_bad_split_pins_refused(Backend backend, const char* variable) {
  for (const char* bad : {"0", "17", "two"}) {
    const ScopedEnv pinned(variable, bad);
    AttentionCase c(shape_of(DType::bf16, 1, 17, 17, 1, 1, 64));
    DeviceCase d(c);
    expect_refused(d.q.view, d.k.view, d.v.view, d.out, backend, ErrorKind::invalid_argument,
                   std::string(variable) + " must be an integer from 1 to 16");
  }
}

}  // namespace flashtile::testing
