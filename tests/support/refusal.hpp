// A call the library must refuse: the error's kind and message, and `out` left as it was
// (filled with 0xFF before the call and read back after).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "flashtile/flashtile.hpp"
#include "support/device_case.hpp"

namespace flashtile::testing {

inline void expect_refused(const TensorView& q, const TensorView& k, const TensorView& v,
                           DeviceTensor& out, Backend backend, ErrorKind kind,
                           const std::string& message_part) {
  out.buffer.fill_bytes(0xFF);
  Options o;
  o.backend = backend;
  try {
    forward(q, k, v, out.view, o);
    ADD_FAILURE() << backend_name(backend) << " accepted: " << message_part;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(message_part), std::string::npos) << e.what();
  }
  std::vector<unsigned char> bytes(out.buffer.bytes());
  out.buffer.copy_to_host(bytes.data(), bytes.size());
  for (unsigned char byte : bytes) ASSERT_EQ(byte, 0xFF) << "out was written on error";
}

}  // namespace flashtile::testing
