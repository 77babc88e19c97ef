#!/usr/bin/env bash
# flashtile as another CMake project's dependency, the three ways (examples/cpp): the package
# `cmake --install` lays out (from ./build, which scripts/build.sh made), add_subdirectory and
# FetchContent of this checkout. Each example runs attention and checks it against the oracle.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build-consumers
rm -rf "$out"
mkdir -p "$out"
cmake --install build --prefix "$out/prefix" > "$out/install.log"
declare -A ways=(
  [installed]="-DCMAKE_PREFIX_PATH=$PWD/$out/prefix"
  [add_subdirectory]="-DFLASHTILE_SOURCE_DIR=$PWD -DFLASHTILE_CUDA=OFF"
  [fetchcontent]="-DFLASHTILE_FETCH_FROM=$PWD -DFLASHTILE_CUDA=OFF"
)
for way in installed add_subdirectory fetchcontent; do
  echo "consumer ($way):"
  # shellcheck disable=SC2086
  cmake -S examples/cpp -B "$out/$way" -G Ninja ${ways[$way]} > "$out/$way.log" 2>&1 ||
    { cat "$out/$way.log"; exit 1; }
  cmake --build "$out/$way" >> "$out/$way.log" 2>&1 || { cat "$out/$way.log"; exit 1; }
  "$out/$way/flashtile_example"
done
