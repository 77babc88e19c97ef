// Strict parsing of the CLI's variant flags (--window, --softcap, --sinks, --varlen). Each
// parser consumes its whole text or throws flashtile::Error (invalid_argument) naming the
// flag, what it expects and what it got; nothing runs after such an error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flashtile/flashtile.hpp"

namespace flashtile::cli {

// "L,R": two integers >= -1 (-1 = that side unbounded).
Window parse_window(const std::string& text, const std::string& flag = "--window");

// A positive finite number (the c of c*tanh(S/c)).
float parse_softcap(const std::string& text, const std::string& flag = "--softcap");

// bench's --sinks: "random" (the case's seeded random logits) or one finite number that
// every head's sink logit takes.
struct SinkSpec {
  std::optional<float> value;  // nullopt: random
};
SinkSpec parse_sinks(const std::string& text, const std::string& flag = "--sinks");

// bench's --varlen: the per-sequence lengths of a packed batch.
//   "N1,N2,..."           each sequence has Ni queries and Ni keys (0 = an empty sequence);
//   an entry "Q/K"        gives that sequence Q queries and K keys;
//   "random:MIN-MAX:TOTAL" lengths drawn uniformly in [MIN, MAX] (fixed seed) until the
//                         batch holds TOTAL tokens, the last one shortened to end there.
struct VarlenLengths {
  std::vector<int64_t> q, k;
};
VarlenLengths parse_varlen(const std::string& text, const std::string& flag = "--varlen",
                           uint32_t seed = 1234);

// The standard ALiBi slopes of `heads` heads (Press et al., as BLOOM and MPT build them):
// 2^(-8(h+1)/H) for H a power of two; otherwise those of the largest power of two n < H,
// followed by every other slope of 2n heads (2^(-4(2m+1)/n), m = 0 .. H-n-1).
std::vector<float> standard_alibi_slopes(int64_t heads);

}  // namespace flashtile::cli
