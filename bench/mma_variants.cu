// Tile-size exploration for cuda_mma (not part of the library): instantiates the kernel
// with several MmaConfigs per head dim and times each on the ANCHORS shapes in one run,
// so one device call answers "which tiles?". The winners go into src/cuda/03_mma/traits.cuh.
// Built only with -DFLASHTILE_BUILD_MMA_VARIANTS=ON (it multiplies the kernel's compile time).
//
//   flashtile_mma_variants [seqlens, default 1024,4096,16384]
#include <cuda_bf16.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/03_mma/kernel.cuh"
#include "flashtile/device.hpp"

namespace {

using namespace flashtile;
using namespace flashtile::detail;
using mma::MmaConfig;

constexpr int64_t kTokens = 16384, kHidden = 2048;

template <class Cfg>
std::string describe() {
  char text[96];
  std::snprintf(text, sizeof text, "M%d N%d W%d S%d %s B%d", Cfg::kBlockM, Cfg::kBlockN,
                Cfg::kNWarps, Cfg::kStages, Cfg::kQInRegs ? "Qreg" : "Qsmem", Cfg::kMinBlocks);
  return text;
}

__global__ void fill_kernel(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    x[i] = __float2bfloat16(float(h & 0xFFFF) / 32768.0f - 1.0f);
  }
}

__global__ void max_diff_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n,
                                float* out) {
  float m = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float d = fabsf(__bfloat162float(a[i]) - __bfloat162float(b[i]));
    m = d == d ? fmaxf(m, d) : INFINITY;
  }
  atomicMax(reinterpret_cast<int*>(out), __float_as_int(m));  // m >= 0: int order = float order
}

struct Buffers {
  size_t n = kTokens * kHidden;
  __nv_bfloat16 *q, *k, *v, *o, *ref;
  float* diff;
  Buffers() {
    for (auto** p : {&q, &k, &v, &o, &ref}) cudaMalloc(p, n * 2);
    cudaMalloc(&diff, 4);
    uint32_t seed = 1;
    for (auto* p : {q, k, v}) fill_kernel<<<1024, 256>>>(p, n, seed++);
  }
};

AttentionParams params(Buffers& buf, int64_t s, int64_t d, bool causal) {
  AttentionParams p;
  p.q = buf.q, p.k = buf.k, p.v = buf.v, p.o = buf.o;
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

template <class... Cfgs>
void run_head_dim(Buffers& buf, const std::vector<int64_t>& seqlens) {
  using First = std::tuple_element_t<0, std::tuple<Cfgs...>>;
  constexpr int d = First::kHeadDim;
  for (bool causal : {false, true})
    for (int64_t s : seqlens) {
      const AttentionParams p = params(buf, s, d, causal);
      // The first config's output is the yardstick for the others (bitwise order differs
      // with tile shapes, so the difference is rounding-sized, not zero).
      mma::launch_mma_forward<__nv_bfloat16, First>(p, nullptr);
      cudaMemcpy(buf.ref, buf.o, buf.n * 2, cudaMemcpyDeviceToDevice);
      const double flops = 4.0 * p.batch * s * s * p.heads_q * d / (causal ? 2.0 : 1.0);
      auto time_one = [&]<class Cfg>() {
        cudaMemset(buf.o, 0xFF, buf.n * 2);
        const double ms = cuda_median_ms(0, 5, 25, [&] {
          mma::launch_mma_forward<__nv_bfloat16, Cfg>(p, nullptr);
        });
        cudaMemset(buf.diff, 0, 4);
        max_diff_kernel<<<1024, 256>>>(buf.o, buf.ref, buf.n, buf.diff);
        float diff = 0;
        cudaMemcpy(&diff, buf.diff, 4, cudaMemcpyDeviceToHost);
        std::printf("d=%-3d %-6s s=%-6lld %-28s %8.3f ms %7.1f TFLOP/s  diff %.1e  smem %d\n", d,
                    causal ? "causal" : "full", (long long)s, describe<Cfg>().c_str(), ms,
                    flops / ms / 1e9, diff, Cfg::kSmemBytes);
      };
      (time_one.template operator()<Cfgs>(), ...);
    }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> seqlens = {1024, 4096, 16384};
  if (argc > 1) {
    seqlens.clear();
    for (std::string item, all = argv[1]; !all.empty();) {
      const size_t comma = all.find(',');
      seqlens.push_back(std::stoll(all.substr(0, comma)));
      all = comma == std::string::npos ? "" : all.substr(comma + 1);
    }
  }
  Buffers buf;
  // <head_dim, kBlockM, kBlockN, kNWarps, kStages, kQInRegs, kMinBlocks>; first = traits.cuh.
  run_head_dim<MmaConfig<64, 128, 64, 4, 2, true, 2>,    // 32 rows/warp, Q in registers
               MmaConfig<64, 128, 128, 4, 2, false, 2>,  // FA2's sm80 choice
               MmaConfig<64, 128, 128, 8, 2, true, 1>,   // 16 rows/warp, 8 warps
               MmaConfig<64, 128, 128, 8, 2, true, 2>,   // the same capped at 128 registers
               MmaConfig<64, 64, 128, 4, 2, true, 3>>(buf, seqlens);  // 16 rows/warp, 3 CTAs
  run_head_dim<MmaConfig<128, 128, 64, 4, 2, false, 2>,  // FA2's sm80 choice
               MmaConfig<128, 128, 128, 8, 2, true, 1>,  // 16 rows/warp, wide key tiles
               MmaConfig<128, 128, 128, 8, 2, false, 1>, // the same, Q re-read from smem
               MmaConfig<128, 128, 64, 8, 2, true, 1>,   // 16 rows/warp, Q in registers
               MmaConfig<128, 128, 32, 4, 2, false, 2>>(buf, seqlens);  // short key tiles
  run_head_dim<MmaConfig<256, 64, 32, 4, 2, false, 2>,
               MmaConfig<256, 128, 32, 8, 2, false, 1>,
               MmaConfig<256, 64, 64, 4, 2, false, 1>>(buf, seqlens);
  const cudaError_t status = cudaDeviceSynchronize();
  std::printf("status: %s\n", cudaGetErrorString(status));
  return status == cudaSuccess ? 0 : 1;
}
