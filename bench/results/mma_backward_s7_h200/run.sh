#!/usr/bin/env bash
# Session 7 (feat/bwd3), the one device call: binaries built on the dev VM for sm_90a and
# carried xz-compressed in .devbin/ (M = main f3b4542, A = d1a9ff5 the 32x32 dQ tile,
# C = f5cfad0 A + the row stats left untouched until staged + predicated dQ adds; tests_C =
# flashtile_cuda_mma_backward_tests of C). Run from the worktree (.wt/bwd3) with
# carry [".wt/bwd3", ".device"]. Phases, each with a time limit, logs under $OUT/s7:
#  1. correctness of C: every backward test (small grid) as its own process, and
#     compute-sanitizer memcheck and racecheck on gpu-check.sh's backward subset, at once;
#  2. the A/B at 4k (bf16, d 64/128, causal and not): M, A, then C (the GPU to itself);
#  3. bench/peers.py --pass bwd with C beside FA2 and cuDNN, a row written as it comes.
set -u
L=$OUT/s7; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/../../.device/deps/lib/x86_64-linux-gnu
export PYTHONUNBUFFERED=1
t0=$SECONDS
pack() { tar czf $OUT/s7.tgz -C $OUT s7; }
B=/tmp/bwd3bin; mkdir -p $B
for f in .devbin/*.xz; do xz -dc $f > $B/$(basename $f .xz) & done; wait; chmod +x $B/*
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $L/gpu.txt 2>&1
echo "== unpacked at $((SECONDS-t0)) s" | tee $L/steps.txt
# 1. Tests and sanitizers of C, concurrently (the host oracle is the slow part).
export FLASHTILE_SMALL_GRID=1
tests=$($B/tests_C --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}')
for t in $tests; do n=$(echo $t | tr '/.' '__'); timeout 58 $B/tests_C --gtest_filter="$t" > $L/test_$n.log 2>&1 & done
sub="Dtypes/CudaMmaBackwardGrid.VarlenMatchesOracle/bfloat16:CudaMmaBackward.EveryHeadDim*:CudaMmaBackward.Refuses*"
for tool in memcheck racecheck; do timeout 58 compute-sanitizer --tool $tool --error-exitcode 1 $B/tests_C --gtest_filter="$sub" > $L/$tool.log 2>&1 & done
wait
{ for f in $L/test_*.log $L/memcheck.log $L/racecheck.log; do echo "$(basename $f): $(grep -hE '^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY' $f | tr '\n' ' ')"; done; } > $L/tests_summary.txt
echo "== tests done at $((SECONDS-t0)) s" | tee -a $L/steps.txt; pack
# 2. A/B at 4k.
for v in M A C; do
  timeout 20 $B/flashtile_$v bench --sweep --pass bwd --backends cuda_mma --dtype bf16 --sweep-head-dims 64,128 \
    --sweep-seqlens 4096 --sweep-causal 0,1 --repeats 10 --warmup 2 --output $L/ab_$v.json > $L/ab_$v.log 2>&1
  echo "== A/B $v rc=$? at $((SECONDS-t0)) s" | tee -a $L/steps.txt
done; pack
# 3. Beside the peers, with what is left (the whole call is held under 124 s).
left=$((124 - (SECONDS - t0)))
timeout $left python3 bench/peers.py --pass bwd --dtype bf16 --head-dims 64,128 --seqlens 1024,4096,16384 \
  --peers flash,cudnn --backends cuda_mma --cli $B/flashtile_C --cli-repeats 10 --cli-warmup 2 \
  --write-each-row --out $L --tag _s7 > $L/peers_log.txt 2>&1
echo "== peers rc=$? at $((SECONDS-t0)) s" | tee -a $L/steps.txt; pack
