#!/usr/bin/env bash
# Builds everything and runs every test: the C++ suites and the CLI through CTest, the
# examples/cpp consumer against the installed package, add_subdirectory and FetchContent,
# then the Python package (`pip install .`) through pytest. GPU tests skip without a CUDA device;
# torch/transformers/CuPy/JAX tests skip where those packages are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
scripts/test-consumers.sh
python3 -m pip install -q --disable-pip-version-check numpy pytest ml_dtypes
python3 -m pip install -q --disable-pip-version-check .
python3 -m pytest tests/python -q
