#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, ASan + UBSan) into ./build-fuzz and runs each for
# SECONDS (default 60) over its corpus in fuzz/corpus/<name>/, which keeps the inputs that
# once crashed as regression files. Any crash, sanitizer report or hang fails the run.
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
scripts/install-deps.sh
for p in clang libclang-rt-14-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="${missing:-} $p"
done
if [ -n "${missing:-}" ]; then
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq $missing >/dev/null
fi
cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DFLASHTILE_CUDA=OFF \
  -DFLASHTILE_SANITIZE=address,undefined,fuzzer-no-link -DFLASHTILE_BUILD_FUZZERS=ON \
  -DFLASHTILE_BUILD_TESTS=OFF -DFLASHTILE_BUILD_BENCHMARKS=OFF -DFLASHTILE_BUILD_TOOLS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz
for fuzzer in build-fuzz/fuzz/flashtile_fuzz_*; do
  name=$(basename "$fuzzer" | sed 's/^flashtile_fuzz_//')
  corpus=fuzz/corpus/$name
  mkdir -p "$corpus" build-fuzz/artifacts
  echo "fuzz: $name for ${seconds}s"
  # New inputs go to a scratch corpus; fuzz/corpus/<name> is read (regressions) and kept small.
  mkdir -p "build-fuzz/corpus-$name"
  "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix=build-fuzz/artifacts/ "build-fuzz/corpus-$name" "$corpus" 2>&1 | tail -n 15
done
