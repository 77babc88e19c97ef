// Minimal NumPy .npy reader/writer for the `run` command: C-order float32, float16,
// bfloat16 (ml_dtypes.bfloat16 saves as descr '<V2') and int32 (cu_seqlens), any rank.
// Every malformed input is reported with the file name and what was wrong.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "flashtile/flashtile.hpp"

namespace flashtile::cli {

enum class NpyType { f32, f16, bf16, i32 };

struct NpyArray {
  NpyType type = NpyType::f32;
  std::vector<int64_t> shape;
  std::vector<unsigned char> data;  // C order

  bool is_float() const { return type != NpyType::i32; }
  // The flashtile dtype of a float array (f32 for int32 arrays: check is_float first).
  DType dtype() const;
  // "float32 (2, 3)", for error messages.
  std::string describe() const;
};

// What a .npy header says: the element type, the shape, where the data starts and how
// many bytes it must have (checked against 64-bit overflow).
struct NpyHeader {
  NpyType type = NpyType::f32;
  std::vector<int64_t> shape;
  size_t data_offset = 0;
  uint64_t data_bytes = 0;
};

// Parses the magic, version and header dict at the start of `bytes` (strictly: exactly the
// keys descr, fortran_order, shape; integers only). Throws flashtile::Error naming `name`.
NpyHeader parse_npy_header(std::string_view bytes, const std::string& name);

// Throws flashtile::Error (invalid_argument) on a missing, special, truncated or malformed
// file, Fortran order, or an unsupported dtype; nothing is allocated before the header and
// the file's size agree.
NpyArray read_npy(const std::string& path);

// The bytes of a .npy file before its data: magic, version 1.0, the header dict padded to
// 64 bytes. Outputs are written through OutputFiles (output_files.hpp).
std::string npy_header(DType dtype, const std::vector<int64_t>& shape);

}  // namespace flashtile::cli
