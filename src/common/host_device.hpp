#pragma once
// Lets the same small math compile for the host and for CUDA kernels.
#if defined(__CUDACC__)
#define FT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FT_HOST_DEVICE inline
#endif
// Fully unrolls the loop that follows in device code, where an array indexed by the loop
// must stay in registers (a no-op on the host, where it only changes speed).
#if defined(__CUDACC__)
#define FT_UNROLL _Pragma("unroll")
#else
#define FT_UNROLL
#endif
