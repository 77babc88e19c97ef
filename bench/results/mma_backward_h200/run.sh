#!/bin/bash
# Device run for the cuda_mma backward (carried, not committed). From .wt/bwd-cuda.
# Steps named in $STEPS: tests memcheck racecheck check peers fwdbwd.
set -uo pipefail
root=$PWD/../..
export LD_LIBRARY_PATH=$root/.device/deps/lib/x86_64-linux-gnu:$root/.device/deps/lib:${LD_LIBRARY_PATH:-}
B=/tmp/bins; mkdir -p $B; tar xJf .devbin/bins.tar.xz -C $B
T=$B/flashtile_cuda_mma_backward_tests; F=$B/flashtile
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
step() { local name=$1 lim=$2; shift 2; local t0=$SECONDS
  timeout $lim "$@" > $OUT/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $((SECONDS-t0))s"; grep -E "FAILED|Failure|ERROR SUMMARY|RACECHECK SUMMARY|PASSED|margin|Invalid|Race" $OUT/$name.log | head -${TAILN:-12}; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
san="Dtypes/CudaMmaBackwardGrid.VarlenMatchesOracle/bfloat16:CudaMmaBackward.EveryHeadDim*:CudaMmaBackward.Refuses*:CudaMmaBackward.Plan*"
want tests && step tests ${TEST_LIMIT:-200} $T
want memcheck && FLASHTILE_SMALL_GRID=1 step memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 1 $T --gtest_filter="$san"
want racecheck && FLASHTILE_SMALL_GRID=1 step racecheck 60 compute-sanitizer --tool racecheck --error-exitcode 1 $T --gtest_filter="Dtypes/CudaMmaBackwardGrid.VarlenMatchesOracle/bfloat16:CudaMmaBackward.EveryHeadDim*"
if want check; then step check 90 $F check --pass bwd --backends cuda_mma --shapes ${CHECK_SHAPES:-300}; tail -4 $OUT/check.log; fi
if want peers; then
  mkdir -p $OUT/peers
  step peers 150 python3 bench/peers.py --pass bwd --dtype bf16 --head-dims 64,128 --seqlens 1024,4096,16384 --backends cuda_mma --cli $F --out $OUT/peers
  tail -13 $OUT/peers.log
fi
if want fwdbwd; then
  step fwdbwd 60 $F bench --sweep --pass fwdbwd --backends cuda_mma --dtype bf16 --sweep-head-dims 64,128 --sweep-seqlens 1024,16384 --sweep-causal 0,1 --output /tmp/fwdbwd.json
  grep -E "cuda_mma" $OUT/fwdbwd.log | tail -9
fi
if want alt; then
  step alt 60 $B/flashtile_8w bench --sweep --pass bwd --backends cuda_mma --dtype bf16 --sweep-head-dims 64,128 --sweep-seqlens 1024,4096,16384 --sweep-causal 0,1 --output /tmp/alt.json
  grep -E "cuda_mma" $OUT/alt.log | tail -13
fi
exit 0
