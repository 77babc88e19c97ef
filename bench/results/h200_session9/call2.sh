#!/usr/bin/env bash
# Ninth session, call 2 (issue 11): the split tests cut to run in time (call 1's timed out at
# 200 s among 80 processes), and the shared-memory limit raised once per kernel on cuda_mma
# and cuda_sm90 (host time in front of every small call). Binaries in .devbin/s9 (sm_90a,
# stripped): flashtile = this tree, flashtile_prev = call 1's. carry [".devbin"].
#  1. kernel durations (ncu gpu__time_duration) of the B=1 H=1 N=1024 calls, split and not;
#  2. B=1 H=1 call 1's binary against this one (host cost of the smem-limit call);
#     the write-up's fp32 case x5;
#  3. the suites (12 processes at a time; small grid but for the split tests), memcheck and
#     racecheck on the split tests.
set -u
L=$OUT/s9c2; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib  # libhwy (the binaries are static otherwise)
export PYTHONUNBUFFERED=1
t0=$SECONDS
pack() { tar czf $OUT/s9c2.tgz -C $OUT s9c2; }
note() { echo "== $1 at $((SECONDS-t0)) s" | tee -a $L/steps.txt; pack; }
B=/tmp/s9bin; mkdir -p $B
for f in .devbin/s9/*.xz; do xz -dc $f > $B/$(basename $f .xz) & done; wait; chmod +x $B/*
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $L/gpu.txt 2>&1
F=$B/flashtile; P=$B/flashtile_prev
note unpacked
# 1.
for d in 64 128; do for be in cuda_mma cuda_sm90; do for sp in auto 1; do
  env FLASHTILE_MMA_SPLITS=$([ $sp = 1 ] && echo 1) FLASHTILE_SM90_SPLITS=$([ $sp = 1 ] && echo 1) \
    timeout 60 ncu --metrics gpu__time_duration.sum -k regex:"forward|combine" -c 12 $F bench --dtype bf16 \
    --batch 1 --heads 1 --seqlen 1024 --head-dim $d --backends $be --repeats 3 --warmup 1 \
    > $L/ncu_${be}_d${d}_splits_$sp.log 2>&1
done; done; done
note ncu
# 2.
for round in 1 2; do for d in 64 128; do for n in 1024 4096; do for bin in prev new; do
  exe=$F; [ $bin = prev ] && exe=$P
  $exe bench --dtype bf16 --batch 1 --heads 1 --seqlen $n --head-dim $d --backends cuda_mma,cuda_sm90 \
    --repeats 50 --warmup 5 --output $L/host_${bin}_d${d}_n${n}_r$round.json >> $L/host.log 2>&1
done; done; done; done
for i in 1 2 3 4 5; do $F bench --dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64 \
  --backends cuda_tf32x3 --repeats 200 >> $L/writeup_tf32x3.log 2>&1; done
note host
# 3.
export FLASHTILE_SMALL_GRID=1
for bin in cuda_mma_tests cuda_sm90_tests cuda_tf32x3_tests cuda_tf32x3_sm90_tests; do
  for t in $($B/flashtile_$bin --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}'); do
    echo "$bin $t"
  done
done > $L/test_list.txt
sub_mma="Dtypes/CudaMmaGrid.SplitKvMatchesOracle/bfloat16:CudaMma.SmallCallsSplitTheirKeys"
sub_sm90="Dtypes/CudaSm90Grid.SplitKvMatchesOracle/float16:CudaSm90.SmallCallsSplitTheirKeys"
for tool in memcheck racecheck; do
  timeout 300 compute-sanitizer --tool $tool --error-exitcode 1 $B/flashtile_cuda_mma_tests --gtest_filter="$sub_mma" > $L/${tool}_mma.log 2>&1 &
  timeout 300 compute-sanitizer --tool $tool --error-exitcode 1 $B/flashtile_cuda_sm90_tests --gtest_filter="$sub_sm90" > $L/${tool}_sm90.log 2>&1 &
done
run_test() {  # run_test BINARY TEST
  local n=$(echo $1.$2 | tr '/.' '__') grid=1
  case $2 in *Split*) grid=0;; esac
  FLASHTILE_SMALL_GRID=$grid timeout 280 $B/flashtile_$1 --gtest_filter="$2" > $L/test_$n.log 2>&1
  echo "$1 $2 rc=$?" >> $L/test_rc.txt
}
export -f run_test; export B L
# The split tests first (the longest), then the rest, 10 at a time beside the 4 sanitizer runs.
{ grep Split $L/test_list.txt; grep -v Split $L/test_list.txt; } | xargs -P 10 -L 1 bash -c 'run_test $0 $1'
wait
{ for f in $L/test_*.log $L/memcheck*.log $L/racecheck*.log; do echo "$(basename $f): $(grep -hE '^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY' $f | tr '\n' ' ')"; done; } > $L/tests_summary.txt
grep -v "rc=0" $L/test_rc.txt > $L/tests_not_passed.txt
note "tests ($(grep -c 'rc=0' $L/test_rc.txt) passed, $(wc -l < $L/tests_not_passed.txt) not)"
