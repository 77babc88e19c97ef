// libFuzzer harness for the validator and the selector: any TensorViews, options and varlen
// arrays must give a plan or a flashtile::Error, never a crash, a sanitizer report or a
// hang. Nothing runs (plan() stops before the kernels), so the view pointers may be fake;
// the cu_seqlens arrays are real, since the validator reads them.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <vector>

#include "flashtile/flashtile.hpp"

namespace {

flashtile::TensorView fuzzed_view(FuzzedDataProvider& in) {
  flashtile::TensorView t;
  // A fake, non-null address: plan() never dereferences it.
  t.data = reinterpret_cast<void*>(in.ConsumeIntegralInRange<uintptr_t>(1, UINTPTR_MAX));
  t.dtype = static_cast<flashtile::DType>(in.ConsumeIntegralInRange<int>(-1, 3));
  t.device = in.ConsumeBool() ? flashtile::Device::cpu()
                              : flashtile::Device::cuda(in.ConsumeIntegralInRange<int>(-2, 2));
  for (int i = 0; i < 4; ++i) {
    // Mostly small values, sometimes anything (wrapping products, negatives).
    t.shape[i] = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(-2, 300)
                                  : in.ConsumeIntegral<int64_t>();
    t.strides[i] = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(-2, 5000)
                                    : in.ConsumeIntegral<int64_t>();
  }
  if (in.ConsumeBool()) t.strides[3] = 1;
  return t;
}

flashtile::ParamView fuzzed_param(FuzzedDataProvider& in, const flashtile::TensorView& q) {
  flashtile::ParamView p;
  if (!in.ConsumeBool()) return p;
  p.data = reinterpret_cast<const float*>(in.ConsumeIntegralInRange<uintptr_t>(1, UINTPTR_MAX));
  p.device = in.ConsumeBool() ? q.device : flashtile::Device::cpu();
  p.ndim = in.ConsumeIntegralInRange<int>(-1, 3);
  for (int i = 0; i < 2; ++i) {
    p.shape[i] = in.ConsumeIntegralInRange<int64_t>(-1, 64);
    p.strides[i] = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(-1, 64)
                                    : in.ConsumeIntegral<int64_t>();
  }
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const flashtile::TensorView q = fuzzed_view(in), k = fuzzed_view(in), v = fuzzed_view(in);
  flashtile::TensorView out = fuzzed_view(in);
  if (in.ConsumeBool()) out.shape = q.shape;  // reach the checks past the shapes more often
  flashtile::Options o;
  if (in.ConsumeBool()) o.scale = in.ConsumeFloatingPoint<float>();
  o.causal = in.ConsumeBool();
  o.window = {in.ConsumeIntegralInRange<int64_t>(-3, 400), in.ConsumeIntegralInRange<int64_t>(-3, 400)};
  if (in.ConsumeBool()) o.softcap = in.ConsumeFloatingPoint<float>();
  o.alibi_slopes = fuzzed_param(in, q);
  o.sinks = fuzzed_param(in, q);
  if (in.ConsumeBool())
    o.lse = reinterpret_cast<float*>(in.ConsumeIntegralInRange<uintptr_t>(1, UINTPTR_MAX));
  o.backend = static_cast<flashtile::Backend>(in.ConsumeIntegralInRange<int>(0, 6));

  const bool varlen = in.ConsumeBool();
  std::vector<int32_t> cu_q, cu_k, used;
  flashtile::Varlen vl;
  if (varlen) {
    const int n = in.ConsumeIntegralInRange<int>(1, 8);
    for (int b = 0; b <= n; ++b) {
      cu_q.push_back(in.ConsumeIntegralInRange<int32_t>(-2, 400));
      cu_k.push_back(in.ConsumeIntegralInRange<int32_t>(-2, 400));
      if (b < n) used.push_back(in.ConsumeIntegralInRange<int32_t>(-2, 400));
    }
    vl.cu_seqlens_q = cu_q.data();
    vl.cu_seqlens_k = cu_k.data();
    if (in.ConsumeBool()) vl.seqused_k = used.data();
    vl.batch = n;
    if (in.ConsumeBool()) vl.max_seqlen_q = in.ConsumeIntegral<int64_t>();
  }
  try {
    if (varlen)
      flashtile::plan_varlen(q, k, v, out, vl, o);
    else
      flashtile::plan(q, k, v, out, o);
  } catch (const flashtile::Error&) {
  }
  return 0;
}
