#!/usr/bin/env bash
# Tenth session, call 2 (H200). Binaries built on the dev machine for sm_90a: s8 = the
# eighth session's final main (d7e55b2, whose CLI read 17.4-19.2 us on the write-up's case),
# main = 30b749b (the ninth session's, 19.5-22.1 in call 1), new = this session's tree (the
# legacy stream's reused split workspace, split_kv.cu; auto's new sm90 rule).
#  1. the write-up's fp32 case, the three CLIs interleaved x6; the new one pinned to cores
#     near and far from the GPU (the host path's spread between machines)
#  2. fp16 d=256 causal 2k-16k, cuda_mma against cuda_sm90 (call 1's sweep timed out there)
#  3. the split and selection tests of the new binaries (full grids), memcheck on the
#     two-thread test and the tf32x3 in-grid merge
set -u
L=$OUT/s10c2; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
B=/tmp/s10bin
for v in main s8 new; do
  mkdir -p $B/$v
  for f in .devbin/$v/*.xz; do xz -dc $f > $B/$v/$(basename $f .xz) & done
done
wait; chmod +x $B/*/*
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,pci.bus_id --format=csv > $L/gpu.txt 2>&1
nvidia-smi topo -m >> $L/gpu.txt 2>&1; lscpu >> $L/gpu.txt 2>&1
note unpacked
# 1.
wu() {  # wu VARIANT TAG [taskset prefix...]
  local v=$1 tag=$2; shift 2
  "$@" $B/$v/flashtile bench --dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64 \
    --backends cuda_tf32x3 --repeats 200 >> $L/writeup_$tag.log 2>&1
}
for i in 1 2 3 4 5 6; do wu s8 s8; wu main main; wu new new; done
near=$(nvidia-smi topo -m 2>/dev/null | awk '/^GPU0/{for(i=1;i<=NF;i++) if($i ~ /^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$/ && $i ~ /-/){print $i; exit}}')
echo "gpu0 cpu affinity: $near" >> $L/steps.txt
first=${near%%-*}; first=${first:-0}
for i in 1 2 3; do wu new core$first taskset -c $first; wu new core15 taskset -c 15; wu new core8 taskset -c 8; done
note writeup
# 2.
timeout 100 $B/new/flashtile bench --sweep --sweep-seqlens 2048,4096,8192,16384 --sweep-head-dims 256 \
  --sweep-causal 1 --dtype f16 --backends cuda_mma,cuda_sm90 --repeats 10 --warmup 2 \
  --output $L/sel_f16_d256_causal.csv > $L/sel_f16_d256_causal.log 2>&1
note "fp16 d=256 causal"
# 3.
run_test() {  # run_test BINARY FILTER TAG
  timeout 280 $B/new/flashtile_$1 --gtest_filter="$2" > $L/test_$3.log 2>&1
  echo "$3 rc=$?" >> $L/test_rc.txt
}
export -f run_test; export B L
cat > $L/test_list.txt <<'LIST'
cuda_mma_tests CudaMma.SplitCallsFromTwoThreadsShareTheDefaultStreamWorkspace mma_threads
cuda_mma_tests CudaMma.SmallCallsSplitTheirKeys mma_small
cuda_mma_tests Dtypes/CudaMmaGrid.SplitKvMatchesOracle/bfloat16 mma_split_bf16
cuda_mma_tests Dtypes/CudaMmaGrid.SplitKvMatchesOracle/float16 mma_split_f16
cuda_mma_tests CudaMma.AutoPicksMmaForHalfTypesWithVariants mma_auto
cuda_sm90_tests CudaSm90.AutoPicksCudaSm90WhereMeasuredFaster sm90_auto
cuda_sm90_tests CudaSm90.SmallCallsSplitTheirKeys sm90_small
cuda_sm90_tests Dtypes/CudaSm90Grid.SplitKvMatchesOracle/bfloat16 sm90_split_bf16
cuda_sm90_tests Dtypes/CudaSm90Grid.SplitKvMatchesOracle/float16 sm90_split_f16
cuda_tf32x3_sm90_tests CudaTf32x3Sm90.SplitCallsMatchOracle tf_split
cuda_tf32x3_sm90_tests CudaTf32x3Sm90.SplitVariantsAndVarlenMatchOracle tf_split_var
cuda_tf32x3_sm90_tests CudaTf32x3Sm90.SplitCallsRepeatBitwise tf_split_rep
cuda_tf32x3_sm90_tests CudaTf32x3Sm90.MergeInGridAgreesWithCombineBitwise tf_merge
cuda_tf32x3_sm90_tests CudaTf32x3Sm90.LongSequenceSplitOnOneHead tf_long
LIST
FLASHTILE_SMALL_GRID=1 timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $B/new/flashtile_cuda_mma_tests --gtest_filter=CudaMma.SplitCallsFromTwoThreadsShareTheDefaultStreamWorkspace > $L/memcheck_mma_threads.log 2>&1 &
FLASHTILE_SMALL_GRID=1 timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $B/new/flashtile_cuda_tf32x3_sm90_tests --gtest_filter=CudaTf32x3Sm90.MergeInGridAgreesWithCombineBitwise > $L/memcheck_tf_merge.log 2>&1 &
xargs -P 8 -L 1 bash -c 'run_test $0 $1 $2' < $L/test_list.txt
wait
{ for f in $L/test_*.log $L/memcheck*.log; do echo "$(basename $f): $(grep -hE '^\[  (PASSED|FAILED|  SKIPPED) |ERROR SUMMARY' $f | tr '\n' ' ')"; done; } > $L/tests_summary.txt
note "tests ($(grep -c 'rc=0' $L/test_rc.txt) passed, $(grep -vc 'rc=0' $L/test_rc.txt) not)"
tar czf $OUT/s10c2.tgz -C $OUT s10c2
