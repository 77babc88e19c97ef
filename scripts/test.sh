#!/usr/bin/env bash
# Builds everything and runs every test: the C++ suites and the CLI through CTest (GPU tests
# skip without a CUDA device).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
