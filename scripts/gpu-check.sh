#!/usr/bin/env bash
# One device call on the GPU machine: build, every GPU test, compute-sanitizer memcheck and
# racecheck, `flashtile check` (10,000 random cases per backend and dtype, variants included),
# the CLI's hardening reproducers, the default `flashtile bench`, the long-sequence run, the
# variants' bench lines, and the Python tests. A full run takes about 10 minutes.
# Usage (from the repo root, with .device/ carried: see scripts/stage-device-deps.sh):
#   scripts/gpu-check.sh [LOG_DIR]        # LOG_DIR defaults to ./gpu-check-logs
# PHASE=tests runs the build, the C++ suites and the sanitizers; PHASE=rest the build (a
# no-op on a warm machine) and everything after them, so that two calls of under 10
# minutes each cover it all; the default runs both.
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
# One build for everything: the C++ suites, the CLI and the Python package laid out in
# $build/python (FLASHTILE_BUILD_PYTHON), so the module is not compiled a second time by pip.
step configure cmake -S . -B $build -G Ninja -DCMAKE_PREFIX_PATH="$deps" \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" -DFLASHTILE_BUILD_PYTHON=ON \
  -DPython_EXECUTABLE="$(command -v python3)" ${CMAKE_EXTRA:-} || exit 1
step build ninja -C $build || exit 1
phase=${PHASE:-all}
if [ "$phase" != rest ]; then
step cuda_tests $build/tests/flashtile_cuda_tests
step cuda_mma_tests $build/tests/flashtile_cuda_mma_tests
OMP_WAIT_POLICY=passive step cpu_tests $build/tests/flashtile_cpu_tests
# Sanitizers on the small grids (FLASHTILE_SMALL_GRID drops the 1023/1025 lengths): every
# variant, varlen, every head dim, the narrow (unaligned) path and the refusals.
mma_subset="Dtypes/CudaMmaGrid.VariantsMatchOracle/bfloat16:Dtypes/CudaMmaGrid.VarlenMatchesOracle/bfloat16"
mma_subset+=":CudaMma.EveryHeadDim*:CudaMma.Misaligned*:CudaMma.Refuses*:Dtypes/CudaMmaGrid.MatchesOracle/float16"
for tool in memcheck racecheck; do
  FLASHTILE_SMALL_GRID=1 step $tool compute-sanitizer --tool $tool --error-exitcode 1 \
    $build/tests/flashtile_cuda_tests --gtest_filter="*MatchesOracle*:*Unsupported*"
  FLASHTILE_SMALL_GRID=1 step ${tool}_mma compute-sanitizer --tool $tool --error-exitcode 1 \
    $build/tests/flashtile_cuda_mma_tests --gtest_filter="$mma_subset"
done
fi
[ "$phase" = tests ] && { echo "gpu-check (tests): $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"; exit $status; }
step check $build/tools/flashtile check --shapes "${CHECK_SHAPES:-10000}"
step cli_hardening python3 tests/cli/test_hardening.py $build/tools/flashtile
TAIL=12 step bench $build/tools/flashtile bench
TAIL=12 step bench_long $build/tools/flashtile bench --seqlen 131072 --repeats 3 --warmup 1 \
  --backends cpu_standard,cuda_naive,cuda_tiled
# The variants' performance lines of issue 8 (16k, d=128, bf16): causal, window, softcap, ALiBi.
for variant in "" "--window 1024,0" "--softcap 30" "--alibi"; do
  TAIL=3 step "bench_variant${variant//[^a-z0-9]/_}" $build/tools/flashtile bench --dtype bf16 \
    --seqlen 16384 --heads 16 --head-dim 128 --causal $variant --backends cuda_mma --repeats 10
done
if [ -z "${SKIP_PYTHON:-}" ]; then
  # The package from the build above, against the image's torch/transformers.
  for f in tests/python/test_*.py; do  # one process per file: a crash cannot hide the rest
    PYTHONPATH=$PWD/$build/python step "pytest_$(basename "$f" .py)" \
      python3 -m pytest "$f" -q -rs -p no:cacheprovider
  done
fi
echo "gpu-check: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
