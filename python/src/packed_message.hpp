// The library's messages as a caller of a packed (varlen) binding reads them; shared by the
// nanobind module (flashtile_module.cpp) and the XLA FFI handlers (jax_ffi.cpp).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace flashtile::bindings {

// The library names the dimensions of its 4-D (1, total_tokens, heads, head_dim) views and
// the fields of its Varlen struct; a packed caller passed 3-D tensors and plain keyword
// arguments, so its messages say shape[i - 1] and drop the "varlen." prefix.
inline std::string packed_message(const std::string& message) {
  std::string result;
  for (size_t i = 0; i < message.size(); ++i) {
    if (message.compare(i, 7, "varlen.") == 0) {
      i += 6;
      continue;
    }
    result += message[i];
    auto ends_with = [&](std::string_view tail) {
      return result.size() >= tail.size() &&
             result.compare(result.size() - tail.size(), tail.size(), tail) == 0;
    };
    const bool index_follows = ends_with("shape[") || ends_with("strides[");
    if (index_follows && i + 2 < message.size() && message[i + 1] >= '1' &&
        message[i + 1] <= '3' && message[i + 2] == ']') {
      result += static_cast<char>(message[i + 1] - 1);
      ++i;
    }
  }
  return result;
}

}  // namespace flashtile::bindings
