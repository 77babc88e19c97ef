#!/usr/bin/env bash
# Eleventh session, call 3 (H200): every GPU suite of this session's tree (common.cuh's device
# facts and the split forward's callback reach every CUDA backend), built on the dev machine
# for sm_90a; the backward on its small grid; memcheck on gpu-check.sh's cuda_mma and
# cuda_sm90 subsets; the CPU suite on the host's 16 cores.
set -u
L=$OUT/s11c3; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
B=/tmp/s11bin/new; mkdir -p $B
for f in .devbin/new/*.xz; do xz -dc $f > $B/$(basename $f .xz) & done
wait; chmod +x $B/*
note unpacked
mma_subset="Dtypes/CudaMmaGrid.VariantsMatchOracle/bfloat16:Dtypes/CudaMmaGrid.VarlenMatchesOracle/bfloat16"
mma_subset+=":CudaMma.EveryHeadDim*:CudaMma.Misaligned*:CudaMma.Refuses*:CudaMma.SplitCallsFromTwoThreads*"
sm90_subset="Sm90Pieces.*:Dtypes/CudaSm90Grid.EveryPipelineMatchesOracle/bfloat16:CudaSm90.ScaleOfAnySign:CudaSm90.Refuses*"
FLASHTILE_SMALL_GRID=1 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 1 $B/flashtile_cuda_mma_tests --gtest_filter="$mma_subset" > $L/memcheck_mma.log 2>&1 &
FLASHTILE_SMALL_GRID=1 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 1 $B/flashtile_cuda_sm90_tests --gtest_filter="$sm90_subset" > $L/memcheck_sm90.log 2>&1 &
timeout 320 $B/flashtile_cuda_tests > $L/cuda_tests.log 2>&1 &
timeout 320 $B/flashtile_cuda_mma_tests > $L/cuda_mma_tests.log 2>&1 &
timeout 320 $B/flashtile_cuda_sm90_tests > $L/cuda_sm90_tests.log 2>&1 &
FLASHTILE_SMALL_GRID=1 timeout 320 $B/flashtile_cuda_mma_backward_tests > $L/cuda_mma_backward_tests.log 2>&1 &
OMP_WAIT_POLICY=passive timeout 320 $B/flashtile_cpu_tests --gtest_brief=1 > $L/cpu_tests.log 2>&1 &
wait
{ for f in $L/*.log; do echo "$(basename $f): $(grep -hE '^\[  (PASSED|FAILED|  SKIPPED) |ERROR SUMMARY|tests ran' $f | tr '\n' ' ')"; done; } > $L/summary.txt
note done
cat $L/summary.txt
tar czf $OUT/s11c3.tgz -C $OUT s11c3
