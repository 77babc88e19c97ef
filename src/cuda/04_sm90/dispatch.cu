// cuda_sm90's dispatch to its head-dim specialisations (sm_90a translation unit; the
// backend entry in backend.cu reaches it through sm90.hpp).
#include "cuda/04_sm90/sm90.hpp"
#include "cuda/04_sm90/traits.cuh"
#include "cuda/device_guard.cuh"

namespace flashtile::detail::sm90 {

int shared_bytes_for(int64_t head_dim) {
  switch (head_dim) {
    case 64: return Sm90Traits<64>::kSmemBytes;
    case 128: return Sm90Traits<128>::kSmemBytes;
  }
  return 0;
}

namespace {
template <int kHeadDim>
void run_for_dtype(const AttentionParams& p, cudaStream_t stream) {
  if (p.dtype == DType::bf16)
    run_sm90_forward<__nv_bfloat16, kHeadDim>(p, stream);
  else
    run_sm90_forward<__half, kHeadDim>(p, stream);
}
}  // namespace

void run_forward(const AttentionParams& p, void* stream_handle) {
  const DeviceGuard on_device(p.device_index);
  auto stream = static_cast<cudaStream_t>(stream_handle);
  switch (p.head_dim) {
    case 64: run_for_dtype<64>(p, stream); break;
    case 128: run_for_dtype<128>(p, stream); break;
    default:
      throw Error(ErrorKind::unsupported,
                  "cuda_sm90 supports head_dim 64 and 128; got " + std::to_string(p.head_dim));
  }
}

}  // namespace flashtile::detail::sm90
