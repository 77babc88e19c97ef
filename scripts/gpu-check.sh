#!/usr/bin/env bash
# One device call on the GPU machine: build, every GPU test, compute-sanitizer memcheck and
# racecheck, `flashtile check`, the default `flashtile bench`, and the long-sequence run.
# Usage (from the repo root, with .device/ carried: see scripts/stage-device-deps.sh):
#   scripts/gpu-check.sh [LOG_DIR]        # LOG_DIR defaults to ./gpu-check-logs
# Under the device tool ($OUT set) the logs also come back as $OUT/gpu-check-logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${1:-gpu-check-logs}
mkdir -p "$logs"
build=build-gpu
deps=$PWD/.device/deps
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
status=0
step() {  # step NAME COMMAND...: run, log to $logs/NAME.log, remember failures
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  echo "    rc=$rc ($((SECONDS - t0)) s); tail:"; tail -n "${TAIL:-6}" "$logs/$name.log" | sed 's/^/    /'
  [ $rc -eq 0 ] || status=1
  # Refresh the archive after every step, so a call cut short still returns its logs.
  [ -n "${OUT:-}" ] && tar czf "$OUT/gpu-check-logs.tgz" "$logs"
  return $rc
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$logs/gpu.txt" 2>&1
cat "$logs/gpu.txt"
step configure cmake -S . -B $build -G Ninja -DCMAKE_PREFIX_PATH="$deps" \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" ${CMAKE_EXTRA:-} || exit 1
step build ninja -C $build || exit 1
step cuda_tests $build/tests/flashtile_cuda_tests
step cuda_mma_tests $build/tests/flashtile_cuda_mma_tests
step cpu_tests $build/tests/flashtile_cpu_tests
# Sanitizers on the oracle grids without the 1023/1025 lengths (FLASHTILE_SMALL_GRID).
for tool in memcheck racecheck; do
  FLASHTILE_SMALL_GRID=1 step $tool compute-sanitizer --tool $tool --error-exitcode 1 \
    $build/tests/flashtile_cuda_tests --gtest_filter="*MatchesOracle*:*Unsupported*"
  FLASHTILE_SMALL_GRID=1 step ${tool}_mma compute-sanitizer --tool $tool --error-exitcode 1 \
    $build/tests/flashtile_cuda_mma_tests \
    --gtest_filter="Dtypes/CudaMmaGrid.MatchesOracle/bfloat16:CudaMma.OtherHeadDims*:CudaMma.Refuses*"
done
step check $build/tools/flashtile check
TAIL=12 step bench $build/tools/flashtile bench
TAIL=12 step bench_long $build/tools/flashtile bench --seqlen 131072 --repeats 3 --warmup 1 \
  --backends cpu_standard,cuda_naive,cuda_tiled
if [ -z "${SKIP_PYTHON:-}" ]; then
  # The Python package against the image's torch/transformers (no network: no isolation).
  step pip_install python3 -m pip install --no-build-isolation --no-deps . \
    -Ccmake.define.CMAKE_PREFIX_PATH="$deps" -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90a
  for f in tests/python/test_*.py; do  # one process per file: a crash cannot hide the rest
    step "pytest_$(basename "$f" .py)" python3 -m pytest "$f" -q -rs -p no:cacheprovider
  done
fi
echo "gpu-check: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
