// Thin wrappers over the sm_80 PTX instructions the tensor-core kernels use: cp.async
// (global -> shared without registers), ldmatrix (shared -> mma fragments), mma.sync
// m16n8k16 with fp32 accumulators, ex2.approx, tanh.approx, the f32 -> 16-bit pair
// conversions and an acquire load (the backward's ordered dQ adds).
// Each wrapper is one instruction; the fragment layouts are those of the PTX ISA
// ("Matrix Fragments for mma.m16n8k16").
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashtile::detail::ptx {

// 32-bit shared-state-space address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous copy global -> shared. When `valid` is false nothing is read and
// the 16 bytes are zero-filled (src-size 0), which is how tiles are padded past the end.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
// The same without the zero-fill operand, for tiles known to lie inside the tensor.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and r[i] is
// this lane's fragment of matrix i (row lane/4, columns 2·(lane%4) and +1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// The same with each matrix transposed: r[i] holds (rows 2·(lane%4) and +1, column lane/4).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A·B + D for one 16x8x16 tile: A (16x16, row) in 4 registers, B (16x8, col) in 2,
// D (16x8 fp32) in 4. T is __nv_bfloat16 or __half.
template <class T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4],
                                             uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                            uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                     uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one register of two 16-bit values (lo in the low half), round to nearest.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// The m16n8k16 A fragment (16 rows x 16 k) from two fp32 accumulator tiles side by side (k
// columns 0-7 in `lo`, 8-15 in `hi`): a lane's accumulator registers are already its A
// registers, rows g then g + 8, so a product's output feeds the next product as it stands.
template <class T>
__device__ __forceinline__ void accumulators_to_a(const float (&lo)[4], const float (&hi)[4],
                                                  uint32_t (&a)[4]) {
  a[0] = pack2<T>(lo[0], lo[1]);
  a[1] = pack2<T>(lo[2], lo[3]);
  a[2] = pack2<T>(hi[0], hi[1]);
  a[3] = pack2<T>(hi[2], hi[3]);
}

// 2^x on the special-function unit (one MUFU.EX2); ex2(-inf) = +0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// tanh on the special-function unit (one MUFU.TANH, sm_75+): relative error about 2^-11,
// below the rounding of fp16/bf16 logits. A functor, to pass as LogitsTransform's tanh.
struct TanhApprox {
  __device__ __forceinline__ float operator()(float x) const {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
  }
};

// A load with acquire semantics at GPU scope: what a CTA waiting on another's release
// (an atomicAdd after __threadfence) reads its counter with.
__device__ __forceinline__ int load_acquire_gpu(const int* address) {
  int value;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(value) : "l"(address) : "memory");
  return value;
}

}  // namespace flashtile::detail::ptx
