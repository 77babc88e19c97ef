#!/usr/bin/env bash
# Twelfth session, call 6 (H200): the final tree (row stats and the main-kernel launch
# shared by both backwards; SASS unchanged): a subset of the backward suite on both
# backends and the check tool's backward probe.
set -u
L=$OUT/s12c6; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib
B=/tmp/s12bin6; mkdir -p $B
for f in .devbin/new/*.xz; do xz -dc $f > $B/$(basename $f .xz) & done; wait; chmod +x $B/*
FLASHTILE_SMALL_GRID=1 timeout 100 $B/flashtile_cuda_backward_tests \
  --gtest_filter='BackendsAndDtypes/CudaBackwardGrid.VarlenMatchesOracle/*bfloat16:*Refuses*:*PlanPicks*:CudaBackward.AtomicMode*' > $L/tests.log 2>&1
echo "tests rc=$? $(grep -hE '^\[  (PASSED|FAILED) ' $L/tests.log | tr '\n' ' ')" | tee $L/steps.txt
timeout 40 $B/flashtile check --pass bwd --shapes 20 > $L/check.log 2>&1
echo "check rc=$? $(grep -E 'not checked|cuda_' $L/check.log | tr '\n' ' ')" | tee -a $L/steps.txt
