// Device probes of cuda_sm90's pieces for the unit tests (tests/cuda/test_cuda_sm90.cpp):
// one warpgroup runs exactly the kernel's shared-memory fill, descriptors, wgmma wrappers
// and fragment maps on known matrices, so that a wrong layout shows up as a wrong product
// here, with the element that is off, rather than as a wrong attention output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "cuda/04_sm90/kernel.cuh"
#include "cuda/04_sm90/sm90.hpp"

namespace flashtile::detail::sm90 {
namespace {

constexpr int kProbeN = 128;  // keys of the probe tile (the kernels' kBlockN)

// One warpgroup, the kernel's load path for 64-row and 128-row tiles.
template <int kHeadDim>
using ProbeConfig = Sm90Config<kHeadDim, kProbeN, 1, 2, 1>;

// S (64 x kProbeN) = A (64 x d) · B (kProbeN x d)ᵀ.
template <class T, int kHeadDim>
__global__ void __launch_bounds__(kWarpgroupThreads, 1)
    probe_qk_kernel(const T* a, const T* b, float* out) {
  using Cfg = ProbeConfig<kHeadDim>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem_a = atom_aligned(ptx::smem_addr(smem_raw));
  const uint32_t smem_b = smem_a + kWarpgroupRows * kHeadDim * 2;
  load_tile_async<Cfg, kWarpgroupRows>(smem_a, a, kHeadDim, kWarpgroupRows);
  load_tile_async<Cfg, kProbeN>(smem_b, b, kHeadDim, kProbeN);
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  ptx::fence_proxy_async_shared();
  __syncthreads();

  float s[kProbeN / 2];  // S (64, kProbeN) accumulator
  ptx::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kHeadDim / 16; ++ks)
    ptx::Wgmma<T, kProbeN>::ss(s, k_major_descriptor<kWarpgroupRows>(smem_a, 0, ks),
                               k_major_descriptor<kProbeN>(smem_b, 0, ks), ks > 0);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  fence_registers(s);
  const FragmentCoords frag;
#pragma unroll
  for (int r = 0; r < kProbeN / 2; ++r) out[frag.row((r / 2) % 2) * kProbeN + frag.col(r)] = s[r];
}

// O (64 x d) = P (64 x kProbeN) · V (kProbeN x d), P through the accumulator layout.
template <class T, int kHeadDim>
__global__ void __launch_bounds__(kWarpgroupThreads, 1)
    probe_pv_kernel(const float* p, const T* v, float* out) {
  using Cfg = ProbeConfig<kHeadDim>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem_v = atom_aligned(ptx::smem_addr(smem_raw));
  load_tile_async<Cfg, kProbeN>(smem_v, v, kHeadDim, kProbeN);
  ptx::cp_async_commit();

  const FragmentCoords frag;
  float s[kProbeN / 2];  // P (64, kProbeN) in the S accumulator's layout
#pragma unroll
  for (int r = 0; r < kProbeN / 2; ++r) s[r] = p[frag.row((r / 2) % 2) * kProbeN + frag.col(r)];
  uint32_t p_frag[kProbeN / 16][4];
#pragma unroll
  for (int kk = 0; kk < kProbeN / 16; ++kk) pack_a_operand<T>(p_frag[kk], s, kk);

  ptx::cp_async_wait<0>();
  ptx::fence_proxy_async_shared();
  __syncthreads();
  float o[kHeadDim / 2];  // O (64, d) accumulator
#pragma unroll
  for (int r = 0; r < kHeadDim / 2; ++r) o[r] = 0.0f;
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kProbeN / 16; ++kk)
    ptx::Wgmma<T, kHeadDim>::rs(o, p_frag[kk], mn_major_descriptor<kProbeN>(smem_v, kk), true);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  fence_registers(o);
#pragma unroll
  for (int r = 0; r < kHeadDim / 2; ++r) out[frag.row((r / 2) % 2) * kHeadDim + frag.col(r)] = o[r];
}

// A device copy of host floats, as T (or float).
template <class T>
struct DeviceArray {
  T* data = nullptr;
  explicit DeviceArray(size_t n) { check_cuda(cudaMalloc(&data, n * sizeof(T)), "cudaMalloc"); }
  DeviceArray(const std::vector<float>& host) : DeviceArray(host.size()) {
    std::vector<T> converted(host.size());
    for (size_t i = 0; i < host.size(); ++i) converted[i] = static_cast<T>(host[i]);
    check_cuda(cudaMemcpy(data, converted.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
               "cudaMemcpy");
  }
  ~DeviceArray() { cudaFree(data); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

std::vector<float> copy_back(const DeviceArray<float>& d, size_t n) {
  check_cuda(cudaDeviceSynchronize(), "probe kernel");
  std::vector<float> host(n);
  check_cuda(cudaMemcpy(host.data(), d.data, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return host;
}

template <class T, int kHeadDim>
std::vector<float> run_qk(const std::vector<float>& a, const std::vector<float>& b) {
  const DeviceArray<T> da(a), db(b);
  DeviceArray<float> out(size_t(kWarpgroupRows) * kProbeN);
  const int smem = (kWarpgroupRows + kProbeN) * kHeadDim * 2 + kAtomBytes;
  auto* kernel = &probe_qk_kernel<T, kHeadDim>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "cudaFuncSetAttribute(probe_qk_kernel)");
  kernel<<<1, kWarpgroupThreads, smem>>>(da.data, db.data, out.data);
  check_launch("probe_qk_kernel");
  return copy_back(out, size_t(kWarpgroupRows) * kProbeN);
}

template <class T, int kHeadDim>
std::vector<float> run_pv(const std::vector<float>& p, const std::vector<float>& v) {
  const DeviceArray<float> dp(p);
  const DeviceArray<T> dv(v);
  DeviceArray<float> out(size_t(kWarpgroupRows) * kHeadDim);
  const int smem = kProbeN * kHeadDim * 2 + kAtomBytes;
  auto* kernel = &probe_pv_kernel<T, kHeadDim>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "cudaFuncSetAttribute(probe_pv_kernel)");
  kernel<<<1, kWarpgroupThreads, smem>>>(dp.data, dv.data, out.data);
  check_launch("probe_pv_kernel");
  return copy_back(out, size_t(kWarpgroupRows) * kHeadDim);
}

[[noreturn]] void bad_probe_dim(int d) {
  throw Error(ErrorKind::invalid_argument,
              "sm90 probe: d must be 64, 128 or 256; got " + std::to_string(d));
}

}  // namespace

std::vector<float> probe_qk(bool bf16, int d, const std::vector<float>& a,
                            const std::vector<float>& b) {
  if (d == 64) return bf16 ? run_qk<__nv_bfloat16, 64>(a, b) : run_qk<__half, 64>(a, b);
  if (d == 128) return bf16 ? run_qk<__nv_bfloat16, 128>(a, b) : run_qk<__half, 128>(a, b);
  if (d == 256) return bf16 ? run_qk<__nv_bfloat16, 256>(a, b) : run_qk<__half, 256>(a, b);
  bad_probe_dim(d);
}

std::vector<float> probe_pv(bool bf16, int d, const std::vector<float>& p,
                            const std::vector<float>& v) {
  if (d == 64) return bf16 ? run_pv<__nv_bfloat16, 64>(p, v) : run_pv<__half, 64>(p, v);
  if (d == 128) return bf16 ? run_pv<__nv_bfloat16, 128>(p, v) : run_pv<__half, 128>(p, v);
  if (d == 256) return bf16 ? run_pv<__nv_bfloat16, 256>(p, v) : run_pv<__half, 256>(p, v);
  bad_probe_dim(d);
}

}  // namespace flashtile::detail::sm90
