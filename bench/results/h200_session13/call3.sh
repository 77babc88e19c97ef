#!/usr/bin/env bash
# Thirteenth session, call 3 (H200): issue 10's transformers line on CUDA: the Python module
# built on the device (sm_90a), then tests/python/test_training.py (a random-weight Llama
# trains 20 steps with attn_implementation=FlashTile against sdpa, on cpu and cuda) and
# test_backward.py (the backward's Python API, opcheck and gradcheck) through gpu-check.sh.
set -u
PHASE=rest REST=python BUILD_TARGETS="_flashtile flashtile_python_files" LIMIT=420 \
  PYTHON_TESTS="tests/python/test_training.py tests/python/test_backward.py" PYTEST_LIMIT=200 \
  TAIL=12 bash scripts/gpu-check.sh $OUT/s13c3
