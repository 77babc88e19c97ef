// cpu_flash's per-target entry points, the functions flash_hwy.cpp's dispatch table holds.
//
// The forward kernels are compiled in three translation units so that a build's cores share
// them (under ASan + UBSan the single file took ~6 minutes of one core, CI's critical path):
// flash_hwy_avx3.cpp (AVX3), flash_hwy_avx2.cpp (AVX2) and flash_hwy.cpp (every other target
// and the dispatch). Each of them walks every target of the build through
// hwy/foreach_target.h and includes this header once per target: it declares the entry
// points of every target and defines them only for the targets the including file owns,
// FLASHTILE_HWY_OWNS_TARGET (an expression of HWY_TARGET, defined by that file). The kernels
// header is parsed on every pass (its templates cost nothing where they are not used) so that
// its re-inclusion guard stays in step with the passes.
#if defined(FLASHTILE_CPU_FLASH_ENTRIES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FLASHTILE_CPU_FLASH_ENTRIES_INL_H_
#undef FLASHTILE_CPU_FLASH_ENTRIES_INL_H_
#else
#define FLASHTILE_CPU_FLASH_ENTRIES_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include "cpu/flash.hpp"
#include "cpu/flash_kernels-inl.hpp"
#include "hwy/highway.h"

#ifndef FLASHTILE_HWY_OWNS_TARGET
#error "define FLASHTILE_HWY_OWNS_TARGET before including cpu/flash_entries-inl.hpp"
#endif

HWY_BEFORE_NAMESPACE();
namespace flashtile::detail::cpu_flash::HWY_NAMESPACE {

void RunQueryBlockEntry(const AttentionParams& p, int64_t b, int64_t h, int64_t qb,
                        float* scratch, const KvCache& cache, const TaskSplit& split);
Geometry GetGeometryEntry(int64_t head_dim);
void VectorExpEntry(const float* x, float* y, size_t n);
void VectorTanhEntry(const float* x, float* y, size_t n);
void OnlineSoftmaxLanesEntry(float* scores, int64_t keys, int64_t rows, float* m, float* l,
                             float* alpha);

#if FLASHTILE_HWY_OWNS_TARGET
void RunQueryBlockEntry(const AttentionParams& p, int64_t b, int64_t h, int64_t qb,
                        float* scratch, const KvCache& cache, const TaskSplit& split) {
  RunQueryBlock(p, b, h, qb, scratch, cache, split);
}
Geometry GetGeometryEntry(int64_t head_dim) { return GetGeometry(head_dim); }
void VectorExpEntry(const float* x, float* y, size_t n) { VectorExp(x, y, n); }
void VectorTanhEntry(const float* x, float* y, size_t n) { VectorTanh(x, y, n); }
void OnlineSoftmaxLanesEntry(float* scores, int64_t keys, int64_t rows, float* m, float* l,
                             float* alpha) {
  OnlineSoftmaxLanes(scores, keys, rows, m, l, alpha);
}
#endif

}  // namespace flashtile::detail::cpu_flash::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
