#!/usr/bin/env bash
# Tenth session, call 4 (H200): windows at d=64 and 256 on the persistent pipeline by default
# (Sm90Traits::kWindowPipeline, from call 3), this tree built here for sm_90a. The whole
# cuda_sm90 suite, one process a test (small grid but for the split tests); racecheck and
# memcheck on the variants grid (its windows now run the persistent kernel) and the
# persistent suite's window case; the window lines on the default pipeline.
set -u
L=$OUT/s10c4; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
B=/tmp/s10bin; mkdir -p $B
for f in .devbin/w/*.xz; do xz -dc $f > $B/$(basename $f .xz) & done; wait; chmod +x $B/*
T=$B/flashtile_cuda_sm90_tests
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $L/gpu.txt 2>&1
$T --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}' > $L/test_list.txt
run_test() {
  local n=$(echo $1 | tr '/.' '__') grid=1
  case $1 in *Split*) grid=0;; esac
  FLASHTILE_SMALL_GRID=$grid timeout 280 $T --gtest_filter="$1" > $L/test_$n.log 2>&1
  echo "$1 rc=$?" >> $L/test_rc.txt
}
export -f run_test; export T L
for tool in racecheck memcheck; do
  FLASHTILE_SMALL_GRID=1 timeout 280 compute-sanitizer --tool $tool --error-exitcode 1 $T \
    --gtest_filter='Dtypes/CudaSm90Grid.VariantsMatchOracle/bfloat16:CudaSm90Persistent.CtasRunningSeveralItemsMatchOracle' > $L/${tool}.log 2>&1 &
done
{ grep Split $L/test_list.txt; grep -v Split $L/test_list.txt; } | xargs -P 8 -L 1 bash -c 'run_test $0'
wait
{ for f in $L/test_*.log $L/racecheck.log $L/memcheck.log; do echo "$(basename $f): $(grep -hE '^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY' $f | tr '\n' ' ')"; done; } > $L/tests_summary.txt
note "tests ($(grep -c 'rc=0' $L/test_rc.txt) passed, $(grep -vc 'rc=0' $L/test_rc.txt) not)"
F=$B/flashtile
timeout 60 $F bench --sweep --sweep-seqlens 4096,16384 --sweep-head-dims 64,128,256 --sweep-causal 0 \
  --dtype bf16 --backends cuda_sm90 --repeats 10 --warmup 2 --window 1024,0 --output $L/w1024.csv > $L/w1024.log 2>&1
timeout 60 $F bench --sweep --sweep-seqlens 16384 --sweep-head-dims 64,128,256 --sweep-causal 0 \
  --dtype bf16 --backends cuda_sm90 --repeats 10 --warmup 2 --window 4096,0 --output $L/w4096.csv > $L/w4096.log 2>&1
note bench
tar czf $OUT/s10c4.tgz -C $OUT s10c4
