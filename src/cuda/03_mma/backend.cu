// cuda_mma as a backend: what it accepts (checked on the host, before anything runs) and
// the dispatch to the head-dim specialisations. Every variant and varlen batch is served
// (the kernel consumes them through src/attn/). The kernel and its journey note are in
// kernel.cuh, the tile sizes in traits.cuh.
#include <climits>
#include <cstdint>
#include <string>
#include <utility>

#include "cuda/device_guard.cuh"
#include "cuda/03_mma/traits.cuh"

namespace flashtile::detail {
namespace {

constexpr int kMinComputeCapability = 80;  // mma.sync bf16, ldmatrix, cp.async

std::string device_unsuitable(int device_index) {
  const ComputeCapability cc = compute_capability(device_index);
  if (!cc.why.empty()) return cc.why;
  if (cc.number() < kMinComputeCapability)
    return "cuda_mma needs compute capability >= 8.0 (sm_80); device " +
           std::to_string(device_index) + " has " + cc.text();
  return "";
}

std::string mma_unavailable() {
  if (std::string why = cuda_backend_unavailable(); !why.empty()) return why;
  return device_unsuitable(0);
}

int shared_bytes_for(int64_t head_dim) {
  switch (mma::specialised_head_dim(head_dim)) {
    case 64: return mma::MmaTraits<64>::kSmemBytes;
    case 96: return mma::MmaTraits<96>::kSmemBytes;
    case 128: return mma::MmaTraits<128>::kSmemBytes;
    case 256: return mma::MmaTraits<256>::kSmemBytes;
  }
  return 0;
}

// Rows of any alignment are served (tile_io.cuh picks 16-byte copies or narrower ones),
// but 16-bit elements themselves must be 2-byte aligned.
std::string element_alignment_unsupported(const AttentionParams& p) {
  const std::pair<const char*, const void*> tensors[] = {
      {"q", p.q}, {"k", p.k}, {"v", p.v}, {"out", p.o}};
  for (const auto& [name, data] : tensors)
    if (reinterpret_cast<uintptr_t>(data) % 2 != 0)
      return std::string("cuda_mma needs 16-bit elements at even addresses; ") + name +
             ".data is at an odd address";
  return "";
}

std::string mma_unsupported(const AttentionParams& p) {
  if (p.dtype != DType::f16 && p.dtype != DType::bf16)
    return "cuda_mma supports float16 and bfloat16; got " + std::string(dtype_name(p.dtype));
  if (p.head_dim < 1 || p.head_dim > 256)
    return "cuda_mma supports head_dim 1 to 256; got " + std::to_string(p.head_dim);
  if (std::string why = element_alignment_unsupported(p); !why.empty()) return why;
  // Sequence positions are 32-bit inside the kernel (element offsets stay 64-bit).
  constexpr int64_t kMaxSeqlen = INT_MAX - 1024;
  if (p.seqlen_q > kMaxSeqlen || p.seqlen_k > kMaxSeqlen)
    return "cuda_mma supports seqlen up to " + std::to_string(kMaxSeqlen) + "; got seqlen_q " +
           std::to_string(p.seqlen_q) + ", seqlen_k " + std::to_string(p.seqlen_k);
  if (std::string why = grid_unsupported(p); !why.empty()) return why;
  if (std::string why = device_unsuitable(p.device_index); !why.empty()) return why;
  int smem_optin = 0;
  cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, p.device_index);
  if (const int needed = shared_bytes_for(p.head_dim); needed > smem_optin)
    return "cuda_mma at head_dim " + std::to_string(p.head_dim) + " needs " +
           std::to_string(needed) + " bytes of shared memory per block; device " +
           std::to_string(p.device_index) + " allows " + std::to_string(smem_optin);
  return "";
}

template <int kHeadDim>
void run_for_dtype(const AttentionParams& p, cudaStream_t stream) {
  if (p.dtype == DType::bf16)
    mma::run_mma_forward<__nv_bfloat16, kHeadDim>(p, stream);
  else
    mma::run_mma_forward<__half, kHeadDim>(p, stream);
}

void run_mma(const AttentionParams& p) {
  const DeviceGuard on_device(p.device_index);
  auto stream = static_cast<cudaStream_t>(p.stream);
  switch (mma::specialised_head_dim(p.head_dim)) {
    case 64: run_for_dtype<64>(p, stream); break;
    case 96: run_for_dtype<96>(p, stream); break;
    case 128: run_for_dtype<128>(p, stream); break;
    case 256: run_for_dtype<256>(p, stream); break;
    default: throw Error(ErrorKind::unsupported, mma_unsupported(p));  // validated before
  }
}

}  // namespace

BackendEntry make_cuda_mma_backend() {
  return {Backend::cuda_mma, DeviceType::cuda, /*priority=*/30, mma_unavailable, mma_unsupported,
          no_workspace, run_mma};
}

}  // namespace flashtile::detail
