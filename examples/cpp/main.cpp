// flashtile from another project: a sliding-window, softcapped attention with sinks on the
// CPU, checked against the double-precision oracle. Exits non-zero when it does not match.
#include <flashtile/flashtile.hpp>
#include <flashtile/reference.hpp>

#include <cstdio>
#include <random>
#include <vector>

int main() {
  using flashtile::Device, flashtile::DType, flashtile::TensorView;
  const int64_t B = 2, S = 300, H = 8, H_kv = 2, D = 64;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto random = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& value : x) value = uniform(rng);
    return x;
  };
  std::vector<float> q = random(B * S * H * D), k = random(B * S * H_kv * D),
                     v = random(B * S * H_kv * D), out(q.size()), lse(B * H * S);
  const std::vector<float> sinks = random(H);
  const TensorView qv = TensorView::contiguous(q.data(), DType::f32, Device::cpu(), {B, S, H, D});
  const TensorView kv = TensorView::contiguous(k.data(), DType::f32, Device::cpu(), {B, S, H_kv, D});
  const TensorView vv = TensorView::contiguous(v.data(), DType::f32, Device::cpu(), {B, S, H_kv, D});
  const TensorView ov = TensorView::contiguous(out.data(), DType::f32, Device::cpu(), {B, S, H, D});

  flashtile::Options options;
  options.causal = true;
  options.window = {64, 0};
  options.softcap = 30.0f;
  options.sinks = flashtile::ParamView::vector(sinks.data(), Device::cpu(), H);
  options.lse = lse.data();
  const flashtile::Plan plan = flashtile::plan(qv, kv, vv, ov, options);
  flashtile::forward(qv, kv, vv, ov, options);

  flashtile::Options reference = options;
  reference.lse = nullptr;
  const flashtile::Verification check =
      flashtile::verify_forward(qv, kv, vv, ov, lse.data(), reference);
  std::printf("flashtile %s: %s, error %.3g (bound %.3g): %s\n",
              std::string(flashtile::version()).c_str(),
              std::string(flashtile::backend_name(plan.backend)).c_str(), check.out_error,
              check.out_bound, check.pass() ? "ok" : "MISMATCH");
  return check.pass() ? 0 : 1;
}
