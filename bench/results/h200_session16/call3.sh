#!/usr/bin/env bash
# Sixteenth session, call 3: the same binaries as call 2 (main at 5c6f67d). Which pipeline
# each d=128 / d=256 point should take now that O's rescale is skipped (4.12a): every
# warp-specialised pipeline pinned over seqlen 1k-16k, full and causal, bf16; then the
# racecheck test that call 2's 100 s limit cut off.
set -u
L=$OUT/s16c3; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
pack() { tar czf $OUT/s16c3.tgz -C $OUT s16c3; }
B=/tmp/s16c
if [ ! -x $B/flashtile ]; then mkdir -p $B; for f in flashtile flashtile_cuda_sm90_tests; do
  (xz -dc .devbin/c/$f.xz > $B/$f; chmod +x $B/$f) & done; wait; fi
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader > $L/gpu.txt 2>&1
note "start; $(cat $L/gpu.txt)"
SW="--sweep --dtype bf16 --repeats 10 --warmup 2 --backends cuda_sm90 --sweep-seqlens 1024,2048,4096,8192,16384 --sweep-causal 0,1"
for pin in "" tma_ws tma_ws_overlap tma_ping_pong tma_persistent; do
  FLASHTILE_SM90_PIPELINE=$pin timeout 60 $B/flashtile bench $SW --sweep-head-dims 128,256 > $L/pin_${pin:-default}.log 2>&1
  note "pin ${pin:-default} rc=$? $(grep -E 'TFLOP/s' $L/pin_${pin:-default}.log | grep -v backend | awk '{printf "%s ", $1}')"
  pack
done
FLASHTILE_SMALL_GRID=1 timeout 100 compute-sanitizer --tool racecheck --error-exitcode 1 $B/flashtile_cuda_sm90_tests \
  --gtest_filter="Dtypes/CudaSm90Grid.BlocksThatSeeNoKeyWriteZerosOnEveryRun/float16:CudaSm90BlockM192.RefusesOtherHeadDimsAndVarlen" > $L/racecheck_rest.log 2>&1
note "racecheck rest rc=$? $(grep -hE 'RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' $L/racecheck_rest.log | tr '\n' ' ')"
pack
