#!/usr/bin/env bash
# The CPU test suites under sanitizers. CPU-only builds; any report fails the run.
#   scripts/sanitize.sh            AddressSanitizer + UndefinedBehaviorSanitizer (CI runs this)
#   scripts/sanitize.sh thread     ThreadSanitizer, with OpenMP teams of one thread: libgomp is
#                                  not instrumented, so TSan cannot see its barriers and reports
#                                  every parallel region; flashtile's own concurrency (many host
#                                  threads calling forward) is what this checks.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-address}
scripts/install-deps.sh
# cpu_flash's Highway kernels, compiled once per SIMD target under the sanitizers, are the
# longest step of this build (362 s of one core for AVX3 + AVX2 + SCALAR in one file; now
# three files, src/cpu/flash_hwy{,_avx2,_avx3}.cpp, that compile in parallel): SSE4 is left
# out here (FLASHTILE_SKIP_SSE4, src/cpu/flash_targets.hpp), since AVX2 runs the same
# 16-register tiles, AVX3 the 32-register ones and SCALAR the fallback. Line tables only
# (-g1): enough for the reports' stacks and the suppressions, and quicker than full -g.
configure() {  # configure DIR SANITIZERS
  cmake -S . -B "$1" -G Ninja -DFLASHTILE_CUDA=OFF -DFLASHTILE_SANITIZE="$2" \
    -DFLASHTILE_BUILD_TOOLS=OFF -DFLASHTILE_BUILD_BENCHMARKS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS="-DFLASHTILE_SKIP_SSE4=1"
  cmake --build "$1" --target flashtile_cpu_tests
}
# Runs a GoogleTest binary in $(nproc) shards at once (the suite under ASan took 218 s of
# one process in CI), each shard's output after the others; fails if any shard does.
run_sharded() {  # run_sharded BINARY ARGS...
  local shards pids=() rc=0 i
  shards=$(nproc)
  for ((i = 0; i < shards; ++i)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "$@" > "$(dirname "$1")/shard$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || rc=1
    cat "$(dirname "$1")/shard$i.log"
  done
  return $rc
}
if [ "$mode" = thread ]; then
  configure build-tsan thread
  # The one test that sets OpenMP team sizes itself is left out (see above).
  OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 \
    build-tsan/tests/flashtile_cpu_tests --gtest_brief=1 \
    --gtest_filter=-CpuFlash.ThreadCountDoesNotChangeOneBit
else
  configure build-asan address,undefined
  OMP_WAIT_POLICY=passive UBSAN_OPTIONS=print_stacktrace=1 \
    ASAN_OPTIONS=detect_leaks=1:malloc_context_size=4 LSAN_OPTIONS=suppressions=$PWD/scripts/lsan.supp \
    run_sharded build-asan/tests/flashtile_cpu_tests --gtest_brief=1
fi
