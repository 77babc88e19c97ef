// Tile sizes of cuda_mma, one configuration per specialised head dim. Every choice below
// stays within 99 KB of shared memory per CTA (the opt-in limit of sm_86/sm_89, e.g. the
// write-up's RTX 4050), which also lets two CTAs share an sm_80/sm_90 multiprocessor.
// MmaConfig<kHeadDim, kBlockM, kBlockN, kNWarps, kStages, kQInRegs, kMinBlocks>.
#pragma once

#include "cuda/03_mma/kernel.cuh"

namespace flashtile::detail::mma {

// The head dims that have their own kernel; any other multiple of 8 runs on the next one up.
inline constexpr int kSpecialisedHeadDims[] = {64, 96, 128, 256};

template <int kHeadDim>
struct MmaTraits;

// Measurement behind each choice: PENDING (filled in from bench/mma_variants.cu on the H200).
template <>
struct MmaTraits<64> : MmaConfig<64, 128, 64, 4, 2, true, 2> {};
template <>
struct MmaTraits<96> : MmaConfig<96, 128, 64, 4, 2, false, 2> {};
template <>
struct MmaTraits<128> : MmaConfig<128, 128, 64, 4, 2, false, 2> {};
template <>
struct MmaTraits<256> : MmaConfig<256, 64, 32, 4, 2, false, 2> {};

// The smallest specialised head dim that holds head_dim (0 when none does).
constexpr int specialised_head_dim(int64_t head_dim) {
  for (int d : kSpecialisedHeadDims)
    if (head_dim <= d) return d;
  return 0;
}

template <class T, int kHeadDim>
void run_mma_forward(const AttentionParams& p, cudaStream_t stream) {
  launch_mma_forward<T, MmaTraits<kHeadDim>>(p, stream);
}

// Instantiated once per head dim in hdim<D>.cu (so the four compile in parallel) and
// nowhere else: the dispatcher only sees these declarations.
#define FLASHTILE_MMA_INSTANTIATIONS(prefix, D)                                       \
  prefix template void run_mma_forward<__half, D>(const AttentionParams&, cudaStream_t); \
  prefix template void run_mma_forward<__nv_bfloat16, D>(const AttentionParams&, cudaStream_t);
FLASHTILE_MMA_INSTANTIATIONS(extern, 64)
FLASHTILE_MMA_INSTANTIATIONS(extern, 96)
FLASHTILE_MMA_INSTANTIATIONS(extern, 128)
FLASHTILE_MMA_INSTANTIATIONS(extern, 256)

}  // namespace flashtile::detail::mma
