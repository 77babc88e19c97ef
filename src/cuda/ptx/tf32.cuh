// The sm_80 TF32 tensor-core pieces: the fp32 -> tf32 rounding, the 3xTF32 operand split and
// mma.sync m16n8k8 with tf32 operands and fp32 accumulators. Fragment layouts are those of
// the PTX ISA ("Matrix Fragments for mma.m16n8k8", .tf32): with lane = 4·g + t,
//   A (16x8, row): a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)
//   B (8x8, col) : b0 (k t, n g), b1 (k t+4, n g)
//   C (16x8)     : c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1)
#pragma once

#include <cstdint>

namespace flashtile::detail::ptx {

// x rounded to tf32 (10 mantissa bits, round to nearest, ties away), as a 32-bit pattern
// whose low 13 bits are zero. Inf and NaN stay Inf and NaN.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// The 3xTF32 split of an fp32 value: big = tf32(x), small = tf32(x - big), so that
// x = big + small up to ~2^-22 relative (two 11-bit significands). x - big is exact in fp32.
// An infinite x travels in the small part instead (big = 0, small = x): of the three
// products, big_a·big_b and small_a·big_b then meet it only as 0 and big_a·small_b carries
// a·(±inf) with a's sign. Left in the big part, small_a·inf would add an infinity of the
// residual's sign (either) or 0·inf = NaN, and turn a -inf score, which only drops its key,
// into a NaN row.
struct Tf32Split {
  uint32_t big, small;
};
__device__ __forceinline__ Tf32Split split_tf32(float x) {
  const uint32_t big = to_tf32(x);
  if (fabsf(x) == __int_as_float(0x7f800000)) return {0u, big};
  return {big, to_tf32(x - __uint_as_float(big))};
}

// The same split for a finite x, in integer adds instead of cvt (which sm_90 executes as the
// same add and mask plus a select for Inf/NaN, and split_tf32 adds its Inf test): tf32(x) is
// x's magnitude plus half a tf32 ulp with the 13 low bits dropped, Inf when that passes the
// largest tf32, as cvt.rna gives; x - big is then exact, or -Inf (kept by the second
// rounding) when big overflowed. Bit for bit split_tf32's result on finite values.
__device__ __forceinline__ uint32_t to_tf32_finite(float x) {
  return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}
__device__ __forceinline__ Tf32Split split_tf32_finite(float x) {
  const uint32_t big = to_tf32_finite(x);
  return {big, to_tf32_finite(x - __uint_as_float(big))};
}
// Whether every value is finite (a NaN compares false): one test for a group of splits
// (`&`, not `&&`: no branch per value).
template <class... Floats>
__device__ __forceinline__ bool all_finite(Floats... x) {
  return ((fabsf(x) < __int_as_float(0x7f800000)) & ...);
}

// D = A·B + D for one 16x8x8 tile, operands tf32 bit patterns (see the layouts above).
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4],
                                                 uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace flashtile::detail::ptx
