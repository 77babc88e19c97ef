#!/usr/bin/env bash
# Twelfth session, call 1 (H200): the first cuda_sm90 backward (step 4b.1, wgmma with cp.async
# loads) on the device.
#  1. its tests (small grid) and the refusals; memcheck/racecheck on a small subset
#  2. the backward sweep, cuda_mma and cuda_sm90 side by side, and cuda_mma on the previous
#     session's binary (old) for the refactor's A/B (shared passes; the kernel's SASS differs
#     in register allocation only)
set -u
L=$OUT/s12c1; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
B=/tmp/s12bin
mkdir -p $B/new $B/old
for f in .devbin/new/*.xz; do xz -dc $f > $B/new/$(basename $f .xz) & done
xz -dc .devbin/old/flashtile.xz > $B/old/flashtile & wait; chmod +x $B/new/* $B/old/*
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $L/gpu.txt 2>&1
note start
T=$B/new/flashtile_cuda_backward_tests
FLASHTILE_SMALL_GRID=1 timeout 150 $T --gtest_filter='*cuda_sm90*:CudaSm90Backward.*' > $L/sm90_grid.log 2>&1
note "sm90 grid rc=$? $(grep -hE '^\[  (PASSED|FAILED) ' $L/sm90_grid.log | tr '\n' ' ')"
SW="--sweep --pass bwd --dtype bf16 --sweep-head-dims 64,128 --sweep-seqlens 4096,16384 --sweep-causal 0,1 --repeats 10 --warmup 2"
timeout 100 $B/new/flashtile bench $SW --backends cuda_sm90,cuda_mma > $L/bench_new.log 2>&1
note "bench new rc=$?"
timeout 60 $B/old/flashtile bench $SW --backends cuda_mma > $L/bench_old.log 2>&1
note "bench old rc=$?"
FLASHTILE_SMALL_GRID=1 timeout 120 $T --gtest_filter='CudaBackward.*' > $L/shared_tests.log 2>&1
note "shared tests rc=$? $(grep -hE '^\[  (PASSED|FAILED) ' $L/shared_tests.log | tr '\n' ' ')"
SUB='BackendsAndDtypes/CudaBackwardGrid.VarlenMatchesOracle/cuda_sm90_bfloat16:CudaSm90Backward.*'
for tool in memcheck racecheck; do
  FLASHTILE_SMALL_GRID=1 timeout 60 compute-sanitizer --tool $tool --error-exitcode 1 $T --gtest_filter="$SUB" > $L/$tool.log 2>&1
  note "$tool rc=$? $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log | tr '\n' ' ')"
done
tar czf $OUT/s12c1.tgz -C $OUT s12c1
