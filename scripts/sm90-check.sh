#!/usr/bin/env bash
# One device call for cuda_sm90 on the H200 (issue 9): the sm90 unit and attention tests,
# compute-sanitizer memcheck and racecheck on a small subset, and the bench of cuda_sm90
# beside cuda_mma (bf16, the field's grid at seqlen 4k and 16k, d 64/128, causal and not),
# on each load path.
# Uses binaries built elsewhere for sm_90a when BIN names them and they run here, else
# builds the two targets it needs. Logs go to ./sm90-check-logs; under the device tool they
# also come back as $OUT/sm90-check-logs.tgz, refreshed after every step.
# Usage (repo root, .device/ carried): scripts/sm90-check.sh [BIN_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
logs=sm90-check-logs
mkdir -p "$logs"
deps=${DEPS:-$PWD/.device/deps}
[ -d "$deps" ] || deps=$PWD/../../.device/deps  # run from a worktree under .wt/
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bin=${1:-}
step() {  # step NAME SECONDS COMMAND...: run under a time limit, log, print the tail
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  echo "    rc=$rc ($((SECONDS - t0)) s)"; tail -n "${TAIL:-4}" "$logs/$name.log" | sed 's/^/    /'
  [ -n "${OUT:-}" ] && tar czf "$OUT/sm90-check-logs.tgz" "$logs"
  return $rc
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [ -z "$bin" ] || ! "$bin/flashtile_cuda_sm90_tests" --gtest_list_tests >/dev/null 2>&1 ||
   ! "$bin/flashtile" info >/dev/null 2>&1; then
  echo "carried binaries do not run here: building"
  build=/tmp/build-sm90
  step configure 120 cmake -S . -B $build -G Ninja -DCMAKE_PREFIX_PATH="$deps" \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHTILE_BUILD_BENCHMARKS=OFF || exit 1
  step build 300 ninja -C $build flashtile_cuda_sm90_tests flashtile_cli || exit 1
  mkdir -p $build/bin && cp $build/tests/flashtile_cuda_sm90_tests $build/bin/ &&
    cp $build/tools/flashtile $build/bin/
  bin=$build/bin
fi
TAIL=8 step pieces 30 "$bin/flashtile_cuda_sm90_tests" --gtest_filter='Sm90Pieces.*'
# A smoke run of the default pipeline first: if it fails or hangs, the rest of the call runs
# on the previous step (and the tests get less time), so the call still returns numbers.
if ! FLASHTILE_SMALL_GRID=1 step smoke 20 "$bin/flashtile_cuda_sm90_tests" \
     --gtest_filter='Dtypes/CudaSm90Grid.MatchesOracle/bfloat16'; then
  echo "!!! the default pipeline failed its smoke run: pinning ${FALLBACK:=tma_ws_overlap}"
  export FLASHTILE_SM90_PIPELINE=$FALLBACK TEST_LIMIT=30
fi
TAIL=12 step tests ${TEST_LIMIT:-90} "$bin/flashtile_cuda_sm90_tests" --gtest_filter='-Sm90Pieces.*'
# The default pipeline (dense calls) beside cuda_mma; the sanitizers; then every older
# pipeline pinned through FLASHTILE_SM90_PIPELINE (cuda_sm90 alone); last, fp16 and the
# shorter sequences on the default pipeline beside cuda_mma, for the selector.
sweep=(--sweep --sweep-seqlens 4096,16384 --sweep-head-dims 64,128 --sweep-causal 0,1 --dtype bf16)
TAIL=20 step bench ${BENCH_LIMIT:-40} "$bin/flashtile" bench "${sweep[@]}" \
  --backends cuda_sm90,cuda_mma --output "$logs/sm90_bench_default.csv"
subset='Sm90Pieces.*:Dtypes/CudaSm90Grid.EveryPipelineMatchesOracle/bfloat16:CudaSm90.ScaleOfAnySign:CudaSm90.Refuses*'
FLASHTILE_SMALL_GRID=1 step memcheck ${SAN_LIMIT:-40} compute-sanitizer --tool memcheck \
  --error-exitcode 1 "$bin/flashtile_cuda_sm90_tests" --gtest_filter="$subset"
FLASHTILE_SMALL_GRID=1 step racecheck ${SAN_LIMIT:-40} compute-sanitizer --tool racecheck \
  --error-exitcode 1 "$bin/flashtile_cuda_sm90_tests" \
  --gtest_filter='Sm90Pieces.*:CudaSm90.ScaleOfAnySign:Dtypes/CudaSm90Grid.EveryPipelineMatchesOracle/bfloat16'
for pipeline in ${PIPELINES:-tma_ws_overlap tma_ws tma cp_async}; do
  FLASHTILE_SM90_PIPELINE=$pipeline TAIL=10 step bench_$pipeline ${BENCH_LIMIT:-40} \
    "$bin/flashtile" bench "${sweep[@]}" --backends cuda_sm90 --output "$logs/sm90_bench_$pipeline.csv"
done
TAIL=30 step bench_grid_f16 ${BENCH_LIMIT:-40} "$bin/flashtile" bench --sweep \
  --sweep-seqlens 512,1024,2048 --sweep-head-dims 64,128 --sweep-causal 0,1 \
  --backends cuda_sm90,cuda_mma --dtype f16 --output "$logs/sm90_bench_grid_f16.csv"
