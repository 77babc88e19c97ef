// Minimal NumPy .npy reader/writer for the `run` command: C-order float32, float16,
// bfloat16 (ml_dtypes.bfloat16 saves as descr '<V2') and int32 (cu_seqlens), any rank.
// Every malformed input is reported with the file name and what was wrong.
#pragma once

#include <cstdint>
#include <string>
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

// Throws flashtile::Error (invalid_argument) on a missing, truncated or malformed file,
// Fortran order, or an unsupported dtype.
NpyArray read_npy(const std::string& path);

// Output files are written in two steps so that a failure never leaves a partial file:
// the whole array goes to a temporary file beside `path`, which `commit_npy` renames into
// place (or `discard_npy` removes) once every output of the command has been written.
std::string write_npy_temp(const std::string& path, DType dtype, const std::vector<int64_t>& shape,
                           const void* data);
void commit_npy(const std::string& temp, const std::string& path);
void discard_npy(const std::string& temp);

}  // namespace flashtile::cli
