#!/usr/bin/env bash
# Step 4.7's one device call (from the worktree): tests, the d=64 A/B and peers, sanitizers.
set -uo pipefail
L=$OUT/l; mkdir -p $L /tmp/bin; tar xzf .devbin/bin.tgz -C /tmp/bin
export LD_LIBRARY_PATH=$PWD/../../.device/deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
T=/tmp/bin/flashtile_cuda_sm90_tests; F=/tmp/bin/flashtile; t00=$SECONDS
step() { local n=$1 t=$2; shift 2; local t0=$SECONDS; timeout $t "$@" > $L/$n.log 2>&1; local rc=$?
  echo "== $n rc=$rc $((SECONDS-t0))s (at $((SECONDS-t00))s): $(grep -E 'PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY' $L/$n.log | tr '\n' ' ' | cut -c1-400)"
  tar czf $OUT/logs.tgz -C $OUT l; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
F4="Sm90Pieces.*:CudaSm90BlockM192.*:CudaSm90.ScaleOfAnySign:CudaSm90.DeterministicOver100Runs:Dtypes/CudaSm90Grid.EveryPipelineMatchesOracle/bfloat16"
FLASHTILE_SMALL_GRID=1 step tests 20 $T --gtest_filter="$F4"
ab() { FLASHTILE_SM90_PIPELINE=$1 step ab_$2_$1 8 $F bench --sweep --sweep-seqlens 4096,16384 --sweep-head-dims 64 \
  --sweep-causal 0,1 --dtype $2 --backends cuda_sm90 --repeats 10 --warmup 2 --output $L/ab_$2_$1.csv; }
for pin in tma_ws_m192 tma_ping_pong_m192 tma_ws_overlap_m192; do ab $pin bf16; done
FLASHTILE_SM90_PIPELINE=tma_ws PYTHONUNBUFFERED=1 step peers 25 python3 bench/peers.py --cli $F --backends cuda_sm90 \
  --peers flash,cudnn --dtype bf16 --head-dims 64 --seqlens 2048,4096,16384 --cli-repeats 10 --cli-warmup 2 --out $L
for pin in tma_ws tma_ws_m192 tma_ping_pong_m192 tma_ws_overlap_m192; do ab $pin f16; done
FLASHTILE_SMALL_GRID=1 step memcheck 8 compute-sanitizer --tool memcheck --error-exitcode 1 $T \
  --gtest_filter='CudaSm90BlockM192.VariantsMatchOracle:CudaSm90BlockM192.RefusesOtherHeadDimsAndVarlen'
FLASHTILE_SMALL_GRID=1 step racecheck 10 compute-sanitizer --tool racecheck --error-exitcode 1 $T \
  --gtest_filter='CudaSm90BlockM192.VariantsMatchOracle'
for f in $L/ab_*.log; do echo "${f##*/}: $(grep -oE '[0-9.]+ TFLOP/s' $f | tr '\n' ' ')"; done
grep -E "cudnn|flash " $L/peers.log | head -12
