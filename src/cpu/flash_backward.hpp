// cpu_flash's backward pass (flash_backward.cpp; SIMD kernels in flash_backward_hwy.cpp):
// the entry points its BackendEntry lists, and the per-target kernels the passes call.
#pragma once

#include <cstdint>

#include "api/params.hpp"

namespace flashtile::detail::cpu_flash_backward {

// D (fp32, one per query row and head), the per-thread tiles and fp32 dK/dV/dQ
// accumulators, and the sinks' per-task partial sums.
int64_t workspace_bytes(const BackwardParams& bp);
void run(const BackwardParams& bp);

// The SIMD kernels of the target this CPU runs (see flash_backward_kernels-inl.hpp).
struct Kernels {
  // c (m × n) (+)= a (m × k) · b (k × n), fp32 row-major with row strides, or aᵀ · b when
  // trans_a (a holds k × m); n % lanes == 0.
  void (*gemm)(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
               int64_t m, int64_t n, int64_t k, bool accumulate, bool trans_a);
  // s <- softcap·tanh(s·capped_scale), chain <- scale·(1 - tanh²); n % lanes == 0.
  void (*softcap)(float* s, float* chain, int64_t ld, int64_t rows, int64_t n, float scale,
                  float softcap, float capped_scale);
  // s <- P = exp(s·logit_scale - lse_i); dp <- dS = P·(dp - D_i)·(chain or scale);
  // n % lanes == 0.
  void (*probabilities)(float* s, float* dp, const float* chain, int64_t ld, int64_t rows,
                        int64_t n, const float* lse, const float* row_sums, float logit_scale,
                        float scale);
  int64_t lanes;  // floats per vector
};
Kernels kernels();

}  // namespace flashtile::detail::cpu_flash_backward
