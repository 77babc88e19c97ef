// The field's forward grid (../shared/ANCHORS.md) through flashtile::forward: 16k tokens
// per batch (batch = 16384 / seqlen), hidden 2048 (heads = 2048 / head_dim), seqlen 512..16k,
// head_dim 64/128/256, causal and not. Times each point with CUDA events (median after a
// warm-up), checks a sample of rows against the double-precision oracle, and writes the
// JSON list the CLI's `bench --sweep --json` writes (bench/peers.py reads either).
//
//   flashtile_mma_sweep [--dtype bf16,f16] [--backend cuda_mma] [--head-dims 64,128,256]
//                       [--seqlens 512,...,16384] [--causal 0,1] [--warmup 10]
//                       [--repeats 30] [--json out.json]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/numeric.hpp"
#include "flashtile/device.hpp"
#include "flashtile/flashtile.hpp"
#include "flashtile/reference.hpp"

namespace {

using namespace flashtile;

constexpr int64_t kTokens = 16384, kHidden = 2048;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) parts.push_back(item);
  return parts;
}

std::vector<int64_t> split_ints(const std::string& s) {
  std::vector<int64_t> out;
  for (const auto& x : split(s)) out.push_back(std::stoll(x));
  return out;
}

// Uniform [-1, 1) from a 64-bit LCG: 100M values in well under a second.
void fill_random(std::vector<uint16_t>& data, DType dtype, uint64_t seed) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : data) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float u = static_cast<float>(state >> 40) * (2.0f / 16777216.0f) - 1.0f;
    x = dtype == DType::bf16 ? detail::float_to_bf16(u) : detail::float_to_f16(u);
  }
}

struct Point {
  std::string backend, dtype;
  int64_t batch, heads, seqlen, head_dim;
  bool causal;
  double ms, tflops, max_abs_err;
};

}  // namespace

int main(int argc, char** argv) {
  std::string dtypes = "bf16,f16", backend_name_arg = "cuda_mma", json_path;
  std::string head_dims_arg = "64,128,256", seqlens_arg = "512,1024,2048,4096,8192,16384";
  std::string causal_arg = "0,1";
  int warmup = 10, repeats = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--dtype") dtypes = value;
    else if (flag == "--backend") backend_name_arg = value;
    else if (flag == "--head-dims") head_dims_arg = value;
    else if (flag == "--seqlens") seqlens_arg = value;
    else if (flag == "--causal") causal_arg = value;
    else if (flag == "--warmup") warmup = std::stoi(value);
    else if (flag == "--repeats") repeats = std::stoi(value);
    else if (flag == "--json") json_path = value;
    else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  const auto backend = parse_backend(backend_name_arg);
  if (!backend) {
    std::cerr << "unknown backend " << backend_name_arg << "\n";
    return 2;
  }
  if (cuda_device_count() == 0) {
    std::cerr << "no CUDA device: " << cuda_unavailable_reason() << "\n";
    return 1;
  }
  std::cerr << "device: " << cuda_device_name(0) << "\n";

  const size_t numel = kTokens * kHidden;  // every grid point has the same element count
  std::vector<Point> points;
  for (const auto& dtype_text : split(dtypes)) {
    const auto dtype = parse_dtype(dtype_text);
    if (!dtype || *dtype == DType::f32) {
      std::cerr << "dtype must be bf16 or f16, got " << dtype_text << "\n";
      return 2;
    }
    std::vector<uint16_t> host_q(numel), host_k(numel), host_v(numel), host_o(numel);
    fill_random(host_q, *dtype, 1);
    fill_random(host_k, *dtype, 2);
    fill_random(host_v, *dtype, 3);
    DeviceBuffer q(numel * 2), k(numel * 2), v(numel * 2), o(numel * 2);
    q.copy_from_host(host_q.data(), numel * 2);
    k.copy_from_host(host_k.data(), numel * 2);
    v.copy_from_host(host_v.data(), numel * 2);

    for (int64_t d : split_ints(head_dims_arg))
      for (int64_t causal : split_ints(causal_arg))
        for (int64_t s : split_ints(seqlens_arg)) {
          const int64_t b = kTokens / s, h = kHidden / d;
          const std::array<int64_t, 4> shape = {b, s, h, d};
          auto view = [&](DeviceBuffer& buf) {
            return TensorView::contiguous(buf.data(), *dtype, Device::cuda(0), shape);
          };
          Options opt;
          opt.backend = *backend;
          opt.causal = causal != 0;
          o.fill_bytes(0xFF);
          double ms = 0;
          try {
            ms = cuda_median_ms(0, warmup, repeats,
                                [&] { forward(view(q), view(k), view(v), view(o), opt); });
          } catch (const Error& e) {
            std::cerr << "skip " << dtype_text << " d" << d << " s" << s << ": " << e.what()
                      << "\n";
            continue;
          }
          // Oracle on a sample: the last 8 query rows of the last (batch, head), which see
          // every key (and sit at the largest offsets).
          o.copy_to_host(host_o.data(), numel * 2);
          const int64_t rows = std::min<int64_t>(8, s);
          auto host_view = [&](std::vector<uint16_t>& data, int64_t row0, int64_t n) {
            TensorView t = TensorView::contiguous(data.data(), *dtype, Device::cpu(), shape);
            t.data = data.data() + (b - 1) * t.strides[0] + row0 * t.strides[1] +
                     (h - 1) * t.strides[2];
            t.shape = {1, n, 1, d};
            return t;
          };
          const ReferenceResult ref =
              reference_attention(host_view(host_q, s - rows, rows), host_view(host_k, 0, s),
                                  host_view(host_v, 0, s), opt);
          const ErrorStats err = compare_to_reference(host_view(host_o, s - rows, rows), ref.out);
          const double flops = 4.0 * b * s * s * h * d / (opt.causal ? 2.0 : 1.0);
          const Point p{backend_name_arg, std::string(dtype_name(*dtype)), b, h, s, d,
                        opt.causal, ms, flops / (ms * 1e-3) / 1e12, err.max_abs};
          points.push_back(p);
          std::fprintf(stderr, "%-9s %-8s d=%-3lld %-6s s=%-6lld b=%-3lld h=%-3lld %8.3f ms %7.1f TFLOP/s  err %.2e\n",
                       p.backend.c_str(), p.dtype.c_str(), (long long)d,
                       p.causal ? "causal" : "full", (long long)s, (long long)b, (long long)h,
                       ms, p.tflops, p.max_abs_err);
        }
  }

  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "[\n";
    for (size_t i = 0; i < points.size(); ++i) {
      const Point& p = points[i];
      out << "  {\"backend\": \"" << p.backend << "\", \"dtype\": \"" << p.dtype
          << "\", \"batch\": " << p.batch << ", \"heads\": " << p.heads
          << ", \"heads_kv\": " << p.heads << ", \"seqlen_q\": " << p.seqlen
          << ", \"seqlen_k\": " << p.seqlen << ", \"head_dim\": " << p.head_dim
          << ", \"causal\": " << (p.causal ? "true" : "false") << ", \"ms\": " << p.ms
          << ", \"tflops\": " << p.tflops << ", \"speedup\": null, \"max_abs_err\": "
          << p.max_abs_err << "}" << (i + 1 < points.size() ? "," : "") << "\n";
    }
    out << "]\n";
    std::cerr << "wrote " << json_path << "\n";
  }
  return 0;
}
