#!/usr/bin/env bash
# One device call for cuda_mma: timings first (idle GPU), then the GPU tests and
# compute-sanitizer (memcheck, racecheck) on a small filtered subset. Logs go to $OUT.
#   bash bench/mma_device_check.sh BUILD_DIR [perf|tests|all]
set -u
BUILD=${1:-build-h200}
WHAT=${2:-all}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
if ! "$BUILD/tests/flashtile_cuda_mma_tests" --gtest_list_tests > /dev/null 2>&1; then
  echo "carried binaries do not run here; rebuilding" | tee -a "$OUT/gpu.txt"
  cmake -S . -B build-dev -G Ninja -DFLASHTILE_BUILD_TOOLS=OFF -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DFLASHTILE_BUILD_MMA_VARIANTS=ON > "$OUT/rebuild.log" 2>&1 && ninja -C build-dev >> "$OUT/rebuild.log" 2>&1
  BUILD=build-dev
fi
if [[ $WHAT == perf || $WHAT == all ]]; then
  [[ -x $BUILD/flashtile_mma_variants ]] && timeout 120 "$BUILD/flashtile_mma_variants" 2>&1 | tee "$OUT/variants.txt"
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/peers.py --sweep-bin "$BUILD/flashtile_mma_sweep" \
    --out /tmp/peers ${PEERS_ARGS:-} > /tmp/peers_table.txt 2> "$OUT/peers.log"
  cat /tmp/peers_table.txt | tee -a "$OUT/peers.log"
  cp /tmp/peers/peers.json /tmp/peers/peers.csv "$OUT/"
fi
if [[ $WHAT == tests || $WHAT == all ]]; then
  SMALL='Dtypes/CudaMmaGrid.MatchesOracle/bfloat16:CudaMma.OtherHeadDims*:CudaMma.ScaleOfAnySign:CudaMma.Refuses*'
  FLASHTILE_SMALL_GRID=1 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BUILD/tests/flashtile_cuda_mma_tests" --gtest_filter="$SMALL" > "$OUT/memcheck.txt" 2>&1 &
  FLASHTILE_SMALL_GRID=1 timeout 300 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$BUILD/tests/flashtile_cuda_mma_tests" --gtest_filter="$SMALL" > "$OUT/racecheck.txt" 2>&1 &
  timeout 300 "$BUILD/tests/flashtile_cuda_mma_tests" > "$OUT/tests.txt" 2>&1
  echo "mma tests rc=$?"
  timeout 200 "$BUILD/tests/flashtile_cuda_tests" >> "$OUT/tests.txt" 2>&1
  echo "cuda (f32) tests rc=$?"
  wait
  cat "$OUT/memcheck.txt" "$OUT/racecheck.txt" > "$OUT/sanitizer.txt" && rm "$OUT/memcheck.txt" "$OUT/racecheck.txt"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/sanitizer.txt"
  grep -E "FAILED|PASSED|Failure|err |got " "$OUT/tests.txt" | head -40
fi
