#include "npy.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace flashtile::cli {
namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::invalid_argument, path + ": " + what);
}

std::string descr_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return "<f4";
    case DType::f16: return "<f2";
    case DType::bf16: return "<V2";
  }
  return "";
}

size_t element_size(NpyType type) {
  return type == NpyType::f16 || type == NpyType::bf16 ? 2 : 4;
}

}  // namespace

DType NpyArray::dtype() const {
  switch (type) {
    case NpyType::f16: return DType::f16;
    case NpyType::bf16: return DType::bf16;
    default: return DType::f32;
  }
}

std::string NpyArray::describe() const {
  std::string text = is_float() ? std::string(dtype_name(dtype())) : "int32";
  text += " (";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) bad(path, "cannot open file (missing or unreadable)");
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    bad(path, "not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t header_len = 0;
  if (major == 1) {
    unsigned char len[2];
    if (!in.read(reinterpret_cast<char*>(len), 2)) bad(path, "truncated header");
    header_len = len[0] | (len[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char len[4];
    if (!in.read(reinterpret_cast<char*>(len), 4)) bad(path, "truncated header");
    header_len = len[0] | (len[1] << 8) | (len[2] << 16) | (uint32_t(len[3]) << 24);
  } else {
    bad(path, "unsupported .npy version " + std::to_string(major));
  }
  if (header_len > (1u << 20)) bad(path, "header length " + std::to_string(header_len) + " too large");
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) bad(path, "truncated header");

  std::smatch m;
  if (!std::regex_search(header, m, std::regex(R"('descr'\s*:\s*'([^']*)')")))
    bad(path, "header has no 'descr'");
  const std::string descr = m[1];
  if (!std::regex_search(header, m, std::regex(R"('fortran_order'\s*:\s*(True|False))")))
    bad(path, "header has no 'fortran_order'");
  if (m[1] == "True") bad(path, "Fortran-order arrays are not supported (save a C-order array)");
  if (!std::regex_search(header, m, std::regex(R"('shape'\s*:\s*\(([^)]*)\))")))
    bad(path, "header has no 'shape'");

  NpyArray array;
  if (descr == "<f4") {
    array.type = NpyType::f32;
  } else if (descr == "<f2") {
    array.type = NpyType::f16;
  } else if (descr == "<V2" || descr == "|V2") {
    array.type = NpyType::bf16;  // ml_dtypes.bfloat16
  } else if (descr == "<i4") {
    array.type = NpyType::i32;
  } else {
    bad(path, "dtype '" + descr +
                  "' is not supported (expected float32 '<f4', float16 '<f2', "
                  "ml_dtypes.bfloat16 '<V2' or int32 '<i4')" +
                  (descr == "<i8" ? "; save int64 offsets with .astype(np.int32)" : ""));
  }
  std::stringstream dims(m[1].str());
  std::string item;
  int64_t elements = 1;
  while (std::getline(dims, item, ',')) {
    if (item.find_first_not_of(" \t") == std::string::npos) continue;
    try {
      const long long value = std::stoll(item);
      if (value < 0) throw std::invalid_argument("negative");
      array.shape.push_back(value);
      elements *= value;
    } catch (const std::exception&) {
      bad(path, "malformed shape entry '" + item + "'");
    }
  }
  const size_t bytes = static_cast<size_t>(elements) * element_size(array.type);
  array.data.resize(bytes);
  if (!in.read(reinterpret_cast<char*>(array.data.data()), static_cast<std::streamsize>(bytes)))
    bad(path, "truncated data: expected " + std::to_string(bytes) + " bytes for the shape");
  if (in.peek() != std::char_traits<char>::eof())
    bad(path, "trailing bytes after the data (file does not match its header)");
  return array;
}

std::string write_npy_temp(const std::string& path, DType dtype, const std::vector<int64_t>& shape,
                           const void* data) {
  // Python tuple syntax: "(n,)" for one dimension, "(a, b, c)" otherwise.
  std::string shape_text = "(";
  int64_t elements = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    shape_text += (i ? ", " : "") + std::to_string(shape[i]);
    elements *= shape[i];
  }
  shape_text += shape.size() == 1 ? ",)" : ")";
  std::string header = "{'descr': '" + descr_of(dtype) + "', 'fortran_order': False, 'shape': " +
                       shape_text + ", }";
  // Pad so that magic + length + header is a multiple of 64, ending with a newline.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';

  const std::filesystem::path target(path);
  const std::filesystem::path temp = target.string() + ".tmp-flashtile";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(ErrorKind::runtime, path + ": cannot open for writing");
    const uint16_t len = static_cast<uint16_t>(header.size());
    const char prefix[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
    out.write(prefix, 8);
    const char len_bytes[2] = {static_cast<char>(len & 0xFF), static_cast<char>(len >> 8)};
    out.write(len_bytes, 2);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(static_cast<const char*>(data),
              static_cast<std::streamsize>(elements * dtype_size(dtype)));
    out.flush();
    if (!out) {
      out.close();
      std::filesystem::remove(temp);
      throw Error(ErrorKind::runtime, path + ": write failed");
    }
  }
  return temp.string();
}

void commit_npy(const std::string& temp, const std::string& path) {
  std::error_code ec;
  std::filesystem::rename(temp, path, ec);
  if (ec) {
    std::filesystem::remove(temp);
    throw Error(ErrorKind::runtime, path + ": cannot move the output into place: " + ec.message());
  }
}

void discard_npy(const std::string& temp) {
  std::error_code ec;
  std::filesystem::remove(temp, ec);
}

}  // namespace flashtile::cli
