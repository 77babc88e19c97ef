// cuda_sm90's backward: its dispatch to the head-dim specialisations (sm_90a translation
// unit; the backend entry in backend.cu reaches it through sm90.hpp).
#include <algorithm>
#include <cstdlib>
#include <string>

#include "cuda/04_sm90/backward_kernel.cuh"
#include "cuda/04_sm90/sm90.hpp"
#include "cuda/device_guard.cuh"

namespace flashtile::detail::sm90 {

// The larger of the two main kernels' (4b.6's; every sm_90 part has 227 KB).
int backward_shared_bytes_for(int64_t head_dim) {
  switch (head_dim) {
    case 64: return std::max(Sm90BackwardTraits<64>::kSmemBytes,
                             Sm90WsBackwardConfig<Sm90BackwardTraits<64>>::kSmemBytes);
    case 128: return std::max(Sm90BackwardTraits<128>::kSmemBytes,
                              Sm90WsBackwardConfig<Sm90BackwardTraits<128>>::kSmemBytes);
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
// FLASHTILE_SM90_BACKWARD_PIPELINE=cp_async pins step 4b.5's main kernel (ws, or unset: 4b.6's
// wherever it serves the call) for the journey's side-by-side timings and the tests of both.
bool backward_pinned_to_cp_async() {
  const char* value = std::getenv("FLASHTILE_SM90_BACKWARD_PIPELINE");
  if (value == nullptr || *value == '\0' || std::string(value) == "ws") return false;
  if (std::string(value) == "cp_async") return true;
  throw Error(ErrorKind::invalid_argument,
              std::string("FLASHTILE_SM90_BACKWARD_PIPELINE must be cp_async or ws; got '") + value +
                  "'");
}

template <int kHeadDim>
void run_for_dtype(const BackwardParams& bp, void* workspace, bool pinned_cp_async,
                   cudaStream_t stream) {
  if (bp.fwd.dtype == DType::bf16)
    run_sm90_backward<__nv_bfloat16, kHeadDim>(bp, workspace, pinned_cp_async, stream);
  else
    run_sm90_backward<__half, kHeadDim>(bp, workspace, pinned_cp_async, stream);
}
}  // namespace

void run_backward(const BackwardParams& bp, void* stream_handle) {
  const DeviceGuard on_device(bp.fwd.device_index);
  auto stream = static_cast<cudaStream_t>(stream_handle);
  const bool pinned_cp_async = backward_pinned_to_cp_async();
  const int device = bp.fwd.device_index;
  mma::with_backward_workspace(backward_workspace_bytes(bp), device, stream, [&](void* workspace) {
    switch (bp.fwd.head_dim) {
      case 64: run_for_dtype<64>(bp, workspace, pinned_cp_async, stream); break;
      case 128: run_for_dtype<128>(bp, workspace, pinned_cp_async, stream); break;
      default:
        throw Error(ErrorKind::unsupported, "cuda_sm90's backward supports head_dim 64 and 128; got " +
                                                std::to_string(bp.fwd.head_dim));
    }
  });
}

}  // namespace flashtile::detail::sm90
