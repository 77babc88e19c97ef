// cuda_sm90's backward: its dispatch to the head-dim specialisations (sm_90a translation
// unit; the backend entry in backend.cu reaches it through sm90.hpp).
#include <string>

#include "cuda/04_sm90/backward_kernel.cuh"
#include "cuda/04_sm90/sm90.hpp"
#include "cuda/device_guard.cuh"

namespace flashtile::detail::sm90 {

int backward_shared_bytes_for(int64_t head_dim) {
  switch (head_dim) {
    case 64: return Sm90BackwardTraits<64>::kSmemBytes;
    case 128: return Sm90BackwardTraits<128>::kSmemBytes;
  }
  return 0;
}

int64_t backward_workspace_bytes(const BackwardParams& bp) {
  switch (bp.fwd.head_dim) {
    case 64: return mma::backward_workspace(bp, 64, Sm90BackwardTraits<64>::kBlockM).bytes;
    case 128: return mma::backward_workspace(bp, 128, Sm90BackwardTraits<128>::kBlockM).bytes;
  }
  return 0;
}

namespace {
template <int kHeadDim>
void run_for_dtype(const BackwardParams& bp, void* workspace, cudaStream_t stream) {
  if (bp.fwd.dtype == DType::bf16)
    run_sm90_backward<__nv_bfloat16, kHeadDim>(bp, workspace, stream);
  else
    run_sm90_backward<__half, kHeadDim>(bp, workspace, stream);
}
}  // namespace

void run_backward(const BackwardParams& bp, void* stream_handle) {
  const DeviceGuard on_device(bp.fwd.device_index);
  auto stream = static_cast<cudaStream_t>(stream_handle);
  mma::with_backward_workspace(backward_workspace_bytes(bp), stream, [&](void* workspace) {
    switch (bp.fwd.head_dim) {
      case 64: run_for_dtype<64>(bp, workspace, stream); break;
      case 128: run_for_dtype<128>(bp, workspace, stream); break;
      default:
        throw Error(ErrorKind::unsupported, "cuda_sm90's backward supports head_dim 64 and 128; got " +
                                                std::to_string(bp.fwd.head_dim));
    }
  });
}

}  // namespace flashtile::detail::sm90
