#!/usr/bin/env bash
# Installs missing dependencies and builds everything into ./build (Release; CUDA backends
# when nvcc is found, for sm_80, sm_89 and sm_90a).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
cmake -S . -B build -G Ninja -DPython3_EXECUTABLE="$(command -v python3)" "$@"
cmake --build build
