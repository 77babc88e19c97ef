// Tile sizes of cuda_sm90, one configuration per head dim, and the instantiations
// (one translation unit per head dim, so they compile in parallel).
// Sm90Config<kHeadDim, kBlockN, kWarpgroups, kStages, kMinBlocks>.
#pragma once

#include "cuda/04_sm90/kernel.cuh"
#include "cuda/04_sm90/sm90.hpp"

namespace flashtile::detail::sm90 {

template <int kHeadDim>
struct Sm90Traits;

// The first choice, not yet swept: two consumer warpgroups (128 query rows) share 128-key
// tiles, two stages (plus the producer warpgroup in steps 4.3-4.5). d=128: 32 KB of Q +
// 2·2·32 KB of K/V = 160 KB, one CTA per SM; d=64: 80 KB. A third stage fits at both
// (d=128: 224 KB of the 227 KB) and is the first thing to try for steps 4.4/4.5.
template <>
struct Sm90Traits<64> : Sm90Config<64, 128, 2, 2, 1> {};
template <>
struct Sm90Traits<128> : Sm90Config<128, 128, 2, 2, 1> {};
// d=256: 64-key tiles, so S (32 registers) and O (128) fit the consumers' 240 registers;
// 64 KB of Q + 2·2·32 KB of K/V = 192 KB.
template <>
struct Sm90Traits<256> : Sm90Config<256, 64, 2, 2, 1> {};

template <class T, int kHeadDim>
void run_sm90_forward(const AttentionParams& p, cudaStream_t stream, std::optional<Pipeline> pinned) {
  launch_sm90_forward<T, Sm90Traits<kHeadDim>>(p, stream, pinned);
}

// Instantiated in hdim<D>.cu and nowhere else: the dispatcher only sees these declarations.
#define FLASHTILE_SM90_INSTANTIATIONS(prefix, D)                                            \
  prefix template void run_sm90_forward<__half, D>(const AttentionParams&, cudaStream_t, \
                                                std::optional<Pipeline>); \
  prefix template void run_sm90_forward<__nv_bfloat16, D>(const AttentionParams&, cudaStream_t, \
                                                std::optional<Pipeline>);
FLASHTILE_SM90_INSTANTIATIONS(extern, 64)
FLASHTILE_SM90_INSTANTIATIONS(extern, 128)
FLASHTILE_SM90_INSTANTIATIONS(extern, 256)

}  // namespace flashtile::detail::sm90
