// Every bad input of backward() is refused on the host, case by case, with a message naming
// the argument, and no gradient (dq, dk, dv, dsinks) is written. Then what plan_backward
// reports, and the refusal of backends without a backward pass.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "backward_case.hpp"

namespace flashtile {
namespace {

using testing::BackwardCase;
using testing::Shape;

struct Call {
  TensorView q, k, v, out, dout;
  const float* lse;
  TensorView dq, dk, dv;
  Options options;
};

struct Bad {
  std::string name;
  std::function<void(BackwardCase&, Call&)> mutate;
  std::string message;  // expected substring
  ErrorKind kind = ErrorKind::invalid_argument;
};

Shape base_shape() {
  Shape s;
  s.batch = 2;
  s.seqlen_q = 5;
  s.seqlen_k = 7;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim = 16;
  s.sinks = true;
  return s;
}

class BackwardValidation : public ::testing::TestWithParam<Bad> {};

TEST_P(BackwardValidation, RefusedWithMessageAndNoWrite) {
  const Bad& bad = GetParam();
  BackwardCase c(base_shape());
  Call call{c.fwd.q.view, c.fwd.k.view, c.fwd.v.view, c.fwd.out.view, c.dout.view,
            c.fwd.lse.data(), c.dq.view, c.dk.view, c.dv.view, c.options(Backend::cpu_reference)};
  bad.mutate(c, call);
  const std::vector<unsigned char> before = c.bytes();
  try {
    backward(call.q, call.k, call.v, call.out, call.dout, call.lse, call.dq, call.dk, call.dv,
             call.options);
    FAIL() << bad.name << ": no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad.message), std::string::npos)
        << bad.name << ": message was: " << e.what();
    EXPECT_EQ(e.kind(), bad.kind) << bad.name << ": " << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("flashtile::backward: ", 0), 0u) << e.what();
  }
  EXPECT_EQ(c.bytes(), before) << bad.name << ": a gradient was written";
}

std::vector<Bad> bad_inputs() {
  std::vector<Bad> bad = {
      {"dout null", [](BackwardCase&, Call& a) { a.dout.data = nullptr; }, "dout.data is null"},
      {"dout dtype", [](BackwardCase&, Call& a) { a.dout.dtype = DType::f16; },
       "dout.dtype must match q.dtype (expected float32, got float16)", ErrorKind::dtype},
      {"dout shape", [](BackwardCase&, Call& a) { a.dout.shape[1] = 4; },
       "dout.shape[1] must equal q.shape[1] (expected 5, got 4)"},
      {"dout device", [](BackwardCase&, Call& a) { a.dout.device = Device::cuda(0); },
       "dout.device must match q.device (expected cpu, got cuda:0)"},
      {"dout head stride", [](BackwardCase&, Call& a) { a.dout.strides[3] = 2; },
       "dout.strides[3] (head_dim stride) must be 1, got 2"},
      {"lse null", [](BackwardCase&, Call& a) { a.lse = nullptr; }, "lse is null"},
      {"options.lse given", [](BackwardCase& c, Call& a) { a.options.lse = c.fwd.lse.data(); },
       "options.lse must be null"},
      {"dq shaped as k", [](BackwardCase& c, Call& a) { a.dq = c.dk.view; },
       "dq.shape[1] must equal q.shape[1] (expected 5, got 7)"},
      {"dk heads", [](BackwardCase&, Call& a) { a.dk.shape[2] = 4; },
       "dk.shape[2] must equal k.shape[2] (expected 2, got 4)"},
      {"dv dtype", [](BackwardCase&, Call& a) { a.dv.dtype = DType::bf16; },
       "dv.dtype must match q.dtype (expected float32, got bfloat16)", ErrorKind::dtype},
      {"dv negative stride", [](BackwardCase&, Call& a) { a.dv.strides[1] = -1; },
       "dv.strides[1] must be non-negative"},
      {"dq is q", [](BackwardCase&, Call& a) { a.dq.data = a.q.data; }, "dq must not overlap q"},
      {"dq is out", [](BackwardCase&, Call& a) { a.dq.data = a.out.data; },
       "dq must not overlap out"},
      {"dq is dout", [](BackwardCase&, Call& a) { a.dq.data = a.dout.data; },
       "dq must not overlap dout"},
      {"dk is k", [](BackwardCase&, Call& a) { a.dk.data = a.k.data; }, "dk must not overlap k"},
      {"dv is dk", [](BackwardCase&, Call& a) { a.dv.data = a.dk.data; }, "dv must not overlap dk"},
      {"dv inside dq", [](BackwardCase&, Call& a) { a.dv.data = a.dq.data; },
       "dv must not overlap dq"},
      {"dsinks over lse",
       [](BackwardCase& c, Call& a) { a.options.dsinks = c.fwd.lse.data(); },
       "dsinks must not overlap lse"},
      {"dq over dlse",
       [](BackwardCase&, Call& a) { a.options.dlse = static_cast<const float*>(a.dq.data); },
       "dq must not overlap options.dlse"},
      {"dsinks is dlse", [](BackwardCase&, Call& a) { a.options.dlse = a.options.dsinks; },
       "dsinks must not overlap options.dlse"},
      {"dq overlaps itself", [](BackwardCase&, Call& a) { a.dq.strides[2] = 0; },
       "dq must not overlap itself"},
      {"dsinks without sinks", [](BackwardCase&, Call& a) { a.options.sinks = {}; },
       "options.dsinks is given but options.sinks is not"},
      {"dsinks is sinks",
       [](BackwardCase& c, Call& a) { a.options.dsinks = c.fwd.sinks.data(); },
       "dsinks must not overlap sinks"},
      {"dsinks inside dq",
       [](BackwardCase&, Call& a) { a.options.dsinks = static_cast<float*>(a.dq.data); },
       "dsinks must not overlap dq"},
      {"forward's checks still apply: k heads", [](BackwardCase&, Call& a) { a.k.shape[2] = 3; },
       "v.shape[2] must equal k heads"},
      {"forward's checks still apply: out dtype",
       [](BackwardCase&, Call& a) { a.out.dtype = DType::f16; },
       "out.dtype must match q.dtype", ErrorKind::dtype},
      {"out overlapping q",
       [](BackwardCase&, Call& a) { a.out.data = a.q.data; }, "out must not overlap q"},
      {"backend without backward",
       [](BackwardCase&, Call& a) {
         a.options.backend = Backend::cpu_standard;
         a.options.sinks = {};
         a.options.dsinks = nullptr;
       },
       "backend cpu_standard cannot run this call: cpu_standard has no backward pass",
       ErrorKind::unsupported},
      {"backend on another device",
       [](BackwardCase&, Call& a) { a.options.backend = Backend::cuda_mma; },
       "backend cuda_mma runs on cuda but the tensors are on cpu"},
  };
  return bad;
}

INSTANTIATE_TEST_SUITE_P(Cases, BackwardValidation, ::testing::ValuesIn(bad_inputs()),
                         [](const auto& info) {
                           std::string name = info.param.name;
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

TEST(BackwardValidation, VarlenChecksRunToo) {
  Shape s = base_shape();
  s.varlen_q = {2, 3};
  s.varlen_k = {4, 1};
  BackwardCase c(s);
  Varlen vl = *c.fwd.varlen();
  const int32_t bad_cu[] = {0, 4, 6};  // ends past total_q = 5
  vl.cu_seqlens_q = bad_cu;
  const std::vector<unsigned char> before = c.bytes();
  try {
    backward_varlen(c.fwd.q.view, c.fwd.k.view, c.fwd.v.view, c.fwd.out.view, c.dout.view,
                    c.fwd.lse.data(), c.dq.view, c.dk.view, c.dv.view, vl,
                    c.options(Backend::cpu_reference));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flashtile::backward_varlen: varlen.cu_seqlens_q[2] must "
                                         "equal the packed rows of q"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(c.bytes(), before);
}

TEST(BackwardPlan, AutoPicksABackendWithABackwardAndReportsItsWorkspace) {
  BackwardCase c(base_shape());
  const Plan p = plan_backward(c.fwd.q.view, c.fwd.k.view, c.fwd.v.view, c.fwd.out.view,
                               c.dout.view, c.fwd.lse.data(), c.dq.view, c.dk.view, c.dv.view,
                               c.options(Backend::automatic));
  EXPECT_NE(p.backend, Backend::cpu_standard);
  EXPECT_GT(p.workspace_bytes, 0);
  const Plan r = plan_backward(c.fwd.q.view, c.fwd.k.view, c.fwd.v.view, c.fwd.out.view,
                               c.dout.view, c.fwd.lse.data(), c.dq.view, c.dk.view, c.dv.view,
                               c.options(Backend::cpu_reference));
  EXPECT_EQ(r.backend, Backend::cpu_reference);
  // The oracle's double gradients: (q rows·heads_q + 2·k rows·heads_kv)·d doubles.
  EXPECT_EQ(r.workspace_bytes, (2 * 5 * 4 + 2 * 2 * 7 * 2) * 16 * 8);
}

}  // namespace
}  // namespace flashtile
