#!/usr/bin/env bash
# Copies the small libraries that the H200 image lacks (CLI11, Highway, GoogleTest and Google
# Benchmark builds) from this machine's Debian packages into .device/deps, a CMake prefix that
# device calls carry (`carry: [".device"]`) and pass as -DCMAKE_PREFIX_PATH=$PWD/.device/deps.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=.device/deps
rm -rf "$prefix"
mkdir -p "$prefix/include" "$prefix/share/cmake" "$prefix/lib/x86_64-linux-gnu/cmake"
cp -r /usr/include/CLI "$prefix/include/"
cp -r /usr/share/cmake/CLI11 "$prefix/share/cmake/"
cp -r /usr/include/hwy "$prefix/include/"
cp -r /usr/lib/x86_64-linux-gnu/cmake/hwy "$prefix/lib/x86_64-linux-gnu/cmake/"
cp -P /usr/lib/x86_64-linux-gnu/libhwy*.so* "$prefix/lib/x86_64-linux-gnu/"
# GoogleTest as built libraries (the image may carry only its sources).
cp -r /usr/include/gtest /usr/include/gmock "$prefix/include/"
cp /usr/lib/x86_64-linux-gnu/libgtest*.a /usr/lib/x86_64-linux-gnu/libgmock*.a "$prefix/lib/x86_64-linux-gnu/"
cp -r /usr/lib/x86_64-linux-gnu/cmake/GTest "$prefix/lib/x86_64-linux-gnu/cmake/"
# Google Benchmark, for bench/micro (-DFLASHTILE_BUILD_BENCHMARKS=ON there).
cp -r /usr/include/benchmark "$prefix/include/"
cp -P /usr/lib/x86_64-linux-gnu/libbenchmark*.so* /usr/lib/x86_64-linux-gnu/libbenchmark*.a \
  "$prefix/lib/x86_64-linux-gnu/"
cp -r /usr/lib/x86_64-linux-gnu/cmake/benchmark "$prefix/lib/x86_64-linux-gnu/cmake/"
du -sh "$prefix"
