// The validator: every check happens here, on the host, before any backend touches memory.
// A backend receives AttentionParams that are already valid; sizes are computed with
// overflow-checked arithmetic, so nothing downstream can wrap.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

#include "api/overlap.hpp"
#include "api/params.hpp"
#include "runtime/host_copy.hpp"

namespace flashtile::detail {
namespace {

constexpr const char* kTensorNames[] = {"q", "k", "v", "out"};
constexpr const char* kDims[] = {"batch", "seqlen", "heads", "head_dim"};

// The memory a view touches: its byte range (a quick test) and its exact strided layout.
struct Footprint {
  uintptr_t first, last;  // byte range [first, last]
  StridedBytes layout;
  const char* name;
};

// Every footprint of one call, in place: q, k, v, slopes, sinks, out, and backward's dout,
// lse, dlse (inputs); dq, dk, dv, dsinks (outputs).
using Footprints = FixedVector<Footprint, 10>;

// Whether two footprints share a byte: disjoint ranges settle it; otherwise the exact
// search decides, and a search that gives up counts as an overlap.
bool overlaps(const Footprint& a, const Footprint& b) {
  if (a.first > b.last || b.first > a.last) return false;
  return views_overlap(a.layout, b.layout) != Overlap::no;
}

class Validator {
 public:
  explicit Validator(const CallArgs& call) : call_(call) {}
  AttentionParams run();
  BackwardParams run_backward(const BackwardArgs& grads);

 private:
  template <class... Parts>
  [[noreturn]] void fail(ErrorKind kind, const Parts&... parts) const {
    std::ostringstream message;
    message << call_.api << ": ";
    (message << ... << parts);
    throw Error(kind, message.str());
  }
  int64_t mul(int64_t a, int64_t b, const char* what) const {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r))
      fail(ErrorKind::invalid_argument, what, " is too large (", a, " * ", b, " overflows int64)");
    return r;
  }
  int64_t add(int64_t a, int64_t b, const char* what) const {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r))
      fail(ErrorKind::invalid_argument, what, " is too large (", a, " + ", b, " overflows int64)");
    return r;
  }
  // The footprint of a view with non-negative strides (in elements of `bytes_per` bytes).
  Footprint footprint(const void* data, StridedDims extents, StridedDims strides,
                      int64_t bytes_per, const char* name) const {
    int64_t last_element = 0;
    for (size_t i = 0; i < extents.size(); ++i)
      last_element = add(last_element, mul(extents[i] - 1, strides[i], name), name);
    const int64_t bytes = mul(add(last_element, 1, name), bytes_per, name);
    const auto first = reinterpret_cast<uintptr_t>(data);
    if (static_cast<uint64_t>(bytes) - 1 > std::numeric_limits<uintptr_t>::max() - first)
      fail(ErrorKind::invalid_argument, name, " extends past the end of the address space");
    // A dimension of extent 1 never moves: drop its stride, which may be anything. Every
    // other stride·(extent - 1) is part of `bytes`, so stride·bytes_per cannot wrap.
    for (size_t i = 0; i < strides.size(); ++i) strides[i] = extents[i] > 1 ? strides[i] * bytes_per : 0;
    return {first, first + static_cast<uintptr_t>(bytes) - 1,
            {first, bytes_per, extents, strides}, name};
  }

  void check_view(const TensorView& t, const char* name);
  Footprint view_footprint(const TensorView& t, const char* name) const {
    return footprint(t.data, StridedDims(t.shape.begin(), t.shape.end()),
                     StridedDims(t.strides.begin(), t.strides.end()),
                     int64_t(dtype_size(t.dtype)), name);
  }
  void expect_dim(const TensorView& t, const char* name, int dim, int64_t expected,
                  const char* what) const {
    if (t.shape[dim] != expected)
      fail(ErrorKind::invalid_argument, name, ".shape[", dim, "] must equal ", what,
           " (expected ", expected, ", got ", t.shape[dim], ")");
  }
  void check_param_view(const ParamView& view, const char* name, int64_t batch, bool allow_2d,
                        int64_t& batch_stride, int64_t& head_stride);
  void read_varlen(AttentionParams& p);
  struct NamedInt32Read {
    Int32Read read;
    const char* name;
  };
  // Reads the varlen arrays on the host (device arrays in one batch), or fails naming one.
  void read_int32(const std::vector<NamedInt32Read>& reads) const;
  void normalise_window(AttentionParams& p) const;
  // Fails unless output `f` overlaps neither itself (when `view` is given: a strided view)
  // nor any footprint in `others`.
  void require_disjoint(const Footprint& f, const TensorView* view,
                        const Footprints& others) const;
  // Elements of the LSE: [batch, heads_q, seqlen_q] dense, [heads_q, total_q] varlen.
  int64_t lse_elements(const AttentionParams& p) const;
  // A view of backward shaped as `like` (dout, dq, dk, dv): checked as q is, with q's dtype
  // and device and like's shape; returns its strides.
  ViewStrides check_gradient(const TensorView& grad, const TensorView& like, const char* name,
                             const char* like_name);

  const CallArgs& call_;
  Footprints inputs_;  // q, k, v, slopes, sinks (then out): what out and lse must not overlap
};

void Validator::check_view(const TensorView& t, const char* name) {
  if (t.data == nullptr) fail(ErrorKind::invalid_argument, name, ".data is null");
  if (t.dtype != DType::f32 && t.dtype != DType::f16 && t.dtype != DType::bf16)
    fail(ErrorKind::dtype, name, ".dtype is not a flashtile::DType (value ",
         static_cast<int>(t.dtype), ")");
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] <= 0)
      fail(ErrorKind::invalid_argument, name, ".shape[", i, "] (", kDims[i],
           ") must be positive, got ", t.shape[i]);
  }
  int64_t numel = 1;
  for (int i = 0; i < 4; ++i) numel = mul(numel, t.shape[i], name);
  if (t.strides[3] != 1)
    fail(ErrorKind::invalid_argument, name, ".strides[3] (head_dim stride) must be 1, got ",
         t.strides[3]);
  for (int i = 0; i < 3; ++i) {
    if (t.strides[i] < 0)
      fail(ErrorKind::invalid_argument, name, ".strides[", i, "] must be non-negative, got ",
           t.strides[i]);
  }
  if (t.device.type != DeviceType::cpu && t.device.type != DeviceType::cuda)
    fail(ErrorKind::invalid_argument, name, ".device type is not a flashtile::DeviceType");
  if (t.device.type == DeviceType::cuda && t.device.index < 0)
    fail(ErrorKind::invalid_argument, name, ".device index must be >= 0, got ", t.device.index);
}

void Validator::check_param_view(const ParamView& view, const char* name, int64_t batch,
                                 bool allow_2d, int64_t& batch_stride, int64_t& head_stride) {
  const int64_t heads = call_.q.heads();
  if (!(view.device == call_.q.device))
    fail(ErrorKind::invalid_argument, name, ".device must match q.device (expected ",
         device_name(call_.q.device), ", got ", device_name(view.device), ")");
  if (view.ndim == 1 && view.shape[0] == heads) {
    batch_stride = 0;
    head_stride = view.strides[0];
  } else if (allow_2d && view.ndim == 2 && view.shape[0] == batch && view.shape[1] == heads) {
    batch_stride = view.strides[0];
    head_stride = view.strides[1];
  } else {
    std::ostringstream given;
    given << "(";
    for (int i = 0; i < std::clamp(view.ndim, 0, 2); ++i) given << (i ? ", " : "") << view.shape[i];
    given << (view.ndim == 1 ? ",)" : ")");
    if (view.ndim < 1 || view.ndim > 2) given.str(std::to_string(view.ndim) + "-D");
    const std::string shapes =
        allow_2d ? "(heads_q) or (batch, heads_q) = (" + std::to_string(heads) + ",) or (" +
                       std::to_string(batch) + ", " + std::to_string(heads) + ")"
                 : "(heads_q) = (" + std::to_string(heads) + ",)";
    fail(ErrorKind::invalid_argument, name, " must be shaped ", shapes, ", got ", given.str());
  }
  if (batch_stride < 0 || head_stride < 0)
    fail(ErrorKind::invalid_argument, name, " strides must be non-negative");
  inputs_.push_back(footprint(view.data, {view.ndim == 2 ? batch : 1, heads},
                              {batch_stride, head_stride}, int64_t(sizeof(float)), name));
}

void Validator::read_int32(const std::vector<NamedInt32Read>& reads) const {
  for (const NamedInt32Read& r : reads)
    if (r.read.src == nullptr) fail(ErrorKind::invalid_argument, "varlen.", r.name, " is null");
  if (call_.q.device.type == DeviceType::cpu) {
    for (const NamedInt32Read& r : reads) r.read.dst->assign(r.read.src, r.read.src + r.read.n);
    return;
  }
  std::vector<Int32Read> batch;
  for (const NamedInt32Read& r : reads) batch.push_back(r.read);
  const Int32ReadFailure failure =
      copy_device_int32_to_host(batch, call_.q.device.index, call_.options.stream);
  if (!failure.why.empty())
    fail(ErrorKind::invalid_argument, "varlen.", reads[failure.index].name, " ", failure.why);
}

// Reads cu_seqlens (and seqused_k) on the host, checks them against the packed tensors, and
// sets the batch, the longest lengths and the packed totals.
void Validator::read_varlen(AttentionParams& p) {
  const Varlen& varlen = *call_.varlen;
  const int64_t batch = varlen.batch;
  if (batch <= 0) fail(ErrorKind::invalid_argument, "varlen.batch must be positive, got ", batch);
  if (batch >= std::numeric_limits<int32_t>::max())
    fail(ErrorKind::invalid_argument, "varlen.batch must be < 2^31 - 1, got ", batch);
  const int64_t total_q = call_.q.seqlen(), total_k = call_.k.seqlen();
  std::vector<int32_t> cu_q, cu_k, used;
  std::vector<NamedInt32Read> reads = {{{varlen.cu_seqlens_q, batch + 1, &cu_q}, "cu_seqlens_q"},
                                       {{varlen.cu_seqlens_k, batch + 1, &cu_k}, "cu_seqlens_k"}};
  if (varlen.seqused_k != nullptr) reads.push_back({{varlen.seqused_k, batch, &used}, "seqused_k"});
  read_int32(reads);  // one device-to-host copy and one synchronisation for all of them

  // Every query row belongs to a sequence (so every row of out is written); keys may
  // leave rows unused at the end of k (a cache with spare room).
  auto check_cu = [&](const std::vector<int32_t>& cu, const char* name, int64_t total,
                      const char* tensor, bool cover_all) {
    if (cover_all ? cu[0] != 0 : cu[0] < 0)
      fail(ErrorKind::invalid_argument, "varlen.", name, "[0] must be ", cover_all ? "0" : ">= 0",
           ", got ", cu[0]);
    for (int64_t b = 0; b < batch; ++b)
      if (cu[b + 1] < cu[b])
        fail(ErrorKind::invalid_argument, "varlen.", name, " must be non-decreasing, but ", name,
             "[", b + 1, "] = ", cu[b + 1], " < ", name, "[", b, "] = ", cu[b]);
    if (cover_all ? cu[batch] != total : cu[batch] > total)
      fail(ErrorKind::invalid_argument, "varlen.", name, "[", batch, "] must ",
           cover_all ? "equal" : "not exceed", " the packed rows of ", tensor, " (", tensor,
           ".shape[1] = ", total, "), got ", cu[batch]);
  };
  check_cu(cu_q, "cu_seqlens_q", total_q, "q", /*cover_all=*/true);
  check_cu(cu_k, "cu_seqlens_k", total_k, "k", /*cover_all=*/false);

  int64_t max_q = 0, max_k = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len_k = cu_k[b + 1] - cu_k[b];
    int64_t used_k = len_k;
    if (!used.empty()) {
      if (used[b] < 0 || used[b] > len_k)
        fail(ErrorKind::invalid_argument, "varlen.seqused_k[", b, "] must lie in [0, ", len_k,
             "] (the keys of sequence ", b, "), got ", used[b]);
      used_k = used[b];
    }
    max_q = std::max<int64_t>(max_q, cu_q[b + 1] - cu_q[b]);
    max_k = std::max(max_k, used_k);
  }
  auto check_max = [&](const std::optional<int64_t>& given, int64_t actual, const char* name) {
    if (given && *given < actual)
      fail(ErrorKind::invalid_argument, "varlen.", name, " (", *given,
           ") is smaller than the longest sequence (", actual, ")");
  };
  check_max(varlen.max_seqlen_q, max_q, "max_seqlen_q");
  check_max(varlen.max_seqlen_k, max_k, "max_seqlen_k");

  p.batch = batch;
  p.seqlen_q = max_q;
  p.seqlen_k = max_k;
  p.total_q = total_q;
  p.total_k = total_k;
  p.cu_seqlens_q = varlen.cu_seqlens_q;
  p.cu_seqlens_k = varlen.cu_seqlens_k;
  p.seqused_k = varlen.seqused_k;
}

// FlashAttention's window rules, kept exact: causal sets right = 0; a side wide enough to
// reach every key of every row is unbounded (-1).
void Validator::normalise_window(AttentionParams& p) const {
  const Window& w = call_.options.window;
  if (w.left < -1)
    fail(ErrorKind::invalid_argument, "window.left must be -1 (unbounded) or >= 0, got ", w.left);
  int64_t right = w.right;
  if (call_.options.causal) {
    right = 0;
  } else if (right < -1) {
    fail(ErrorKind::invalid_argument, "window.right must be -1 (unbounded) or >= 0, got ", right);
  }
  int64_t left = w.left;
  // Row i's first key is i + sk - sq - left <= 0 for every row once left >= sk - 1, and its
  // last key i + sk - sq + right >= sk - 1 once right >= sq - 1 (per sequence: the longest).
  if (left >= p.seqlen_k) left = -1;
  if (right >= p.seqlen_q) right = -1;
  p.window_left = left;
  p.window_right = right;
}

AttentionParams Validator::run() {
  const TensorView& q = call_.q;
  const TensorView& k = call_.k;
  const TensorView& v = call_.v;
  const bool has_out = call_.out != nullptr;
  const bool varlen = call_.varlen != nullptr;
  // Without an output (the oracle's case) q stands in for it in the per-view checks.
  const TensorView& out = has_out ? *call_.out : q;
  const TensorView* views[] = {&q, &k, &v, &out};
  const int n_views = has_out ? 4 : 3;
  for (int i = 0; i < n_views; ++i) check_view(*views[i], kTensorNames[i]);

  for (int i = 1; i < n_views; ++i) {
    if (views[i]->dtype != q.dtype)
      fail(ErrorKind::dtype, kTensorNames[i], ".dtype must match q.dtype (expected ",
           dtype_name(q.dtype), ", got ", dtype_name(views[i]->dtype), ")");
    if (!(views[i]->device == q.device))
      fail(ErrorKind::invalid_argument, kTensorNames[i],
           ".device must match q.device (expected ", device_name(q.device), ", got ",
           device_name(views[i]->device), ")");
  }

  if (varlen) {
    for (int i = 0; i < n_views; ++i)
      if (views[i]->shape[0] != 1)
        fail(ErrorKind::invalid_argument, kTensorNames[i],
             ".shape[0] must be 1 for a packed varlen batch ((1, total_tokens, heads, head_dim)), "
             "got ", views[i]->shape[0]);
  } else {
    expect_dim(k, "k", 0, q.batch(), "q batch");
    expect_dim(v, "v", 0, q.batch(), "q batch");
  }
  expect_dim(k, "k", 3, q.head_dim(), "q head_dim");
  expect_dim(v, "v", 3, q.head_dim(), "q head_dim");
  expect_dim(v, "v", 1, k.seqlen(), "k seqlen");
  expect_dim(v, "v", 2, k.heads(), "k heads");
  if (q.heads() % k.heads() != 0)
    fail(ErrorKind::invalid_argument, "q heads (", q.heads(), ") must be a multiple of k heads (",
         k.heads(), ") for GQA/MQA");
  if (has_out)
    for (int i = 0; i < 4; ++i) expect_dim(out, "out", i, q.shape[i], "the q dimension");

  AttentionParams p;
  p.dtype = q.dtype;
  p.device_index = q.device.index;
  p.stream = call_.options.stream;
  p.heads_q = q.heads();
  p.heads_kv = k.heads();
  p.head_dim = q.head_dim();
  if (varlen) {
    read_varlen(p);
  } else {
    p.batch = q.batch();
    p.seqlen_q = q.seqlen();
    p.seqlen_k = k.seqlen();
  }

  for (int i = 0; i < 3; ++i) inputs_.push_back(view_footprint(*views[i], kTensorNames[i]));

  float scale = 1.0f / std::sqrt(static_cast<float>(q.head_dim()));
  if (call_.options.scale) {
    if (!std::isfinite(*call_.options.scale))
      fail(ErrorKind::invalid_argument, "scale must be finite, got ", *call_.options.scale);
    // Kernels that exponentiate in base 2 fold log2(e) into the scale: it must stay finite.
    constexpr float kMaxScale = std::numeric_limits<float>::max() / 1.4426950408889634f;
    if (std::fabs(*call_.options.scale) > kMaxScale)
      fail(ErrorKind::invalid_argument, "scale must be at most ", kMaxScale,
           " in magnitude (scale·log2(e) must be a finite float), got ", *call_.options.scale);
    scale = *call_.options.scale;
  }
  p.scale = scale;
  normalise_window(p);

  const float softcap = call_.options.softcap;
  if (!(std::isfinite(softcap) && softcap >= 0.0f))
    fail(ErrorKind::invalid_argument, "softcap must be 0 (off) or a positive finite number, got ",
         softcap);
  p.softcap = softcap;
  if (call_.options.alibi_slopes.given()) {
    check_param_view(call_.options.alibi_slopes, "alibi_slopes", p.batch, /*allow_2d=*/true,
                     p.alibi_batch_stride, p.alibi_head_stride);
    p.alibi_slopes = call_.options.alibi_slopes.data;
  }
  if (call_.options.sinks.given()) {
    int64_t unused_batch_stride = 0;
    check_param_view(call_.options.sinks, "sinks", p.batch, /*allow_2d=*/false,
                     unused_batch_stride, p.sinks_stride);
    p.sinks = call_.options.sinks.data;
  }

  if (has_out) {
    const Footprint out_footprint = view_footprint(out, "out");
    require_disjoint(out_footprint, &out, inputs_);
    inputs_.push_back(out_footprint);
  }

  // LSE: [batch, heads, seqlen_q] dense, [heads, total_q] varlen, contiguous.
  if (varlen) {
    p.lse_batch_stride = 0;
    p.lse_head_stride = p.total_q;
  } else {
    p.lse_head_stride = p.seqlen_q;
    p.lse_batch_stride = mul(p.heads_q, p.seqlen_q, "lse");
  }
  if (call_.options.lse != nullptr) {
    require_disjoint(
        footprint(call_.options.lse, {lse_elements(p)}, {1}, int64_t(sizeof(float)), "lse"),
        nullptr, inputs_);
    p.lse = call_.options.lse;
  }

  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = out.data;
  auto strides = [varlen](const TensorView& t, int64_t& b, int64_t& s, int64_t& h) {
    b = varlen ? 0 : t.strides[0];
    s = t.strides[1];
    h = t.strides[2];
  };
  strides(q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  strides(k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  strides(v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  strides(out, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  return p;
}

void Validator::require_disjoint(const Footprint& f, const TensorView* view,
                                 const Footprints& others) const {
  if (view != nullptr && self_overlap(f.layout) != Overlap::no)
    fail(ErrorKind::invalid_argument, f.name, " must not overlap itself: its strides (",
         view->strides[0], ", ", view->strides[1], ", ", view->strides[2], ", ", view->strides[3],
         ") map distinct elements to the same memory");
  for (const Footprint& other : others)
    if (overlaps(f, other)) fail(ErrorKind::invalid_argument, f.name, " must not overlap ", other.name);
}

int64_t Validator::lse_elements(const AttentionParams& p) const {
  return call_.varlen != nullptr ? mul(p.heads_q, p.total_q, "lse")
                                 : mul(p.batch, p.lse_batch_stride, "lse");
}

ViewStrides Validator::check_gradient(const TensorView& grad, const TensorView& like,
                                      const char* name, const char* like_name) {
  check_view(grad, name);
  if (grad.dtype != call_.q.dtype)
    fail(ErrorKind::dtype, name, ".dtype must match q.dtype (expected ", dtype_name(call_.q.dtype),
         ", got ", dtype_name(grad.dtype), ")");
  if (!(grad.device == call_.q.device))
    fail(ErrorKind::invalid_argument, name, ".device must match q.device (expected ",
         device_name(call_.q.device), ", got ", device_name(grad.device), ")");
  for (int i = 0; i < 4; ++i)
    if (grad.shape[i] != like.shape[i])
      fail(ErrorKind::invalid_argument, name, ".shape[", i, "] must equal ", like_name, ".shape[",
           i, "] (expected ", like.shape[i], ", got ", grad.shape[i], ")");
  return {call_.varlen != nullptr ? 0 : grad.strides[0], grad.strides[1], grad.strides[2]};
}

BackwardParams Validator::run_backward(const BackwardArgs& grads) {
  if (call_.options.lse != nullptr)
    fail(ErrorKind::invalid_argument,
         "options.lse must be null: it is forward's output; backward takes the saved lse as "
         "its `lse` argument");
  BackwardParams bp;
  bp.fwd = run();  // q, k, v, out (an input here), the variant, varlen
  const AttentionParams& p = bp.fwd;

  // Inputs: dout, lse.
  bp.dout_strides = check_gradient(grads.dout, call_.q, "dout", "q");
  inputs_.push_back(view_footprint(grads.dout, "dout"));
  if (grads.lse == nullptr)
    fail(ErrorKind::invalid_argument, "lse is null: backward needs the log-sum-exp forward "
                                      "returned (fp32, [batch, heads_q, seqlen_q])");
  inputs_.push_back(footprint(grads.lse, {lse_elements(p)}, {1}, int64_t(sizeof(float)), "lse"));
  if (call_.options.dlse != nullptr)  // the LSE's shape; an input, so no output may overlap it
    inputs_.push_back(footprint(call_.options.dlse, {lse_elements(p)}, {1},
                                int64_t(sizeof(float)), "options.dlse"));

  // Outputs: each against itself, every input and the outputs before it.
  Footprints outputs;
  auto check_output = [&](const Footprint& f, const TensorView* view) {
    require_disjoint(f, view, inputs_);
    require_disjoint(f, nullptr, outputs);
    outputs.push_back(f);
  };
  const struct {
    const TensorView& grad;
    const TensorView& like;
    const char *name, *like_name;
    ViewStrides& strides;
  } gradients[] = {{grads.dq, call_.q, "dq", "q", bp.dq_strides},
                   {grads.dk, call_.k, "dk", "k", bp.dk_strides},
                   {grads.dv, call_.v, "dv", "v", bp.dv_strides}};
  for (const auto& g : gradients) {
    g.strides = check_gradient(g.grad, g.like, g.name, g.like_name);
    check_output(view_footprint(g.grad, g.name), &g.grad);
  }
  if (call_.options.dsinks != nullptr) {
    if (!call_.options.sinks.given())
      fail(ErrorKind::invalid_argument, "options.dsinks is given but options.sinks is not: the "
                                        "sinks' gradient needs sinks");
    check_output(footprint(call_.options.dsinks, {p.heads_q}, {1}, int64_t(sizeof(float)),
                           "dsinks"),
                 nullptr);
  }

  bp.dout = grads.dout.data;
  bp.dq = grads.dq.data;
  bp.dk = grads.dk.data;
  bp.dv = grads.dv.data;
  bp.dsinks = call_.options.dsinks;
  bp.dlse = call_.options.dlse;
  bp.deterministic = call_.options.deterministic;
  bp.fwd.lse = const_cast<float*>(grads.lse);  // read only by backward kernels
  return bp;
}

}  // namespace

AttentionParams validate(const CallArgs& call) { return Validator(call).run(); }

BackwardParams validate_backward(const CallArgs& call, const BackwardArgs& grads) {
  return Validator(call).run_backward(grads);
}

std::string describe_variant(const AttentionParams& p) {
  std::ostringstream d;
  const char* sep = "";
  if (p.has_mask() && !p.is_causal()) {
    d << "window (" << p.window_left << ", " << p.window_right << ")";
    sep = ", ";
  }
  if (p.softcap != 0.0f) d << sep << "softcap " << p.softcap, sep = ", ";
  if (p.alibi_slopes != nullptr) d << sep << "ALiBi", sep = ", ";
  if (p.sinks != nullptr) d << sep << "sinks", sep = ", ";
  if (p.is_varlen()) d << sep << "varlen", sep = ", ";
  return d.str();
}

}  // namespace flashtile::detail
