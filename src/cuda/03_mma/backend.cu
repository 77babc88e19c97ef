// cuda_mma as a backend: what it accepts (checked on the host, before anything runs), how
// many key splits a call gets (split_kv_launch.hpp: when its tiles cannot fill the GPU) and
// the dispatch to the head-dim specialisations. Every variant and varlen batch is served
// (the kernel consumes them through src/attn/). The kernel and its journey note are in
// kernel.cuh, the tile sizes in traits.cuh.
// FLASHTILE_MMA_SPLITS=N pins the key splits to N (1 = never split; at most 16).
#include <climits>
#include <cstdint>
#include <string>
#include <utility>

#include "cuda/device_guard.cuh"
#include "cuda/03_mma/backward_traits.cuh"
#include "cuda/03_mma/traits.cuh"
#include "cuda/split_kv_launch.hpp"

namespace flashtile::detail {
namespace {

constexpr int kMinComputeCapability = 80;  // mma.sync bf16, ldmatrix, cp.async

std::string device_unsuitable(int device_index) {
  std::string why;
  const DeviceFacts* facts = find_device_facts(device_index, why);
  if (facts == nullptr) return why;
  const ComputeCapability& cc = facts->cc;
  if (cc.number() < kMinComputeCapability)
    return "cuda_mma needs compute capability >= 8.0 (sm_80); device " +
           std::to_string(device_index) + " has " + cc.text();
  return "";
}

std::string mma_unavailable() {
  if (std::string why = cuda_backend_unavailable(); !why.empty()) return why;
  return device_unsuitable(0);
}

// The tile of the kernel that serves a head dim (smem_bytes 0 when none does).
SplitTile tile_for(int64_t head_dim) {
  switch (mma::specialised_head_dim(head_dim)) {
    case 64: return split_tile_of<mma::MmaTraits<64>>();
    case 96: return split_tile_of<mma::MmaTraits<96>>();
    case 128: return split_tile_of<mma::MmaTraits<128>>();
    case 256: return split_tile_of<mma::MmaTraits<256>>();
  }
  return {};
}
int shared_bytes_for(int64_t head_dim) { return tile_for(head_dim).smem_bytes; }

SplitPlan mma_split_plan(const AttentionParams& p) {
  return split_plan(p, tile_for(p.head_dim), "FLASHTILE_MMA_SPLITS");
}
int64_t mma_workspace_bytes(const AttentionParams& p) {
  return mma_split_plan(p).workspace_bytes();
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
  const int smem_optin = device_facts(p.device_index).smem_optin;
  if (const int needed = shared_bytes_for(p.head_dim); needed > smem_optin)
    return "cuda_mma at head_dim " + std::to_string(p.head_dim) + " needs " +
           std::to_string(needed) + " bytes of shared memory per block; device " +
           std::to_string(p.device_index) + " allows " + std::to_string(smem_optin);
  return "";
}

template <int kHeadDim>
void run_for_dtype(const AttentionParams& p, const SplitPartials& parts, cudaStream_t stream) {
  if (p.dtype == DType::bf16)
    mma::run_mma_forward<__nv_bfloat16, kHeadDim>(p, parts, stream);
  else
    mma::run_mma_forward<__half, kHeadDim>(p, parts, stream);
}

void run_mma(const AttentionParams& p) {
  const DeviceGuard on_device(p.device_index);
  auto stream = static_cast<cudaStream_t>(p.stream);
  run_split_forward(p, mma_split_plan(p), stream, [&](const SplitPartials& parts) {
    switch (mma::specialised_head_dim(p.head_dim)) {
      case 64: run_for_dtype<64>(p, parts, stream); break;
      case 96: run_for_dtype<96>(p, parts, stream); break;
      case 128: run_for_dtype<128>(p, parts, stream); break;
      case 256: run_for_dtype<256>(p, parts, stream); break;
      default: throw Error(ErrorKind::unsupported, mma_unsupported(p));  // validated before
    }
  });
}

// ---- the backward (backward_kernel.cuh) --------------------------------------------------

// What the backward refuses beyond the forward's reasons (mma_unsupported runs first).
std::string mma_backward_unsupported(const BackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  if (mma::backward_head_dim(p.head_dim) == 0)
    return "cuda_mma's backward supports head_dim 1 to 128 (dK and dV of a key block live in "
           "registers); got " + std::to_string(p.head_dim);
  const std::pair<const char*, const void*> gradients[] = {
      {"dout", bp.dout}, {"dq", bp.dq}, {"dk", bp.dk}, {"dv", bp.dv}};
  for (const auto& [name, data] : gradients)
    if (reinterpret_cast<uintptr_t>(data) % 2 != 0)
      return std::string("cuda_mma needs 16-bit elements at even addresses; ") + name +
             ".data is at an odd address";
  // The grid's y is the kv heads: within CUDA's 65535 whenever heads_q is.
  return "";
}

int64_t mma_backward_workspace_bytes(const BackwardParams& bp) {
  const int d = mma::backward_head_dim(bp.fwd.head_dim);
  const int block_m = d == 64 ? mma::MmaBackwardTraits<64>::kBlockM
                              : mma::MmaBackwardTraits<128>::kBlockM;
  return mma::backward_workspace(bp, d == 0 ? 128 : d, block_m).bytes;
}

template <int kHeadDim>
void run_backward_for_dtype(const BackwardParams& bp, void* workspace, cudaStream_t stream) {
  if (bp.fwd.dtype == DType::bf16)
    mma::run_mma_backward<__nv_bfloat16, kHeadDim>(bp, workspace, stream);
  else
    mma::run_mma_backward<__half, kHeadDim>(bp, workspace, stream);
}

void run_mma_backward(const BackwardParams& bp) {
  const DeviceGuard on_device(bp.fwd.device_index);
  auto stream = static_cast<cudaStream_t>(bp.fwd.stream);
  const int device = bp.fwd.device_index;
  mma::with_backward_workspace(mma_backward_workspace_bytes(bp), device, stream, [&](void* workspace) {
    switch (mma::backward_head_dim(bp.fwd.head_dim)) {
      case 64: run_backward_for_dtype<64>(bp, workspace, stream); break;
      case 128: run_backward_for_dtype<128>(bp, workspace, stream); break;
      default:  // validated before
        throw Error(ErrorKind::unsupported, mma_backward_unsupported(bp));
    }
  });
}

}  // namespace

BackendEntry make_cuda_mma_backend() {
  BackendEntry entry{Backend::cuda_mma, DeviceType::cuda, /*priority=*/30, mma_unavailable,
                     mma_unsupported, mma_workspace_bytes, run_mma};
  entry.backward_workspace_bytes = mma_backward_workspace_bytes;
  entry.run_backward = run_mma_backward;
  entry.backward_unsupported_reason = mma_backward_unsupported;
  return entry;
}

}  // namespace flashtile::detail
