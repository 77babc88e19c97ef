#!/usr/bin/env bash
# bwd4's one device call. Binaries built on the dev VM for sm_90a, carried xz-compressed in
# .devbin/bwd4 (flashtile_M = main 68279f6, flashtile_N = feat/bwd4, tests_N = its
# flashtile_cuda_mma_backward_tests). Run as `cd .wt/bwd4 && bash bench/results/bwd4_h200/run.sh`
# with carry [".wt/bwd4"] (the worktree holds .devbin/bwd4 and .device). Logs: $OUT/bwd4.tgz.
#  1. A/B (GPU to itself): M then N, bf16, d 64/128, causal and not, 4k and 16k;
#  2. correctness of N: every backward test (small grid) as its own process, memcheck and
#     racecheck on gpu-check.sh's backward subset, at once;
#  3. A/B again at 4k, N then M; 4. N beside FA2 (peers.py, flash only) with what is left.
set -u
L=$OUT/bwd4; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
export PYTHONUNBUFFERED=1
t0=$SECONDS
pack() { tar czf $OUT/bwd4.tgz -C $OUT bwd4; }
B=/tmp/bwd4bin; mkdir -p $B
for f in .devbin/bwd4/*.xz; do xz -dc $f > $B/$(basename $f .xz) & done; wait; chmod +x $B/*
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $L/gpu.txt 2>&1
echo "== unpacked at $((SECONDS-t0)) s" | tee $L/steps.txt
ab() {  # ab TAG BINARY SEQLENS LIMIT
  timeout $4 $B/flashtile_$2 bench --sweep --pass bwd --backends cuda_mma --dtype bf16 --sweep-head-dims 64,128 \
    --sweep-seqlens $3 --sweep-causal 0,1 --repeats 10 --warmup 2 --output $L/ab_$1.json > $L/ab_$1.log 2>&1
  echo "== A/B $1 rc=$? at $((SECONDS-t0)) s" | tee -a $L/steps.txt
}
# 1.
ab M1 M 4096,16384 40
ab N1 N 4096,16384 40
pack
# 2.
export FLASHTILE_SMALL_GRID=1
tests=$($B/tests_N --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}')
for t in $tests; do n=$(echo $t | tr '/.' '__'); timeout 75 $B/tests_N --gtest_filter="$t" > $L/test_$n.log 2>&1 & done
sub="Dtypes/CudaMmaBackwardGrid.VarlenMatchesOracle/bfloat16:CudaMmaBackward.EveryHeadDim*:CudaMmaBackward.Refuses*"
for tool in memcheck racecheck; do timeout 75 compute-sanitizer --tool $tool --error-exitcode 1 $B/tests_N --gtest_filter="$sub" > $L/$tool.log 2>&1 & done
wait
unset FLASHTILE_SMALL_GRID
{ for f in $L/test_*.log $L/memcheck.log $L/racecheck.log; do echo "$(basename $f): $(grep -hE '^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY' $f | tr '\n' ' ')"; done; } > $L/tests_summary.txt
echo "== tests done at $((SECONDS-t0)) s" | tee -a $L/steps.txt; pack
# 3.
ab N2 N 4096 20
ab M2 M 4096 20
pack
# 4. Held under 200 s in all.
left=$((200 - (SECONDS - t0)))
if [ $left -gt 15 ]; then
  timeout $left python3 bench/peers.py --pass bwd --dtype bf16 --head-dims 64,128 --seqlens 4096,16384 \
    --peers flash --backends cuda_mma --cli $B/flashtile_N --cli-repeats 10 --cli-warmup 2 \
    --write-each-row --out $L --tag _bwd4 > $L/peers_log.txt 2>&1
  echo "== peers rc=$? at $((SECONDS-t0)) s" | tee -a $L/steps.txt
fi
pack
