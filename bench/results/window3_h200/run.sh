#!/usr/bin/env bash
# (Run once, 2026-12-01 23:13 UTC, on commit 645bfee; the persistent kernel and its tests were
# removed after it: docs/JOURNEY.md 3h. The logs beside this script are that call's.)
# One device call for cuda_mma's persistent window schedule (docs/JOURNEY.md 3h), on binaries
# built on the dev machine for sm_90a (stripped, xz-compressed in .devbin/ of this worktree):
#   flashtile_cuda_mma_tests, flashtile_mma_variants (its "block-major (3g)" row is main's
#   library kernel for these calls), flashtile-new (this tree's CLI) and flashtile-main
#   (main's CLI at f3b4542, for the A/B in the same call).
# The `run` tool sends /work/main; this worktree travels as the carried .wt/window3:
#   cd .wt/window3 && bash bench/results/window3_h200/run.sh
# Order: the timings first, with the GPU to themselves; then the suite beside
# compute-sanitizer memcheck and racecheck on the window tests. Logs come back as
# $OUT/logs.tgz, the harness's CSV as $OUT/window_shapes.csv.
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$(cd ../..; pwd)
export LD_LIBRARY_PATH=$root/.device/deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=${OUT:-/tmp/window3-out}; logs=/tmp/window3-logs/logs; bin=/tmp/window3-bin
mkdir -p "$out" "$logs" "$bin"
t0=$SECONDS
note() { echo "[$((SECONDS - t0)) s] $*"; }
pack() { tar czf "$out/logs.tgz" -C /tmp/window3-logs logs; }
for f in .devbin/*.xz; do xz -dc "$f" > "$bin/$(basename "$f" .xz)" & done; wait
chmod +x "$bin"/*
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv > "$logs/gpu.txt" 2>&1; cat "$logs/gpu.txt"
note "unpacked: $(ls "$bin" | tr '\n' ' ')"

# 1. Timings. The harness: the grid (before 3g), block-major (3g, main's library kernel) and
# persistent block-major (3h) at windows 512..4096. The CLI line: main's binary and this
# tree's, alternating, for causal, window (1024, 0) and full.
timeout 30 "$bin/flashtile_mma_variants" --window-only --csv "$out/window_shapes.csv" \
  > "$logs/window_shapes.log" 2>&1; echo "rc=$?" >> "$logs/window_shapes.log"
grep -E "window|rc=" "$logs/window_shapes.log"; pack
line=(bench --dtype bf16 --seqlen 16384 --heads 16 --head-dim 128 --backends cuda_mma --repeats 10)
for what in "causal:--causal" "window:--causal --window 1024,0" "full:"; do
  name=${what%%:*}; args=${what#*:}
  for tree in main new; do
    # shellcheck disable=SC2086
    timeout 20 "$bin/flashtile-$tree" "${line[@]}" $args > "$logs/cli_${tree}_$name.log" 2>&1
    echo "$tree $name: $(grep -E '^cuda_mma ' "$logs/cli_${tree}_$name.log")"
  done
done
note "timings done"; pack

# 2. The suite: the window tests on their full sizes, the rest on the small grid (their
# kernels are main's, instruction for instruction), beside the sanitizers (small grid).
T=$bin/flashtile_cuda_mma_tests
W='CudaMma.Window*:CudaMma.Persistent*'
export OMP_NUM_THREADS=5
( timeout 65 "$T" --gtest_filter="$W" > "$logs/window_tests.log" 2>&1
  echo "rc=$?" >> "$logs/window_tests.log" ) &
( FLASHTILE_SMALL_GRID=1 timeout 65 "$T" --gtest_filter="-$W" > "$logs/other_tests.log" 2>&1
  echo "rc=$?" >> "$logs/other_tests.log" ) &
( FLASHTILE_SMALL_GRID=1 timeout 28 compute-sanitizer --tool memcheck --error-exitcode 1 "$T" \
    --gtest_filter="$W" > "$logs/memcheck_window.log" 2>&1
  echo "rc=$?" >> "$logs/memcheck_window.log"
  FLASHTILE_SMALL_GRID=1 timeout 35 compute-sanitizer --tool racecheck --error-exitcode 1 "$T" \
    --gtest_filter='CudaMma.PersistentWindowWalksManyBlocksPerCta' \
    > "$logs/racecheck_window.log" 2>&1; echo "rc=$?" >> "$logs/racecheck_window.log" ) &
wait
note "suite and sanitizers done"
for f in window_tests other_tests memcheck_window racecheck_window; do
  echo "== $f"; grep -E "PASSED|FAILED|SUMMARY|^rc=|margin|OK \]" "$logs/$f.log" | tail -14
done
pack
