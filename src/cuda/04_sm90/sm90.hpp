// What the sm_90a translation units of cuda_sm90 offer the rest of the build (plain C++:
// the backend entry and the tests include it). Defined only when FLASHTILE_WITH_SM90.
#pragma once

#include <cstdint>
#include <vector>

#include "api/params.hpp"

namespace flashtile::detail::sm90 {

// Shared memory per CTA of the head dim's configuration (0: no kernel for it).
int shared_bytes_for(int64_t head_dim);

// Runs the forward kernel (p validated and supported), on `stream` (a cudaStream_t).
void run_forward(const AttentionParams& p, void* stream);

// The split-KV workspace run_forward takes for p (0 when the call's keys are not split).
int64_t workspace_bytes(const AttentionParams& p);

// The backward (backward_kernel.cuh): shared memory per CTA of the head dim's configuration
// (0: none), the workspace of bp (fp32 dQ, D, ...; backward_passes.cuh), and the run (bp
// validated and supported) on `stream`.
int backward_shared_bytes_for(int64_t head_dim);
int64_t backward_workspace_bytes(const BackwardParams& bp);
void run_backward(const BackwardParams& bp, void* stream);

// Device probes of the kernel's own pieces (its shared-memory layout, descriptors and
// fragment maps), for the unit tests. Inputs and outputs are row-major host arrays; 16-bit
// inputs are given as floats already representable in T (bf16 when `bf16`, else fp16).
//  qk: S (64 x n) = A (64 x d) · B (n x d)ᵀ, one wgmma ss per k-step (n = 128, d = 64, 128 or 256);
//  pv: O (64 x d) = P (64 x n) · V (n x d), P packed from an accumulator-shaped register
//      array into A fragments, V read MN-major (n = 128, d = 64, 128 or 256).
std::vector<float> probe_qk(bool bf16, int d, const std::vector<float>& a,
                            const std::vector<float>& b);
std::vector<float> probe_pv(bool bf16, int d, const std::vector<float>& p,
                            const std::vector<float>& v);

}  // namespace flashtile::detail::sm90
