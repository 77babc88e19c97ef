#!/usr/bin/env bash
# Installs what flashtile's build and tests need and the machine lacks; safe to re-run.
# Debian/Ubuntu packages: cmake, ninja, g++, GoogleTest, Google Benchmark, CLI11, Highway,
# OpenMP; Python: numpy (for the CLI's .npy tests). The CUDA toolkit is optional (nvcc on
# PATH or in /usr/local/cuda enables the GPU backends).
set -euo pipefail
packages=(cmake ninja-build g++ libgtest-dev libbenchmark-dev libcli11-dev libhwy-dev libomp-dev
          python3 python3-pip)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi
python3 - <<'PY' 2>/dev/null || python3 -m pip install -q numpy
import numpy
PY
