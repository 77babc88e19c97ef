// cuda_sm90 as a backend: what it accepts (checked on the host, before anything runs) and
// the hand-over to the sm_90a translation units (dispatch.cu). Host code only: this file is
// compiled in every CUDA build, and without sm_90a machine code (CMAKE_CUDA_ARCHITECTURES
// lacking 90a) the backend reports itself unavailable. The kernel and its journey note are
// in kernel.cuh, the tile sizes in traits.cuh.
#include <climits>
#include <cstdint>
#include <string>
#include <utility>

#include "cuda/common.cuh"
#if FLASHTILE_WITH_SM90
#include "cuda/04_sm90/sm90.hpp"
#endif

namespace flashtile::detail {
namespace {

// sm_90a machine code runs on compute capability 9.0 exactly (wgmma is arch-specific).
std::string device_unsuitable(int device_index) {
  std::string why;
  const DeviceFacts* facts = find_device_facts(device_index, why);
  if (facts == nullptr) return why;
  const ComputeCapability& cc = facts->cc;
  if (cc.number() != 90)
    return "cuda_sm90 needs compute capability 9.0 (sm_90a: H100/H200); device " +
           std::to_string(device_index) + " has " + cc.text();
  return "";
}

std::string sm90_unavailable() {
#if !FLASHTILE_WITH_SM90
  return "built without sm_90a code (CMAKE_CUDA_ARCHITECTURES lacks 90a)";
#else
  if (std::string why = cuda_backend_unavailable(); !why.empty()) return why;
  return device_unsuitable(0);
#endif
}

struct StridedTensor {
  const char* name;
  const void* data;
  int64_t batch_stride, row_stride, head_stride;
};

// Why not every row of `tensors` starts on 16 bytes (the kernels move whole 16-byte chunks), or "".
template <size_t kCount>
std::string rows_unaligned(const StridedTensor (&tensors)[kCount]) {
  for (const StridedTensor& t : tensors) {
    if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
      return std::string("cuda_sm90 needs 16-byte aligned rows; ") + t.name +
             ".data is not 16-byte aligned";
    if (t.batch_stride % 8 != 0 || t.row_stride % 8 != 0 || t.head_stride % 8 != 0)
      return std::string("cuda_sm90 needs 16-byte aligned rows; ") + t.name +
             " has strides (" + std::to_string(t.batch_stride) + ", " +
             std::to_string(t.row_stride) + ", " + std::to_string(t.head_stride) +
             ") elements, not all multiples of 8";
  }
  return "";
}

std::string alignment_unsupported(const AttentionParams& p) {
  const StridedTensor tensors[] = {
      {"q", p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride},
      {"k", p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride},
      {"v", p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride},
      {"out", p.o, p.o_batch_stride, p.o_row_stride, p.o_head_stride}};
  return rows_unaligned(tensors);
}

std::string sm90_unsupported(const AttentionParams& p) {
  if (p.dtype != DType::f16 && p.dtype != DType::bf16)
    return "cuda_sm90 supports float16 and bfloat16; got " + std::string(dtype_name(p.dtype));
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256)
    return "cuda_sm90 supports head_dim 64, 128 and 256; got " + std::to_string(p.head_dim);
  if (std::string why = alignment_unsupported(p); !why.empty()) return why;
  // Sequence positions are 32-bit inside the kernel (element offsets stay 64-bit).
  constexpr int64_t kMaxSeqlen = INT_MAX - 1024;
  if (p.seqlen_q > kMaxSeqlen || p.seqlen_k > kMaxSeqlen)
    return "cuda_sm90 supports seqlen up to " + std::to_string(kMaxSeqlen) + "; got seqlen_q " +
           std::to_string(p.seqlen_q) + ", seqlen_k " + std::to_string(p.seqlen_k);
  if (std::string why = grid_unsupported(p); !why.empty()) return why;
  if (std::string why = device_unsuitable(p.device_index); !why.empty()) return why;
#if FLASHTILE_WITH_SM90
  const int smem_optin = device_facts(p.device_index).smem_optin;
  if (const int needed = sm90::shared_bytes_for(p.head_dim); needed > smem_optin)
    return "cuda_sm90 at head_dim " + std::to_string(p.head_dim) + " needs " +
           std::to_string(needed) + " bytes of shared memory per block; device " +
           std::to_string(p.device_index) + " allows " + std::to_string(smem_optin);
#endif
  return "";
}

int64_t sm90_workspace_bytes(const AttentionParams& p) {
#if FLASHTILE_WITH_SM90
  return sm90::workspace_bytes(p);
#else
  (void)p;
  return 0;
#endif
}

void run_sm90(const AttentionParams& p) {
#if FLASHTILE_WITH_SM90
  sm90::run_forward(p, p.stream);
#else
  throw Error(ErrorKind::unsupported, "cuda_sm90 is not available: " + sm90_unavailable());
#endif
}

// What the backward refuses beyond the forward's reasons (sm90_unsupported runs first):
// head dims other than 64 and 128, and rows of dout, dk or dv off 16 bytes (dq is written
// by the shared post-pass, which takes any alignment). `auto` then takes cuda_mma's.
std::string sm90_backward_unsupported(const BackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  if (p.head_dim != 64 && p.head_dim != 128)
    return "cuda_sm90's backward supports head_dim 64 and 128; got " + std::to_string(p.head_dim);
  const StridedTensor gradients[] = {
      {"dout", bp.dout, bp.dout_strides.batch, bp.dout_strides.row, bp.dout_strides.head},
      {"dk", bp.dk, bp.dk_strides.batch, bp.dk_strides.row, bp.dk_strides.head},
      {"dv", bp.dv, bp.dv_strides.batch, bp.dv_strides.row, bp.dv_strides.head}};
  if (std::string why = rows_unaligned(gradients); !why.empty()) return why;
  if (reinterpret_cast<uintptr_t>(bp.dq) % 2 != 0)
    return "cuda_sm90 needs 16-bit elements at even addresses; dq.data is at an odd address";
#if FLASHTILE_WITH_SM90
  const int smem_optin = device_facts(p.device_index).smem_optin;
  if (const int needed = sm90::backward_shared_bytes_for(p.head_dim); needed > smem_optin)
    return "cuda_sm90's backward at head_dim " + std::to_string(p.head_dim) + " needs " +
           std::to_string(needed) + " bytes of shared memory per block; device " +
           std::to_string(p.device_index) + " allows " + std::to_string(smem_optin);
#endif
  return "";
}

int64_t sm90_backward_workspace_bytes(const BackwardParams& bp) {
#if FLASHTILE_WITH_SM90
  return sm90::backward_workspace_bytes(bp);
#else
  (void)bp;
  return 0;
#endif
}

void run_sm90_backward(const BackwardParams& bp) {
#if FLASHTILE_WITH_SM90
  sm90::run_backward(bp, bp.fwd.stream);
#else
  throw Error(ErrorKind::unsupported, "cuda_sm90 is not available: " + sm90_unavailable());
#endif
}

}  // namespace

// `auto` prefers cuda_sm90 to cuda_mma (priority 30) where it was measured faster, both
// backends in one H200 call, 16k tokens a point (docs/JOURNEY.md, "cuda_sm90: what auto
// takes"): dense bf16 and fp16 calls from the lengths below, where sm90 ran 1.01-2.10x
// cuda_mma (fp16) and 1.02-1.79x (bf16 below 512; 1.06-2.15x at 512-16k in an earlier
// call); below them cuda_mma led or tied (d=64 0.80-0.97x, d=128 causal 0.96-0.98x). Every
// variant (windows, softcap, ALiBi, sinks) from 1024 keys: 1.04-2.12x at 1k-16k, d 64/128/256,
// bf16 (fp16 at 4k: 1.14-2.00x); shorter variant calls were not measured. Varlen batches
// run step 4.1 on cuda_sm90 (no TMA maps) and stay on cuda_mma.
constexpr int kSm90Priority = 20, kSm90MeasuredFasterPriority = 40;
int64_t sm90_min_seqlen(const AttentionParams& p) {
  if (p.has_variant()) return 1024;
  switch (p.head_dim) {
    case 64: return p.is_causal() ? 1024 : 512;
    case 128: return p.is_causal() ? 512 : 256;
    default: return 128;  // d=256: 1.07-1.31x already at 128
  }
}
int sm90_priority(const AttentionParams& p) {
  if (p.is_varlen()) return kSm90Priority;
  const int64_t min_seqlen = sm90_min_seqlen(p);
  if (p.seqlen_q < min_seqlen || p.seqlen_k < min_seqlen) return kSm90Priority;
  return kSm90MeasuredFasterPriority;
}

// The backward: cuda_sm90's ran 1.06-1.30x cuda_mma's at every point measured (H200, bf16,
// d 64 and 128, causal and not, seqlen 1k-16k; docs/JOURNEY.md "Step 4b"): `auto` takes it
// for dense calls from 1024 keys and queries. Shorter and varlen calls were not measured and
// stay on cuda_mma.
int sm90_backward_priority(const BackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  if (p.is_varlen() || p.seqlen_q < 1024 || p.seqlen_k < 1024) return kSm90Priority;
  return kSm90MeasuredFasterPriority;
}

BackendEntry make_cuda_sm90_backend() {
  BackendEntry entry{Backend::cuda_sm90, DeviceType::cuda, kSm90Priority, sm90_unavailable,
                     sm90_unsupported, sm90_workspace_bytes, run_sm90,
                     sm90_backward_workspace_bytes, run_sm90_backward, sm90_priority};
  entry.backward_unsupported_reason = sm90_backward_unsupported;
  entry.backward_priority_for = sm90_backward_priority;
  return entry;
}

}  // namespace flashtile::detail
