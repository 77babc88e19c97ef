#include "npy.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
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

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + (shape.size() == 1 ? ",)" : ")");
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
  return (is_float() ? std::string(dtype_name(dtype())) : "int32") + " " + shape_string(shape);
}

namespace {

// A strict reader of the header's Python dict literal, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// Exactly the three keys, each once; a trailing comma is allowed; nothing but spaces and
// the final newline may follow.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& name) : text_(text), name_(name) {}

  void parse(std::string& descr, bool& fortran, std::vector<int64_t>& shape) {
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = quoted();
      expect(':');
      if (key == "descr" && !seen_descr) {
        descr = quoted();
        seen_descr = true;
      } else if (key == "fortran_order" && !seen_fortran) {
        fortran = boolean();
        seen_fortran = true;
      } else if (key == "shape" && !seen_shape) {
        shape = tuple();
        seen_shape = true;
      } else {
        fail("unexpected or repeated key '" + key + "' in the header");
      }
      skip_space();
      if (peek() == ',') {
        ++at_;
      } else if (peek() != '}') {
        fail("expected ',' or '}' in the header at byte " + std::to_string(at_));
      }
    }
    ++at_;  // '}'
    for (; at_ < text_.size(); ++at_)
      if (text_[at_] != ' ' && text_[at_] != '\n') fail("trailing characters after the header dict");
    if (!seen_descr || !seen_fortran || !seen_shape)
      fail(std::string("header has no '") + (!seen_descr ? "descr" : !seen_fortran ? "fortran_order" : "shape") + "'");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { bad(name_, what); }
  char peek() const { return at_ < text_.size() ? text_[at_] : '\0'; }
  void skip_space() {
    while (peek() == ' ') ++at_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c)
      fail(std::string("expected '") + c + "' in the header at byte " + std::to_string(at_));
    ++at_;
  }
  std::string quoted() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a quoted string in the header at byte " + std::to_string(at_));
    const size_t end = text_.find(quote, at_ + 1);
    if (end == std::string_view::npos) fail("unterminated string in the header");
    std::string value(text_.substr(at_ + 1, end - at_ - 1));
    at_ = end + 1;
    return value;
  }
  bool boolean() {
    skip_space();
    for (auto [word, value] : {std::pair{"True", true}, std::pair{"False", false}})
      if (text_.substr(at_, std::strlen(word)) == word) {
        at_ += std::strlen(word);
        return value;
      }
    fail("fortran_order must be True or False");
  }
  std::vector<int64_t> tuple() {
    expect('(');
    std::vector<int64_t> dims;
    bool comma_after_last = false;
    while (true) {
      skip_space();
      if (peek() == ')') break;
      const size_t start = at_;
      int64_t value = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (__builtin_mul_overflow(value, 10, &value) ||
            __builtin_add_overflow(value, peek() - '0', &value))
          fail("shape entry starting '" + std::string(text_.substr(start, 24)) + "' is too large");
        ++at_;
      }
      if (at_ == start)
        fail("malformed shape entry at byte " + std::to_string(start) +
             " (expected a non-negative integer)");
      dims.push_back(value);
      comma_after_last = false;
      skip_space();
      if (peek() == ',') {
        ++at_;
        comma_after_last = true;
      } else if (peek() != ')') {
        fail("malformed shape entry '" + std::string(text_.substr(start, at_ - start + 1)) + "'");
      }
    }
    ++at_;
    if (dims.size() == 1 && !comma_after_last) fail("a one-dimensional shape is written (n,)");
    return dims;
  }

  std::string_view text_;
  const std::string& name_;
  size_t at_ = 0;
};

}  // namespace

NpyHeader parse_npy_header(std::string_view bytes, const std::string& name) {
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0)
    bad(name, "not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t prefix = 0;
  uint32_t header_len = 0;
  auto byte = [&](size_t i) { return uint32_t(static_cast<unsigned char>(bytes[i])); };
  if (major == 1) {
    prefix = 10;
    header_len = byte(8) | (byte(9) << 8);
  } else if (major == 2 || major == 3) {
    prefix = 12;
    if (bytes.size() < 12) bad(name, "truncated header");
    header_len = byte(8) | (byte(9) << 8) | (byte(10) << 16) | (byte(11) << 24);
  } else {
    bad(name, "unsupported .npy version " + std::to_string(major));
  }
  if (header_len > (1u << 20)) bad(name, "header length " + std::to_string(header_len) + " too large");
  if (bytes.size() < prefix + header_len) bad(name, "truncated header");

  std::string descr;
  bool fortran = false;
  NpyHeader header;
  HeaderParser(bytes.substr(prefix, header_len), name).parse(descr, fortran, header.shape);
  if (fortran) bad(name, "Fortran-order arrays are not supported (save a C-order array)");
  if (descr == "<f4") {
    header.type = NpyType::f32;
  } else if (descr == "<f2") {
    header.type = NpyType::f16;
  } else if (descr == "<V2" || descr == "|V2") {
    header.type = NpyType::bf16;  // ml_dtypes.bfloat16
  } else if (descr == "<i4") {
    header.type = NpyType::i32;
  } else {
    bad(name, "dtype '" + descr +
                  "' is not supported (expected float32 '<f4', float16 '<f2', "
                  "ml_dtypes.bfloat16 '<V2' or int32 '<i4')" +
                  (descr == "<i8" ? "; save int64 offsets with .astype(np.int32)" : ""));
  }
  uint64_t bytes_needed = element_size(header.type);
  for (int64_t dim : header.shape)
    if (__builtin_mul_overflow(bytes_needed, uint64_t(dim), &bytes_needed))
      bad(name, "shape " + shape_string(header.shape) + " is too large (its size overflows 64 bits)");
  header.data_offset = prefix + header_len;
  header.data_bytes = bytes_needed;
  return header;
}

NpyArray read_npy(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    bad(path, std::filesystem::exists(path, ec) ? "is not a regular file" : "cannot open file (missing)");
  const uintmax_t file_bytes = std::filesystem::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (!in || ec) bad(path, "cannot open file (unreadable)");
  // The header is at most 12 + 2^20 bytes; read what the file has of it.
  std::string start(static_cast<size_t>(std::min<uintmax_t>(file_bytes, 12 + (1u << 20))), '\0');
  if (!in.read(start.data(), static_cast<std::streamsize>(start.size()))) bad(path, "read failed");
  const NpyHeader header = parse_npy_header(start, path);
  const uint64_t data_in_file = file_bytes - header.data_offset;
  if (data_in_file < header.data_bytes)
    bad(path, "truncated data: the shape " + shape_string(header.shape) + " needs " +
                  std::to_string(header.data_bytes) + " bytes, the file has " + std::to_string(data_in_file));
  if (data_in_file > header.data_bytes)
    bad(path, "trailing bytes after the data (file does not match its header)");
  NpyArray array;
  array.type = header.type;
  array.shape = header.shape;
  array.data.resize(static_cast<size_t>(header.data_bytes));
  in.seekg(static_cast<std::streamoff>(header.data_offset));
  if (!in.read(reinterpret_cast<char*>(array.data.data()), static_cast<std::streamsize>(header.data_bytes)))
    bad(path, "read failed");
  return array;
}

std::string npy_header(DType dtype, const std::vector<int64_t>& shape) {
  std::string header = "{'descr': '" + descr_of(dtype) + "', 'fortran_order': False, 'shape': " +
                       shape_string(shape) + ", }";
  // Pad so that magic + length + header is a multiple of 64, ending with a newline.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char prefix[10] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<char>(len & 0xFF),
                           static_cast<char>(len >> 8)};
  return std::string(prefix, 10) + header;
}

}  // namespace flashtile::cli
