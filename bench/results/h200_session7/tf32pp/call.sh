#!/usr/bin/env bash
# Session 7, tf32pp (issue 11, JOURNEY 2c.4), the one device call: binaries built on the dev
# machine for sm_90a at feat/tf32pp (strip + xz, carried). cuda_tf32x3's wgmma suite (d=64,
# d=128 together and pingpong), the backend suite's default-path tests with pingpong pinned,
# racecheck + memcheck on the schedules' bitwise test; then d=128 on both schedules through
# the CLI's sweep, then the fp32 peers line (d 64,128) on pingpong. Logs: $OUT/pp.tgz.
set -u
L=$OUT/pp; mkdir -p $L /tmp/ppbin
export LD_LIBRARY_PATH=$PWD/../../.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
xz -dc .devbin/bins.txz | tar x -C /tmp/ppbin
B=/tmp/ppbin; F=$B/flashtile
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $L/gpu.txt 2>&1
pack() { tar czf $OUT/pp.tgz -C $OUT pp; }
st() { local n=$1 lim=$2; shift 2; local s=$SECONDS; timeout $lim "$@" > $L/$n.log 2>&1; local rc=$?
  echo "== $n rc=$rc ($((SECONDS-s)) s, at $((SECONDS-t0)) s): $(grep -E 'PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY' $L/$n.log | tail -3 | tr '\n' ' ')"; }
TF='CudaTf32x3Sm90.*:-CudaTf32x3Sm90.SelectorChoosesByCoverage:CudaTf32x3Sm90.LongSequenceOnOneHead'
for i in 0 1 2 3; do
  { GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i st sm90_shard$i 40 $B/flashtile_cuda_tf32x3_sm90_tests --gtest_filter="$TF"; } > $L/chain_$i.txt 2>&1 &
done
{ st sm90_selector_long 40 $B/flashtile_cuda_tf32x3_sm90_tests --gtest_filter='CudaTf32x3Sm90.SelectorChoosesByCoverage:CudaTf32x3Sm90.LongSequenceOnOneHead'; } > $L/chain_sel.txt 2>&1 &
{ FLASHTILE_TF32X3_SM90_SCHEDULE=pingpong st tf32x3_pingpong 40 $B/flashtile_cuda_tf32x3_tests --gtest_filter='CudaTf32x3.Varlen*:CudaTf32x3.NonFinite*:CudaTf32x3.EveryHeadDim*:CudaTf32x3.Refusals*'; } > $L/chain_def.txt 2>&1 &
{ FLASHTILE_SMALL_GRID=1 st racecheck 28 compute-sanitizer --tool racecheck --error-exitcode 1 $B/flashtile_cuda_tf32x3_sm90_tests --gtest_filter='CudaTf32x3Sm90.D128SchedulesAgreeBitwise';
  FLASHTILE_SMALL_GRID=1 st memcheck 12 compute-sanitizer --tool memcheck --error-exitcode 1 $B/flashtile_cuda_tf32x3_sm90_tests --gtest_filter='CudaTf32x3Sm90.D128SchedulesAgreeBitwise'; } > $L/chain_san.txt 2>&1 &
wait
cat $L/chain*.txt | tee $L/summary.txt; grep -h "wgmma path:\|mma.sync path:" $L/sm90_shard*.log | tee -a $L/summary.txt
echo "tests done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
for sch in together pingpong; do
  FLASHTILE_TF32X3_SM90_SCHEDULE=$sch st sweep_$sch 12 $F bench --sweep --dtype f32 --backends cuda_tf32x3 --sweep-head-dims 128 --sweep-seqlens 1024,4096,16384 --sweep-causal 0,1 --repeats 5 --warmup 1
  echo "-- $sch" >> $L/summary.txt; grep -E "TFLOP/s$" $L/sweep_$sch.log | tee -a $L/summary.txt
done
pack
left=$((104 - (SECONDS - t0)))
FLASHTILE_TF32X3_SM90_SCHEDULE=pingpong PYTHONUNBUFFERED=1 st peers_pingpong $left python3 bench/peers.py --cli $F --dtype f32 --backends cuda_tf32x3 --peers efficient --head-dims 64,128 --seqlens 1024,4096,16384 --cli-repeats 5 --cli-warmup 1 --out $L/peers_f32
tail -16 $L/peers_pingpong.log | tee -a $L/summary.txt
echo "all done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
