#!/usr/bin/env bash
# Builds everything and runs every test: the C++ suites and the CLI through CTest, the
# examples/cpp consumer against the installed package, add_subdirectory and FetchContent,
# then the Python package (`pip install .`) through pytest. GPU tests skip without a CUDA device;
# torch/transformers/CuPy tests skip where those packages are missing (JAX is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
# Without a GPU the CUDA code can only be compiled, not run, so it is compiled once, by the
# C++ build: the mma.sync objects (cuda_mma, cuda_tf32x3) for sm_80 and everything else
# for sm_90a (the wgmma kernels; the sm_90 branches of the shared pieces), and the Python
# package is built without CUDA (measured in CI: the C++ build and the package's second
# CUDA compile were the two largest steps).
no_gpu=false
if command -v nvcc >/dev/null && ! nvidia-smi -L >/dev/null 2>&1; then no_gpu=true; fi
build_args=()
if $no_gpu; then build_args+=(-DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHTILE_MMA_ARCHITECTURES=80); fi
scripts/build.sh "${build_args[@]}"
ctest --test-dir build --output-on-failure -j "$(nproc)"
scripts/test-consumers.sh
python3 -m pip install -q --disable-pip-version-check numpy pytest ml_dtypes
# JAX before the package: `pip install .` builds flashtile.jax when jax is importable. A CPU
# jaxlib from PyPI, pinned; an existing jax with jax.ffi (the H200 image's CUDA one) is kept.
python3 -c "import jax.ffi" 2>/dev/null ||
  python3 -m pip install -q --disable-pip-version-check "jax==0.10.2" "jaxlib==0.10.2"
pip_args=()
if $no_gpu; then pip_args+=(-Ccmake.define.FLASHTILE_CUDA=OFF); fi
python3 -m pip install -q --disable-pip-version-check "${pip_args[@]}" .
python3 -m pytest tests/python -q
