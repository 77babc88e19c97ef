#!/usr/bin/env bash
# The CPU test suites under AddressSanitizer and UndefinedBehaviorSanitizer (CI runs this
# after scripts/test.sh). CPU-only build into ./build-asan; any report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build-asan -G Ninja -DFLASHTILE_CUDA=OFF -DFLASHTILE_SANITIZE=address,undefined \
  -DFLASHTILE_BUILD_TOOLS=OFF -DFLASHTILE_BUILD_BENCHMARKS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build-asan --target flashtile_cpu_tests
# detect_leaks: the suites own every allocation; halt_on_error via -fno-sanitize-recover.
OMP_WAIT_POLICY=passive ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
  build-asan/tests/flashtile_cpu_tests --gtest_brief=1
