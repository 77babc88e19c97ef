// cuda_sm90's dispatch to its head-dim specialisations (sm_90a translation unit; the
// backend entry in backend.cu reaches it through sm90.hpp).
#include <cstdlib>
#include <string>

#include "cuda/04_sm90/sm90.hpp"
#include "cuda/04_sm90/traits.cuh"
#include "cuda/device_guard.cuh"

namespace flashtile::detail::sm90 {

int shared_bytes_for(int64_t head_dim) {
  switch (head_dim) {
    case 64: return Sm90Traits<64>::kSmemBytes;
    case 128: return Sm90Traits<128>::kSmemBytes;
    case 256: return Sm90Traits<256>::kSmemBytes;
  }
  return 0;
}

namespace {
template <int kHeadDim>
void run_for_dtype(const AttentionParams& p, cudaStream_t stream, std::optional<Pipeline> pinned) {
  if (p.dtype == DType::bf16)
    run_sm90_forward<__nv_bfloat16, kHeadDim>(p, stream, pinned);
  else
    run_sm90_forward<__half, kHeadDim>(p, stream, pinned);
}

// FLASHTILE_SM90_PIPELINE=cp_async|tma|tma_ws|tma_ws_overlap|tma_ping_pong|tma_persistent|
// tma_ws_m192|tma_ws_overlap_m192|tma_ping_pong_m192 pins the pipeline (step 4.1 .. 4.7;
// the 192-row ones serve d=64 alone) for
// the journey's side-by-side measurements and the tests of each step; unset, the newest
// one that serves the call runs.
std::optional<Pipeline> pipeline_from_environment() {
  const char* value = std::getenv("FLASHTILE_SM90_PIPELINE");
  if (value == nullptr || *value == '\0') return std::nullopt;
  const std::string name(value);
  if (name == "cp_async") return Pipeline::cp_async;
  if (name == "tma") return Pipeline::tma;
  if (name == "tma_ws") return Pipeline::tma_warp_specialized;
  if (name == "tma_ws_overlap") return Pipeline::tma_warp_specialized_overlap;
  if (name == "tma_ping_pong") return Pipeline::tma_ping_pong;
  if (name == "tma_persistent") return Pipeline::tma_persistent;
  if (name == "tma_ws_m192") return Pipeline::tma_ws_m192;
  if (name == "tma_ws_overlap_m192") return Pipeline::tma_ws_overlap_m192;
  if (name == "tma_ping_pong_m192") return Pipeline::tma_ping_pong_m192;
  throw Error(ErrorKind::invalid_argument,
              "FLASHTILE_SM90_PIPELINE must be cp_async, tma, tma_ws, tma_ws_overlap, tma_ping_pong, "
              "tma_persistent, tma_ws_m192, tma_ws_overlap_m192 or tma_ping_pong_m192; got '" +
                  name + "'");
}
}  // namespace

int persistent_cta_cap() {
  const char* value = std::getenv("FLASHTILE_SM90_PERSISTENT_CTAS");
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  const long ctas = std::strtol(value, &end, 10);
  if (*end != '\0' || ctas < 1 || ctas > 1 << 20)
    throw Error(ErrorKind::invalid_argument,
                "FLASHTILE_SM90_PERSISTENT_CTAS must be a whole number from 1 to 1048576; got '" +
                    std::string(value) + "'");
  return static_cast<int>(ctas);
}

int64_t workspace_bytes(const AttentionParams& p) {
  const std::optional<Pipeline> pinned = pipeline_from_environment();
  switch (p.head_dim) {
    case 64: return plan_sm90_call<Sm90Traits<64>>(p, pinned).split.workspace_bytes();
    case 128: return plan_sm90_call<Sm90Traits<128>>(p, pinned).split.workspace_bytes();
    case 256: return plan_sm90_call<Sm90Traits<256>>(p, pinned).split.workspace_bytes();
  }
  return 0;
}

void run_forward(const AttentionParams& p, void* stream_handle) {
  const DeviceGuard on_device(p.device_index);
  auto stream = static_cast<cudaStream_t>(stream_handle);
  const std::optional<Pipeline> pinned = pipeline_from_environment();
  switch (p.head_dim) {
    case 64: run_for_dtype<64>(p, stream, pinned); break;
    case 128: run_for_dtype<128>(p, stream, pinned); break;
    case 256: run_for_dtype<256>(p, stream, pinned); break;
    default:
      throw Error(ErrorKind::unsupported,
                  "cuda_sm90 supports head_dim 64, 128 and 256; got " + std::to_string(p.head_dim));
  }
}

}  // namespace flashtile::detail::sm90
