#!/usr/bin/env bash
# Session 8, call 4 (lead): the final call's d=128 fp32 line read pingpong-level figures on
# merged main (62-65 TFLOP/s, 1.32-1.47x) where the producer branch had read 75-80. The merged
# producer re-read V's 4x4 blocks once per chunk (83 LDS a tile against 59: fixed, VBlocksOf::
# load). A/B of the fixed merged CLI against the branch's own CLI (tf32d128 at 12674c9), then
# the d=128 suite parts and sanitizers on the fixed build, then the fp32 peers line.
set -u
L=$OUT/c4; mkdir -p $L bin
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
for f in .devbin/s8g/*.xz; do b=bin/$(basename $f .xz); xz -dc $f > $b; chmod +x $b; done
pack() { tar czf $OUT/c4.tgz -C $OUT c4; }
st() { local n=$1 lim=$2; shift 2; local s=$SECONDS; timeout $lim "$@" > $L/$n.log 2>&1; local rc=$?
  echo "== $n rc=$rc ($((SECONDS-s)) s, at $((SECONDS-t0)) s): $(grep -E 'PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY' $L/$n.log | tail -2 | tr '\n' ' ')"; }
S="bench --sweep --dtype f32 --backends cuda_tf32x3 --sweep-head-dims 64,128 --sweep-seqlens 1024,4096,16384 --sweep-causal 0,1 --repeats 5 --warmup 1"
for r in 1 2; do st sweep_merged_$r 60 bin/flashtile $S; st sweep_branch_$r 60 bin/flashtile_branch $S; done
grep -H -E "^cuda_tf32x3" $L/sweep_*.log | sed "s@$L/@@" > $L/sweeps.txt; pack
SAN="compute-sanitizer --error-exitcode 1 --tool"
for i in 0 1 2 3; do { GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i st tfs$i 120 bin/flashtile_cuda_tf32x3_sm90_tests; } > $L/chain_tfs$i.txt 2>&1 & done
for i in 0 1; do { GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i st tf$i 120 bin/flashtile_cuda_tf32x3_tests; } > $L/chain_tf$i.txt 2>&1 & done
{ FLASHTILE_SMALL_GRID=1 st racecheck_d128 120 $SAN racecheck bin/flashtile_cuda_tf32x3_sm90_tests --gtest_filter='CudaTf32x3Sm90.D128SchedulesAgreeBitwise:CudaTf32x3Sm90.MergeInGrid*'; } > $L/chain_san1.txt 2>&1 &
{ FLASHTILE_SMALL_GRID=1 st memcheck_d128 120 $SAN memcheck bin/flashtile_cuda_tf32x3_sm90_tests --gtest_filter='CudaTf32x3Sm90.D128SchedulesAgreeBitwise:CudaTf32x3Sm90.Split*:CudaTf32x3Sm90.MergeInGrid*'; } > $L/chain_san2.txt 2>&1 &
wait
cat $L/chain*.txt | sort | tee $L/summary.txt; pack
PYTHONUNBUFFERED=1 st peers_f32 110 python3 bench/peers.py --cli bin/flashtile --dtype f32 --backends cuda_tf32x3 --peers efficient --head-dims 64,128 --seqlens 1024,4096,16384 --cli-repeats 5 --cli-warmup 1 --write-each-row --out $L/peers_f32
tail -14 $L/peers_f32.log | tee -a $L/summary.txt; cat $L/sweeps.txt | tee -a $L/summary.txt
echo "all done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
