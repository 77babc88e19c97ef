// libFuzzer harness for the CLI's .npy header parser: any bytes give a header whose sizes
// are consistent, or a flashtile::Error; never a crash, a sanitizer report or a hang.
#include <cstdint>
#include <string_view>

#include "npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const flashtile::cli::NpyHeader header = flashtile::cli::parse_npy_header(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.npy");
    // What read_npy relies on: the data starts inside what was parsed, and its size is the
    // product of the shape (which fits 64 bits).
    uint64_t elements = 1;
    for (int64_t dim : header.shape) {
      if (dim < 0 || __builtin_mul_overflow(elements, uint64_t(dim), &elements)) __builtin_trap();
    }
    if (header.data_offset > size) __builtin_trap();
  } catch (const flashtile::Error&) {
  }
  return 0;
}
