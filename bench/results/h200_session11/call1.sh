#!/usr/bin/env bash
# Eleventh session, call 1 (H200). Binaries built on the dev machine for sm_90a, carried
# xz-compressed in .devbin/: main = 4183c72 (the tenth session's final main), new = this
# session's tree (issue 11's host path: validator without heap allocations, one pass over the
# environment per tf32x3 call, cached device facts without the lock, FunctionRef for the
# split forward's callback).
#  1. the write-up's fp32 case: main and new interleaved x8 unpinned, then x3 each on core 0
#  2. the tf32x3 breakdown of new (host steps against GPU)
#  3. new's suites on the pieces it touched: tf32x3 (both), the split-KV tests of cuda_sm90,
#     memcheck on the in-grid merge and the variants
set -u
L=$OUT/s11c1; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
B=/tmp/s11bin
for v in main new; do
  mkdir -p $B/$v
  for f in .devbin/$v/*.xz; do xz -dc $f > $B/$v/$(basename $f .xz) & done
done
wait; chmod +x $B/*/*
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,pci.bus_id --format=csv > $L/gpu.txt 2>&1
lscpu >> $L/gpu.txt 2>&1
note unpacked
# 1.
wu() {  # wu VARIANT TAG [prefix...]
  local v=$1 tag=$2; shift 2
  "$@" $B/$v/flashtile bench --dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64 \
    --backends cuda_tf32x3 --repeats 200 >> $L/writeup_$tag.log 2>&1
}
for i in 1 2 3 4 5 6 7 8; do wu main main; wu new new; done
for i in 1 2 3; do wu main main_core0 taskset -c 0; wu new new_core0 taskset -c 0; done
note writeup
# 2.
timeout 60 $B/new/flashtile_tf32x3_breakdown --repeats 200 --csv $L/breakdown.csv > $L/breakdown.log 2>&1
note breakdown
# 3.
run_test() {  # run_test BINARY FILTER TAG
  timeout 240 "$B/new/flashtile_$1" --gtest_filter="$2" > "$L/test_$3.log" 2>&1
  echo "$3 rc=$?" >> $L/test_rc.txt
}
export -f run_test; export B L
cat > $L/test_list.txt <<'LIST'
cuda_tf32x3_tests * tf32x3
cuda_tf32x3_sm90_tests * tf32x3_sm90
cuda_sm90_tests *Split* sm90_split
LIST
FLASHTILE_SMALL_GRID=1 timeout 200 compute-sanitizer --tool memcheck --error-exitcode 1 $B/new/flashtile_cuda_tf32x3_sm90_tests --gtest_filter='CudaTf32x3Sm90.MergeInGridAgreesWithCombineBitwise:CudaTf32x3Sm90.VariantsMatchOracle' > $L/memcheck_tf_sm90.log 2>&1 &
xargs -P 4 -L 1 bash -c 'run_test "$0" "$1" "$2"' < $L/test_list.txt
wait
{ for f in $L/test_*.log $L/memcheck*.log; do echo "$(basename $f): $(grep -hE '^\[  (PASSED|FAILED|  SKIPPED) |ERROR SUMMARY' $f | tr '\n' ' ')"; done; } > $L/tests_summary.txt
note "tests ($(grep -c 'rc=0' $L/test_rc.txt) passed, $(grep -vc 'rc=0' $L/test_rc.txt) not)"
for t in main new main_core0 new_core0; do
  echo "$t (ms): $(awk '$1 == "cuda_tf32x3" {print $2}' $L/writeup_$t.log | tr '\n' ' ')"
done > $L/writeup_summary.txt
cat $L/writeup_summary.txt $L/tests_summary.txt
tar czf $OUT/s11c1.tgz -C $OUT s11c1
