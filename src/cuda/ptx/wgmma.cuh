// Thin wrappers over the sm_90a warpgroup instructions (PTX ISA, "Asynchronous Warpgroup
// Level Matrix Multiply-Accumulate"): wgmma.mma_async m64nNk16 with fp32 accumulators, its
// fence / commit / wait, the shared-memory matrix descriptor of the 128-byte swizzle, and
// fence.proxy.async (ordinary shared-memory stores made visible to the async proxy that
// wgmma and TMA read through). Shared by every sm90 kernel, forward and backward.
//
// Layouts, for the thread with lane = 4·g + t of warp w (w = threadIdx.x / 32 % 4):
//  - accumulator D (64 x N fp32, N/2 registers): d[r] is row 16·w + g + 8·((r / 2) % 2),
//    column 8·(r / 4) + 2·t + r % 2 (see accumulator_row / accumulator_col);
//  - A from registers (64 x 16, four 32-bit registers of two 16-bit values): a[0] row
//    16·w + g, columns 2t, 2t+1; a[1] row +8; a[2] columns +8; a[3] row +8 and columns +8,
//    which is how the accumulator of 16 adjacent columns packs into an A operand.
// Only the (type, N) the kernels use exist; their asm comes from the macros FT_WGMMA_SS and
// FT_WGMMA_RS below (FT_WGMMA_SS_TF32 / FT_WGMMA_RS_TF32 for tf32's k8 forms).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashtile::detail::ptx {

// Row and column of accumulator register r of this thread, inside the 64-row tile.
__device__ __forceinline__ int accumulator_row(int warp_in_group, int lane, int r) {
  return 16 * warp_in_group + lane / 4 + 8 * ((r / 2) % 2);
}
__device__ __forceinline__ int accumulator_col(int lane, int r) {
  return 8 * (r / 4) + 2 * (lane % 4) + r % 2;
}

// The shared-memory matrix descriptor (64 bits): start address, leading- and stride-
// dimension byte offsets (each >> 4 in 14 bits), base offset 0 (tiles are 1024-aligned),
// layout type 1 = 128-byte swizzle in bits 62-63.
__device__ __forceinline__ uint64_t smem_descriptor_128b(uint32_t smem_address,
                                                         uint32_t leading_bytes,
                                                         uint32_t stride_bytes) {
  uint64_t desc = (smem_address & 0x3FFFFu) >> 4;
  desc |= uint64_t((leading_bytes >> 4) & 0x3FFFu) << 16;
  desc |= uint64_t((stride_bytes >> 4) & 0x3FFFu) << 32;
  desc |= uint64_t(1) << 62;
  return desc;
}

// Orders this warpgroup's earlier register and shared-memory accesses before the wgmma
// that follow (needed before the first wgmma and whenever its registers were touched).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending committed wgmma groups of this warpgroup are in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator register across the
// asynchronous wgmma that owns it (an empty asm that "changes" the register).
__device__ __forceinline__ void fence_register(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_register(uint32_t& r) {
  asm volatile("" : "+r"(r)::"memory");
}

// Generic-proxy shared-memory writes (st.shared, cp.async) become visible to the async
// proxy (wgmma operands, TMA): each writing thread, before the barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// setmaxnreg (sm_90a): the executing warpgroup gives registers back to the multiprocessor
// (dec) or takes them (inc) up to kRegs per thread; kernels need a register cap at entry
// (__launch_bounds__(threads, 1)) and one branch per warpgroup role.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// The asm blocks below name every accumulator register (inline PTX takes no arrays). The
// lists are written once, each longer one extending the shorter: FT_WGMMA_ACC_<r> is the
// r in-out operands d[0..r) and FT_WGMMA_ACC_NAMES_<r> their names %0..%(r-1) in the
// instruction text. The operands after them (descriptors, A registers, the accumulate
// flag) are numbered from r on, passed as literals since the preprocessor cannot add.
#define FT_WGMMA_D8(i)                                                                        \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define FT_WGMMA_ACC_16 FT_WGMMA_D8(0), FT_WGMMA_D8(8)
#define FT_WGMMA_ACC_32 FT_WGMMA_D8(0), FT_WGMMA_D8(8), FT_WGMMA_D8(16), FT_WGMMA_D8(24)
#define FT_WGMMA_ACC_40 FT_WGMMA_ACC_32, FT_WGMMA_D8(32)
#define FT_WGMMA_ACC_64 FT_WGMMA_ACC_40, FT_WGMMA_D8(40), FT_WGMMA_D8(48), FT_WGMMA_D8(56)
#define FT_WGMMA_ACC_128                                                                      \
  FT_WGMMA_ACC_64, FT_WGMMA_D8(64), FT_WGMMA_D8(72), FT_WGMMA_D8(80), FT_WGMMA_D8(88),        \
      FT_WGMMA_D8(96), FT_WGMMA_D8(104), FT_WGMMA_D8(112), FT_WGMMA_D8(120)
#define FT_WGMMA_ACC_NAMES_16 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define FT_WGMMA_ACC_NAMES_32 \
  FT_WGMMA_ACC_NAMES_16 ", " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FT_WGMMA_ACC_NAMES_40 \
  FT_WGMMA_ACC_NAMES_32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define FT_WGMMA_ACC_NAMES_64 \
  FT_WGMMA_ACC_NAMES_40 ", " \
  "%40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FT_WGMMA_ACC_NAMES_128 \
  FT_WGMMA_ACC_NAMES_64 ", " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// The bodies of Wgmma's ss and rs for one instruction shape m64n<n>k16 with fp32
// accumulators and <dtype> ("bf16" or "f16") operands; r = n / 2 accumulators per thread.
// The flag operand becomes the predicate that picks D = A·B + D over D = A·B.
// FT_WGMMA_SS_FORM names the ss function `name` and its transpose flags `trans` ("0, 0":
// both K-major; "1, 1": both MN-major).
#define FT_WGMMA_SS_FORM(name, trans, n, dtype, r, a_at, b_at, flag_at)                      \
  static __device__ __forceinline__ void name(float (&d)[r], uint64_t a, uint64_t b,        \
                                              bool accumulate) {                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #flag_at ", 0;\n"                     \
                 "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." dtype "." dtype " "      \
                 "{" FT_WGMMA_ACC_NAMES_##r "}, %" #a_at ", %" #b_at ", p, 1, 1, " trans    \
                 ";\n}\n"                                                                   \
                 : FT_WGMMA_ACC_##r                                                         \
                 : "l"(a), "l"(b), "r"(int(accumulate)));                                   \
  }
#define FT_WGMMA_SS(n, dtype, r, a_at, b_at, flag_at) \
  FT_WGMMA_SS_FORM(ss, "0, 0", n, dtype, r, a_at, b_at, flag_at)
#define FT_WGMMA_RS(n, dtype, r, a0_at, a1_at, a2_at, a3_at, b_at, flag_at)                  \
  static __device__ __forceinline__ void rs(float (&d)[r], const uint32_t (&a)[4],          \
                                            uint64_t b, bool accumulate) {                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #flag_at ", 0;\n"                     \
                 "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." dtype "." dtype " "      \
                 "{" FT_WGMMA_ACC_NAMES_##r "}, {%" #a0_at ", %" #a1_at ", %" #a2_at        \
                 ", %" #a3_at "}, %" #b_at ", p, 1, 1, 1;\n}\n"                              \
                 : FT_WGMMA_ACC_##r                                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate))); \
  }

// The same with both operands MN-major in shared memory (trans-a = trans-b = 1): A stored
// 16 x 64 (m contiguous), B 16 x N (n contiguous), e.g. dQ = dS·K from dSᵀ and K as they lie.
#define FT_WGMMA_SS_MN(n, dtype, r, a_at, b_at, flag_at) \
  FT_WGMMA_SS_FORM(ss_mn_major, "1, 1", n, dtype, r, a_at, b_at, flag_at)

// D (64 x N fp32) = A·B (+ D when accumulate). T: __nv_bfloat16 or __half.
//  ss: A (64 x 16) and B (16 x N) both from shared memory, both K-major (B stored N x 16,
//      k contiguous: the layout of K for S = Q·Kᵀ).
//  rs: A from registers (layout above), B from shared memory MN-major (stored 16 x N, n
//      contiguous: the layout of V for O = P·V), i.e. trans-b = 1.
//  ss_mn_major (N = 64 only, the backward's dQ): both from shared memory, both MN-major.
template <class T, int N>
struct Wgmma;

template <>
struct Wgmma<__nv_bfloat16, 64> {
  FT_WGMMA_SS(64, "bf16", 32, 32, 33, 34)
  FT_WGMMA_SS_MN(64, "bf16", 32, 32, 33, 34)
  FT_WGMMA_RS(64, "bf16", 32, 32, 33, 34, 35, 36, 37)
};
template <>
struct Wgmma<__half, 64> {
  FT_WGMMA_SS(64, "f16", 32, 32, 33, 34)
  FT_WGMMA_SS_MN(64, "f16", 32, 32, 33, 34)
  FT_WGMMA_RS(64, "f16", 32, 32, 33, 34, 35, 36, 37)
};
template <>
struct Wgmma<__nv_bfloat16, 128> {
  FT_WGMMA_SS(128, "bf16", 64, 64, 65, 66)
  FT_WGMMA_RS(128, "bf16", 64, 64, 65, 66, 67, 68, 69)
};
template <>
struct Wgmma<__half, 128> {
  FT_WGMMA_SS(128, "f16", 64, 64, 65, 66)
  FT_WGMMA_RS(128, "f16", 64, 64, 65, 66, 67, 68, 69)
};
// S = Q·Kᵀ of d=256's 80-key tiles, the widest whose two-stage K/V ring fits the shared
// memory beside Q (96 keys would take 256 KB).
template <>
struct Wgmma<__nv_bfloat16, 80> {
  FT_WGMMA_SS(80, "bf16", 40, 40, 41, 42)
};
template <>
struct Wgmma<__half, 80> {
  FT_WGMMA_SS(80, "f16", 40, 40, 41, 42)
};
// d = 256: only O += P·V has N = 256 (S = Q·Kᵀ takes 80-key tiles), so only rs exists.
template <>
struct Wgmma<__nv_bfloat16, 256> {
  FT_WGMMA_RS(256, "bf16", 128, 128, 129, 130, 131, 132, 133)
};
template <>
struct Wgmma<__half, 256> {
  FT_WGMMA_RS(256, "f16", 128, 128, 129, 130, 131, 132, 133)
};

// tf32 (sm_90a): m64nNk8, operands the 32-bit patterns of tf32 values (low 13 bits zero).
// The PTX ISA offers no transpose for .tf32: A and B are both K-major in shared memory (the
// forms take no imm-trans operands), so an MN-major operand (V of P·V) has to be written
// transposed by the kernel. A from registers is four 32-bit values per thread (CUTLASS's
// ALayout_64x8 agrees): a[0] row 16·w + g, column t; a[1] row +8; a[2] column t + 4; a[3]
// both, i.e. the m16n8k8 tf32 A fragment of mma.sync (ptx/tf32.cuh) per warp.
#define FT_WGMMA_SS_TF32(n, r, a_at, b_at, flag_at)                                          \
  static __device__ __forceinline__ void ss(float (&d)[r], uint64_t a, uint64_t b,          \
                                            bool accumulate) {                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #flag_at ", 0;\n"                     \
                 "wgmma.mma_async.sync.aligned.m64n" #n "k8.f32.tf32.tf32 "                 \
                 "{" FT_WGMMA_ACC_NAMES_##r "}, %" #a_at ", %" #b_at ", p, 1, 1;\n}\n"       \
                 : FT_WGMMA_ACC_##r                                                         \
                 : "l"(a), "l"(b), "r"(int(accumulate)));                                   \
  }
#define FT_WGMMA_RS_TF32(n, r, a0_at, a1_at, a2_at, a3_at, b_at, flag_at)                    \
  static __device__ __forceinline__ void rs(float (&d)[r], const uint32_t (&a)[4],          \
                                            uint64_t b, bool accumulate) {                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #flag_at ", 0;\n"                     \
                 "wgmma.mma_async.sync.aligned.m64n" #n "k8.f32.tf32.tf32 "                 \
                 "{" FT_WGMMA_ACC_NAMES_##r "}, {%" #a0_at ", %" #a1_at ", %" #a2_at        \
                 ", %" #a3_at "}, %" #b_at ", p, 1, 1;\n}\n"                                \
                 : FT_WGMMA_ACC_##r                                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate))); \
  }

// D (64 x N fp32) = A·B (+ D) with tf32 operands (cuda_tf32x3's sm_90a path): ss for
// S = Q·Kᵀ (N = keys per tile), rs for O += P·V (N = head dim).
template <int N>
struct WgmmaTf32;
template <>
struct WgmmaTf32<32> {
  FT_WGMMA_SS_TF32(32, 16, 16, 17, 18)
};
template <>
struct WgmmaTf32<64> {
  FT_WGMMA_SS_TF32(64, 32, 32, 33, 34)
  FT_WGMMA_RS_TF32(64, 32, 32, 33, 34, 35, 36, 37)
};
template <>
struct WgmmaTf32<128> {
  FT_WGMMA_RS_TF32(128, 64, 64, 65, 66, 67, 68, 69)
};

#undef FT_WGMMA_RS_TF32
#undef FT_WGMMA_SS_TF32
#undef FT_WGMMA_RS
#undef FT_WGMMA_SS_MN
#undef FT_WGMMA_SS
#undef FT_WGMMA_SS_FORM
#undef FT_WGMMA_ACC_NAMES_128
#undef FT_WGMMA_ACC_NAMES_64
#undef FT_WGMMA_ACC_NAMES_40
#undef FT_WGMMA_ACC_NAMES_32
#undef FT_WGMMA_ACC_NAMES_16
#undef FT_WGMMA_ACC_128
#undef FT_WGMMA_ACC_64
#undef FT_WGMMA_ACC_40
#undef FT_WGMMA_ACC_32
#undef FT_WGMMA_ACC_16
#undef FT_WGMMA_D8

}  // namespace flashtile::detail::ptx
