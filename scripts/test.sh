#!/usr/bin/env bash
# Builds everything and runs every test: the C++ suites and the CLI through CTest, the
# examples/cpp consumer against the installed package, add_subdirectory and FetchContent,
# then the Python package (`pip install .`) through pytest. GPU tests skip without a CUDA device;
# torch/transformers/CuPy tests skip where those packages are missing (JAX is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
scripts/test-consumers.sh
python3 -m pip install -q --disable-pip-version-check numpy pytest ml_dtypes
# JAX before the package: `pip install .` builds flashtile.jax when jax is importable. A CPU
# jaxlib from PyPI, pinned; an existing jax with jax.ffi (the H200 image's CUDA one) is kept.
python3 -c "import jax.ffi" 2>/dev/null ||
  python3 -m pip install -q --disable-pip-version-check "jax==0.10.2" "jaxlib==0.10.2"
# Without a GPU the package's CUDA code can only be compiled, not run: one architecture
# (sm_80) is enough to compile all of it except cuda_sm90, which the C++ build above covers.
pip_args=()
if command -v nvcc >/dev/null && ! nvidia-smi -L >/dev/null 2>&1; then
  pip_args+=(-Ccmake.define.CMAKE_CUDA_ARCHITECTURES=80)
fi
python3 -m pip install -q --disable-pip-version-check "${pip_args[@]}" .
python3 -m pytest tests/python -q
