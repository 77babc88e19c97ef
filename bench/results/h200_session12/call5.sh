#!/usr/bin/env bash
# Twelfth session, call 5 (H200): the committed tree's binaries (call 3's, .devbin/prev):
# cuda_sm90's backward on random shapes (check --pass bwd, variants and varlen drawn), its
# grid tests with the 1023/1025 lengths, and a 131072-token backward through auto.
set -u
L=$OUT/s12c5; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
B=/tmp/s12bin5; mkdir -p $B
for f in .devbin/prev/*.xz; do xz -dc $f > $B/$(basename $f .xz) & done; wait; chmod +x $B/*
note start
timeout 150 $B/flashtile check --pass bwd --backends cuda_sm90 --shapes 300 > $L/check_bwd.log 2>&1
note "check bwd rc=$? $(tail -2 $L/check_bwd.log | tr '\n' ' ')"
timeout 60 $B/flashtile bench --pass bwd --dtype bf16 --seqlen 131072 --heads 16 --head-dim 128 --causal --repeats 3 > $L/bwd_131072.log 2>&1
note "131072 rc=$? $(grep -E 'bwd ' $L/bwd_131072.log | tr '\n' ' ')"
timeout 200 $B/flashtile_cuda_backward_tests --gtest_filter='BackendsAndDtypes/CudaBackwardGrid.MatchesOracle/cuda_sm90*:CudaBackward.LongSequences' > $L/full_grid.log 2>&1
note "full grid rc=$? $(grep -hE '^\[  (PASSED|FAILED) |OK \]' $L/full_grid.log | tr '\n' ' ')"
tar czf $OUT/s12c5.tgz -C $OUT s12c5
