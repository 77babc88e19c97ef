#pragma once
// Lets the same small math compile for the host and for CUDA kernels.
#if defined(__CUDACC__)
#define FT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FT_HOST_DEVICE inline
#endif
