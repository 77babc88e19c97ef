#include "flags.hpp"

#include <charconv>
#include <cmath>
#include <limits>
#include <random>

namespace flashtile::cli {
namespace {

[[noreturn]] void bad_flag(const std::string& flag, const std::string& expected,
                           const std::string& text) {
  throw Error(ErrorKind::invalid_argument, flag + " must be " + expected + ", got '" + text + "'");
}

// The whole of `text` as an integer, or nullopt.
std::optional<int64_t> whole_int(const std::string& text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  return value;
}

// The whole of `text` as a finite float, or nullopt.
std::optional<float> whole_finite_float(const std::string& text) {
  float value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty() || !std::isfinite(value))
    return std::nullopt;
  return value;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t at = text.find(separator, start);
    parts.push_back(text.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return parts;
    start = at + 1;
  }
}

constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();  // cu_seqlens are int32

}  // namespace

Window parse_window(const std::string& text, const std::string& flag) {
  const std::string expected =
      "L,R: two integers >= -1 (keys left and right of the diagonal; -1 = unbounded), e.g. " +
      flag + " 128,0";
  const std::vector<std::string> parts = split(text, ',');
  if (parts.size() != 2) bad_flag(flag, expected, text);
  const std::optional<int64_t> left = whole_int(parts[0]), right = whole_int(parts[1]);
  if (!left || !right || *left < -1 || *right < -1) bad_flag(flag, expected, text);
  return Window{*left, *right};
}

float parse_softcap(const std::string& text, const std::string& flag) {
  const std::optional<float> value = whole_finite_float(text);
  if (!value || *value <= 0)
    bad_flag(flag, "a positive finite number (the cap c of c*tanh(S/c); leave the flag out for none)",
             text);
  return *value;
}

SinkSpec parse_sinks(const std::string& text, const std::string& flag) {
  if (text == "random") return {};
  const std::optional<float> value = whole_finite_float(text);
  if (!value) bad_flag(flag, "'random' or a finite number (every head's sink logit)", text);
  return {*value};
}

VarlenLengths parse_varlen(const std::string& text, const std::string& flag, uint32_t seed) {
  const std::string expected =
      "a list of sequence lengths N1,N2,... (an entry Q/K gives Q queries and K keys) or "
      "random:MIN-MAX:TOTAL";
  VarlenLengths lengths;
  const std::string random_prefix = "random:";
  if (text.rfind(random_prefix, 0) == 0) {
    const std::vector<std::string> parts = split(text.substr(random_prefix.size()), ':');
    if (parts.size() != 2) bad_flag(flag, expected, text);
    const std::vector<std::string> range = split(parts[0], '-');
    if (range.size() != 2) bad_flag(flag, expected, text);
    const std::optional<int64_t> lo = whole_int(range[0]), hi = whole_int(range[1]),
                                 total = whole_int(parts[1]);
    if (!lo || !hi || !total) bad_flag(flag, expected, text);
    if (*lo < 1 || *hi < *lo)
      bad_flag(flag, "random:MIN-MAX:TOTAL with 1 <= MIN <= MAX", text);
    if (*total < 1 || *total > kMaxTokens)
      bad_flag(flag, "random:MIN-MAX:TOTAL with 1 <= TOTAL < 2^31", text);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int64_t> length(*lo, *hi);
    for (int64_t sum = 0; sum < *total;) {
      const int64_t n = std::min(length(rng), *total - sum);
      lengths.q.push_back(n);
      sum += n;
    }
    lengths.k = lengths.q;
    return lengths;
  }
  int64_t total_q = 0, total_k = 0;
  for (const std::string& entry : split(text, ',')) {
    const std::vector<std::string> pair = split(entry, '/');
    if (pair.size() > 2) bad_flag(flag, expected, text);
    const std::optional<int64_t> q = whole_int(pair[0]);
    const std::optional<int64_t> k = pair.size() == 2 ? whole_int(pair[1]) : q;
    if (!q || !k) bad_flag(flag, expected, text);
    if (*q < 0 || *k < 0) bad_flag(flag, "a list of sequence lengths >= 0", text);
    total_q += *q;
    total_k += *k;
    if (total_q > kMaxTokens || total_k > kMaxTokens)
      bad_flag(flag, "sequence lengths whose total stays below 2^31 (int32 cu_seqlens)", text);
    lengths.q.push_back(*q);
    lengths.k.push_back(*k);
  }
  if (total_q == 0) bad_flag(flag, "a batch with at least one query", text);
  return lengths;
}

std::vector<float> standard_alibi_slopes(int64_t heads) {
  int64_t n = 1;  // the largest power of two <= heads
  while (n * 2 <= heads) n *= 2;
  std::vector<float> slopes;
  for (int64_t h = 0; h < n; ++h) slopes.push_back(float(std::exp2(-8.0 * double(h + 1) / double(n))));
  for (int64_t m = 0; n + m < heads; ++m)
    slopes.push_back(float(std::exp2(-4.0 * double(2 * m + 1) / double(n))));
  return slopes;
}

}  // namespace flashtile::cli
