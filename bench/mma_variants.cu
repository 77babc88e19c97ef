// cuda_mma timing harness (not part of the library), through the public C++ API so that the
// same file builds against an older tree (its dense grid then times the older kernel in the
// same device call; the variant parts need src/attn/ and are left out there).
//
//   flashtile_mma_variants [--csv FILE] [--repeats N] [--grid-only | --window-only | --groups G,...]
//
// --groups times only the named parts (grid variants softcap window varlen narrow), e.g.
// `--groups varlen` for issue 8's varlen line alone; --window-only is `--groups window`.
//
// Prints and (with --csv) writes one row per point: the field's dense grid (bf16, 16k
// tokens, hidden 2048, seqlen 512..16k, d 64/128/256, full and causal), then at seqlen 16k
// d=128 the variants beside plain causal (and causal windows of 512..4096), the softcap kernel
// with 0..4 of 8 n-tiles' exp2 on the FMA pipe, the window on other tile shapes, a packed
// varlen batch beside a dense batch of the same work, and the narrow load path. Timing: CUDA
// events, L2 flushed (256 MiB written) before every timed call, median of N; the GPU is kept
// busy for 0.5 s first. Outputs are poisoned with NaN before the first call of every point
// and counted after it.
//
// With -DFLASHTILE_MMA_TILE_SWEEP (CMake FLASHTILE_MMA_TILE_SWEEP=ON) it instead times
// several tile configurations per head dim: the measurement behind traits.cuh.
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "flashtile/device.hpp"
#include "flashtile/flashtile.hpp"

#if __has_include("attn/mask.hpp")
#define FLASHTILE_BENCH_VARIANTS 1  // the feature core is there: variants, varlen
#include "api/params.hpp"
#include "attn/mask.hpp"
#include "attn/seqlen.hpp"
#include "cuda/03_mma/traits.cuh"
#else
#define FLASHTILE_BENCH_VARIANTS 0
#endif

namespace {

using namespace flashtile;

constexpr int64_t kTokens = 16384, kHidden = 2048;

__global__ void fill_kernel(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    x[i] = __float2bfloat16(float(h & 0xFFFF) / 32768.0f - 1.0f);  // uniform in [-1, 1)
  }
}

__global__ void count_nan_kernel(const __nv_bfloat16* x, size_t n, unsigned long long* count) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float v = __bfloat162float(x[i]);
    local += v != v;
  }
  if (local) atomicAdd(count, local);
}

struct Buffers {
  size_t n = kTokens * kHidden + 64;  // + room for the offset views of the narrow path
  DeviceBuffer q, k, v, o, flush, nan_count;
  Buffers()
      : q(n * 2), k(n * 2), v(n * 2), o(n * 2), flush(size_t(256) << 20),
        nan_count(sizeof(unsigned long long)) {
    uint32_t seed = 1;
    for (DeviceBuffer* b : {&q, &k, &v})
      fill_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(b->data()), n, seed++);
    cuda_synchronize(0);
  }
  unsigned long long nans_in_output(size_t elements, size_t offset = 0) {
    nan_count.fill_bytes(0);
    count_nan_kernel<<<1024, 256>>>(static_cast<const __nv_bfloat16*>(o.data()) + offset,
                                    elements, static_cast<unsigned long long*>(nan_count.data()));
    unsigned long long count = 0;
    nan_count.copy_to_host(&count, sizeof count);
    return count;
  }
};

struct Row {
  std::string group, label;
  int64_t batch, seqlen, heads, head_dim;
  bool causal;
  double ms, tflops;
  unsigned long long nans;
};

struct Bench {
  Buffers buf;
  int repeats = 20;
  std::vector<Row> rows;

  // Times forward on views of the buffers; `flops` by the field's convention.
  template <class Call>
  void time(Row row, double flops, size_t out_elements, size_t out_offset, Call&& call) {
    buf.o.fill_bytes(0xFF);  // NaN in bf16
    call();
    cuda_synchronize(0);
    row.nans = buf.nans_in_output(out_elements, out_offset);
    row.ms = cuda_median_ms(0, 3, repeats, call, [&] { buf.flush.fill_bytes_async(0x5A); });
    row.tflops = flops / (row.ms * 1e-3) / 1e12;
    std::printf("%-8s %-28s b%-3lld s%-6lld h%-3lld d%-3lld %-6s %9.4f ms %7.1f TFLOP/s%s\n",
                row.group.c_str(), row.label.c_str(), (long long)row.batch,
                (long long)row.seqlen, (long long)row.heads, (long long)row.head_dim,
                row.causal ? "causal" : "full", row.ms, row.tflops,
                row.nans ? ("  NaN outputs: " + std::to_string(row.nans)).c_str() : "");
    std::fflush(stdout);
    rows.push_back(row);
  }

  TensorView view(DeviceBuffer& b, std::array<int64_t, 4> shape, int64_t offset_elements = 0) {
    return TensorView::contiguous(static_cast<__nv_bfloat16*>(b.data()) + offset_elements,
                                  DType::bf16, Device::cuda(0), shape);
  }

  // One dense point (batch = 16k / seqlen, heads = 2048 / d) with these options.
  void dense(const std::string& group, const std::string& label, int64_t s, int64_t d,
             Options o, int64_t q_offset = 0) {
    const int64_t batch = std::max<int64_t>(1, kTokens / s), heads = kHidden / d;
    const std::array<int64_t, 4> shape = {batch, s, heads, d};
    o.backend = Backend::cuda_mma;
    const TensorView q = view(buf.q, shape, q_offset), k = view(buf.k, shape),
                     v = view(buf.v, shape), out = view(buf.o, shape);
    const double flops = 4.0 * batch * heads * double(s) * s * d / (o.causal ? 2.0 : 1.0);
    time({group, label, batch, s, heads, d, o.causal}, flops, size_t(batch * s * heads * d), 0,
         [&] { forward(q, k, v, out, o); });
  }

  void spin_up() {
    Options o;
    o.backend = Backend::cuda_mma;
    const std::array<int64_t, 4> shape = {1, 16384, 16, 128};
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 0.5) {
      forward(view(buf.q, shape), view(buf.k, shape), view(buf.v, shape), view(buf.o, shape), o);
      cuda_synchronize(0);
    }
  }

  void dense_grid() {
    for (int64_t d : {64, 128, 256})
      for (bool causal : {false, true})
        for (int64_t s : {512, 1024, 2048, 4096, 8192, 16384}) {
          Options o;
          o.causal = causal;
          dense("dense", "plain", s, d, o);
        }
  }

#if FLASHTILE_BENCH_VARIANTS
  // Seqlen 16k, d=128 (16 heads): every variant beside plain causal and full attention.
  void variants() {
    constexpr int64_t kHeads = kHidden / 128;
    std::vector<float> slopes(kHeads), sinks(kHeads);
    for (int64_t h = 0; h < kHeads; ++h) {
      slopes[h] = std::exp2(-8.0f * float(h + 1) / float(kHeads));  // BLOOM/MPT's slopes
      sinks[h] = -1.0f + 0.25f * float(h % 8);
    }
    DeviceBuffer slopes_d(kHeads * 4), sinks_d(kHeads * 4);
    slopes_d.copy_from_host(slopes.data(), kHeads * 4);
    sinks_d.copy_from_host(sinks.data(), kHeads * 4);
    const ParamView slope_view =
        ParamView::vector(static_cast<float*>(slopes_d.data()), Device::cuda(0), kHeads);
    const ParamView sink_view =
        ParamView::vector(static_cast<float*>(sinks_d.data()), Device::cuda(0), kHeads);
    for (bool causal : {false, true}) {
      Options o;
      o.causal = causal;
      dense("variant", "plain", 16384, 128, o);
      Options w = o;
      w.window = {1024, causal ? 0 : 1024};
      dense("variant", causal ? "window(1024,0)" : "window(1024,1024)", 16384, 128, w);
      if (causal)  // time against window size: the per-block fixed cost and the per-tile one
        for (int64_t left : {512, 2048, 4096}) {
          Options wl = o;
          wl.window = {left, 0};
          dense("variant", "window(" + std::to_string(left) + ",0)", 16384, 128, wl);
        }
      Options c = o;
      c.softcap = 50.0f;
      dense("variant", "softcap 50", 16384, 128, c);
      Options a = o;
      a.alibi_slopes = slope_view;
      dense("variant", "alibi", 16384, 128, a);
      Options sk = o;
      sk.sinks = sink_view;
      dense("variant", "sinks", 16384, 128, sk);
      Options ca = c;
      ca.alibi_slopes = slope_view;
      dense("variant", "softcap 50 + alibi", 16384, 128, ca);
    }
  }

  // Softcap 50, causal, 16k, d=128: the softcap kernel with 0..4 of each tile's 8 n-tiles
  // taking their exp2 on the FMA pipe (MmaConfig::kSoftcapFmaExp2Tiles; traits.cuh picks one).
  template <int kFmaTiles>
  void softcap_exp2_split_one(const detail::AttentionParams& p, double flops) {
    using Cfg = detail::mma::MmaConfig<128, 128, 64, 4, 2, false, 2, kFmaTiles>;
    const std::string label = "softcap 50, " + std::to_string(kFmaTiles) + "/8 exp2 on FMA";
    time({"exp2", label, p.batch, p.seqlen_q, p.heads_q, p.head_dim, true}, flops,
         size_t(p.batch * p.seqlen_q * p.heads_q * p.head_dim), 0, [&] {
           detail::mma::launch_mma_forward<__nv_bfloat16, Cfg, detail::LogitsFlags<true, false>,
                                           true>(p, {}, nullptr);
         });
  }
  void softcap_exp2_split() {
    const std::array<int64_t, 4> shape = {1, 16384, kHidden / 128, 128};
    const TensorView q = view(buf.q, shape), k = view(buf.k, shape), v = view(buf.v, shape),
                     out = view(buf.o, shape);
    Options o;
    o.causal = true;
    o.softcap = 50.0f;
    o.backend = Backend::cuda_mma;
    const detail::AttentionParams p = detail::validate({q, k, v, &out, nullptr, o});
    const double flops = 4.0 * p.heads_q * double(p.seqlen_q) * p.seqlen_q * p.head_dim / 2.0;
    softcap_exp2_split_one<0>(p, flops);
    softcap_exp2_split_one<1>(p, flops);
    softcap_exp2_split_one<2>(p, flops);
    softcap_exp2_split_one<3>(p, flops);
    softcap_exp2_split_one<4>(p, flops);
  }

  // Causal windows (L, 0), 16k, d=128, through the plain aligned kernel called directly: the
  // two schedules of kernel.cuh (BlockSchedule), on traits' shape and another tile shape
  // (docs/JOURNEY.md 3g; its L2-prefetch rows came from branch feat/window). GridSchedule on
  // traits' shape is main's kernel; the library takes WindowSchedule (traits.cuh) for these
  // calls. 3f's 16-rows-a-warp shapes (M64 N64 W4, M64 N32 W4: 0.60 ms against 0.51) are
  // left out.
  template <class Cfg, class Schedule>
  void window_shape_one(const char* schedule, const detail::AttentionParams& p, double flops) {
    char label[96];
    std::snprintf(label, sizeof label, "window(%lld,0) M%d N%d W%d B%d %s",
                  (long long)p.window_left, Cfg::kBlockM, Cfg::kBlockN, Cfg::kNWarps,
                  Cfg::kMinBlocks, schedule);
    if (Schedule::kBlockMajor && !detail::mma::block_major_grid_fits<Cfg>(p)) return;
    time({"shape", label, p.batch, p.seqlen_q, p.heads_q, p.head_dim, true}, flops,
         size_t(p.batch * p.seqlen_q * p.heads_q * p.head_dim), 0, [&] {
           detail::mma::launch_mma_forward<__nv_bfloat16, Cfg, detail::LogitsFlags<false, false>,
                                           true, Schedule>(p, {}, nullptr);
         });
  }
  void window_shapes() {
    const std::array<int64_t, 4> shape = {1, 16384, kHidden / 128, 128};
    const TensorView q = view(buf.q, shape), k = view(buf.k, shape), v = view(buf.v, shape),
                     out = view(buf.o, shape);
    using detail::mma::GridSchedule;
    using detail::mma::MmaConfig;
    using detail::mma::WindowSchedule;
    using Traits = detail::mma::MmaTraits<128>;
    for (int64_t left : {512, 1024, 2048, 4096}) {
      Options o;
      o.causal = true;
      o.window = {left, 0};
      o.backend = Backend::cuda_mma;
      const detail::AttentionParams p = detail::validate({q, k, v, &out, nullptr, o});
      // The window's own work (its visible pairs), not the causal call's.
      const detail::Mask<int64_t> mask = detail::SeqlenInfo<int64_t>(p, 0).mask(p);
      double pairs = 0;
      for (int64_t i = 0; i < p.seqlen_q; ++i) pairs += double(mask.visible_keys(i));
      const double flops = 4.0 * p.heads_q * p.head_dim * pairs;
      window_shape_one<Traits, GridSchedule>("grid (main)", p, flops);
      window_shape_one<Traits, WindowSchedule>("block-major (library)", p, flops);
      if (left != 1024) continue;
      // 2 warps of 32 rows, 32-key tiles, 4 CTAs/SM: 1088 keys a block (tile floor 7.8x).
      using M64 = MmaConfig<128, 64, 32, 2, 2, false, 4>;
      window_shape_one<M64, GridSchedule>("grid", p, flops);
      window_shape_one<M64, WindowSchedule>("block-major", p, flops);
    }
  }

  // Mixed lengths in [256, 4096] (a fixed sequence of draws) up to 16k tokens, packed, beside
  // a dense batch whose sequences have the work-weighted mean length.
  void varlen() {
    std::vector<int32_t> lengths;
    uint64_t state = 12345;
    int64_t total = 0;
    while (total < kTokens) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      int64_t len = 256 + int64_t((state >> 33) % (4096 - 256 + 1));
      len = std::min(len, kTokens - total);
      lengths.push_back(static_cast<int32_t>(len));
      total += len;
    }
    std::vector<int32_t> cu(lengths.size() + 1, 0);
    double square_sum = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      cu[i + 1] = cu[i] + lengths[i];
      square_sum += double(lengths[i]) * lengths[i];
    }
    std::printf("varlen lengths (%zu):", lengths.size());
    for (int32_t len : lengths) std::printf(" %d", len);
    std::printf("\n");
    DeviceBuffer cu_d(cu.size() * 4);
    cu_d.copy_from_host(cu.data(), cu.size() * 4);
    const int64_t d = 128, heads = kHidden / d;
    const std::array<int64_t, 4> shape = {1, kTokens, heads, d};
    const TensorView q = view(buf.q, shape), k = view(buf.k, shape), v = view(buf.v, shape),
                     out = view(buf.o, shape);
    Varlen vl;
    vl.cu_seqlens_q = vl.cu_seqlens_k = static_cast<const int32_t*>(cu_d.data());
    vl.batch = static_cast<int64_t>(lengths.size());
    const int64_t mean = static_cast<int64_t>(std::lround(square_sum / double(kTokens)));
    for (bool causal : {false, true}) {
      Options o;
      o.causal = causal;
      o.backend = Backend::cuda_mma;
      const double flops = 4.0 * heads * d * square_sum / (causal ? 2.0 : 1.0);
      time({"varlen", "packed 256..4096 (API)", vl.batch, kTokens, heads, d, causal}, flops,
           size_t(kTokens * heads * d), 0, [&] { forward_varlen(q, k, v, out, vl, o); });
      // forward_varlen reads cu_seqlens back to the host on every call (to validate them),
      // which the dense call does not: the kernel alone, from the same validated params.
      const detail::AttentionParams p = detail::validate({q, k, v, &out, &vl, o});
      time({"varlen", "packed 256..4096 (kernel)", vl.batch, kTokens, heads, d, causal}, flops,
           size_t(kTokens * heads * d), 0,
           [&] { detail::mma::run_mma_forward<__nv_bfloat16, 128>(p, {}, nullptr); });
      dense("varlen", "dense, same work", mean, d, o);
    }
  }

  // Rows that are not 16-byte aligned (q one element in): the narrow path beside the fast one.
  void narrow() {
    for (bool causal : {false, true}) {
      Options o;
      o.causal = causal;
      dense("narrow", "aligned", 4096, 128, o);
      dense("narrow", "q offset by 2 bytes", 4096, 128, o, 1);
    }
  }
#endif

  void write_csv(const std::string& path) const {
    std::ofstream f(path);
    f << "group,label,batch,seqlen,heads,head_dim,causal,ms,tflops,nan_outputs\n";
    for (const Row& r : rows)
      f << r.group << ',' << r.label << ',' << r.batch << ',' << r.seqlen << ',' << r.heads << ','
        << r.head_dim << ',' << (r.causal ? 1 : 0) << ',' << r.ms << ',' << r.tflops << ','
        << r.nans << '\n';
  }
};

}  // namespace

#if defined(FLASHTILE_MMA_TILE_SWEEP)
namespace tile_sweep {

using namespace flashtile;
using namespace flashtile::detail;
using mma::MmaConfig;

template <class Cfg>
std::string describe() {
  char text[96];
  std::snprintf(text, sizeof text, "M%d N%d W%d S%d %s B%d", Cfg::kBlockM, Cfg::kBlockN,
                Cfg::kNWarps, Cfg::kStages, Cfg::kQInRegs ? "Qreg" : "Qsmem", Cfg::kMinBlocks);
  return text;
}

AttentionParams params(Buffers& buf, int64_t s, int64_t d, bool causal) {
  AttentionParams p;
  p.q = buf.q.data(), p.k = buf.k.data(), p.v = buf.v.data(), p.o = buf.o.data();
  p.dtype = DType::bf16;
  p.batch = kTokens / s, p.seqlen_q = p.seqlen_k = s;
  p.heads_q = p.heads_kv = kHidden / d, p.head_dim = d;
  const int64_t row = p.heads_q * d;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = s * row;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = row;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
  p.scale = 1.0f / std::sqrt(float(d));
  if (causal) p.window_right = 0;
  return p;
}

// The plain aligned kernel of each configuration, timed on the dense grid's 1k/4k/16k.
template <class... Cfgs>
void run_head_dim(Buffers& buf) {
  using First = std::tuple_element_t<0, std::tuple<Cfgs...>>;
  constexpr int d = First::kHeadDim;
  for (bool causal : {false, true})
    for (int64_t s : {1024, 4096, 16384}) {
      const AttentionParams p = params(buf, s, d, causal);
      const double flops = 4.0 * p.batch * s * s * p.heads_q * d / (causal ? 2.0 : 1.0);
      auto time_one = [&]<class Cfg>() {
        const double ms = cuda_median_ms(0, 5, 25, [&] {
          mma::launch_mma_forward<__nv_bfloat16, Cfg, LogitsFlags<false, false>, true>(p, {}, nullptr);
        });
        std::printf("d=%-3d %-6s s=%-6lld %-28s %8.3f ms %7.1f TFLOP/s  smem %d\n", d,
                    causal ? "causal" : "full", (long long)s, describe<Cfg>().c_str(), ms,
                    flops / ms / 1e9, Cfg::kSmemBytes);
      };
      (time_one.template operator()<Cfgs>(), ...);
    }
}

// <head_dim, kBlockM, kBlockN, kNWarps, kStages, kQInRegs, kMinBlocks>; first = traits.cuh.
int run(int, char**) {
  Buffers buf;
  run_head_dim<MmaConfig<64, 128, 128, 4, 2, false, 2>,   // FA2's sm80 choice
               MmaConfig<64, 128, 64, 4, 2, true, 2>,     // 32 rows/warp, Q in registers
               MmaConfig<64, 64, 128, 4, 2, true, 3>>(buf);  // 16 rows/warp, 3 CTAs
  run_head_dim<MmaConfig<128, 128, 64, 4, 2, false, 2>,  // FA2's sm80 choice
               MmaConfig<128, 128, 128, 8, 2, true, 1>,  // 16 rows/warp, wide key tiles
               MmaConfig<128, 128, 32, 4, 2, false, 2>>(buf);  // short key tiles
  run_head_dim<MmaConfig<256, 64, 32, 4, 2, false, 2>,
               MmaConfig<256, 128, 32, 8, 2, false, 1>>(buf);
  const cudaError_t status = cudaDeviceSynchronize();
  std::printf("status: %s\n", cudaGetErrorString(status));
  return status == cudaSuccess ? 0 : 1;
}

}  // namespace tile_sweep
#endif

int main(int argc, char** argv) {
#if defined(FLASHTILE_MMA_TILE_SWEEP)
  return tile_sweep::run(argc, argv);
#else
  std::string csv;
  std::string groups = "grid,variants,softcap,window,varlen,narrow";
  Bench bench;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--csv" && i + 1 < argc) csv = argv[++i];
    else if (arg == "--repeats" && i + 1 < argc) bench.repeats = std::stoi(argv[++i]);
    else if (arg == "--grid-only") groups = "grid";
    else if (arg == "--window-only") groups = "window";  // the window schedules (JOURNEY 3g)
    else if (arg == "--groups" && i + 1 < argc) groups = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: %s [--csv FILE] [--repeats N] [--grid-only | --window-only | "
                   "--groups G,...]\n",
                   argv[0]);
      return 2;
    }
  }
  const auto wanted = [&](const char* group) {
    return ("," + groups + ",").find("," + std::string(group) + ",") != std::string::npos;
  };
  std::printf("%s, variants %s\n", cuda_device_name(0).c_str(),
              FLASHTILE_BENCH_VARIANTS ? "on" : "off (older tree)");
  bench.spin_up();
  if (wanted("grid")) bench.dense_grid();
#if FLASHTILE_BENCH_VARIANTS
  if (wanted("variants")) bench.variants();
  if (wanted("softcap")) bench.softcap_exp2_split();
  if (wanted("window")) bench.window_shapes();
  if (wanted("varlen")) bench.varlen();
  if (wanted("narrow")) bench.narrow();
#endif
  if (!csv.empty()) bench.write_csv(csv);
  unsigned long long nans = 0;
  for (const Row& r : bench.rows) nans += r.nans;
  std::printf("NaN outputs in all rows: %llu\n", nans);
  return nans == 0 ? 0 : 1;
#endif
}
