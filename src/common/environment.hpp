// Several environment variables read in one pass over the environment. Backends read their
// knobs on every call (tests set them between calls), and each getenv is a pass of its own
// over every variable: host time in front of a launch that a small call waits for.
#pragma once

#include <unistd.h>  // environ

#include <array>
#include <cstddef>
#include <cstring>

namespace flashtile::detail {

// values[i] is the value of names[i], or null when it is unset. Every name starts with
// `prefix`, which is tested first, so entries of other programs cost one comparison.
template <std::size_t N>
std::array<const char*, N> environment_values(const char* prefix,
                                              const std::array<const char*, N>& names) {
  std::array<const char*, N> values{};
  const std::size_t prefix_length = std::strlen(prefix);
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const char* e = *entry;
    if (std::strncmp(e, prefix, prefix_length) != 0) continue;
    for (std::size_t i = 0; i < N; ++i) {
      const std::size_t length = std::strlen(names[i]);
      if (values[i] == nullptr && std::strncmp(e, names[i], length) == 0 && e[length] == '=') {
        values[i] = e + length + 1;
        break;
      }
    }
  }
  return values;
}

}  // namespace flashtile::detail
