#!/usr/bin/env bash
# Session 6, call 3 (final): binaries built on the dev machine for sm_90a at main's head,
# carried xz-compressed. cuda_sm90's grid tests that call 2's time limit cut, cuda_tf32x3's
# wgmma tests with the staggered d=128 split (new default) and racecheck on it, then the
# timed lines on a quiet machine: the fp32 peers line at d=128 on both d=128 schedules and
# the write-up's case. Logs come back as $OUT/c3.tgz.
set -u
L=$OUT/c3; mkdir -p $L bin3
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
for f in .devbin/b3/*.xz; do xz -dc $f > bin3/$(basename $f .xz); chmod +x bin3/$(basename $f .xz); done
F=bin3/flashtile
pack() { tar czf $OUT/c3.tgz -C $OUT c3; }
st() { local n=$1 lim=$2; shift 2; local s=$SECONDS; timeout $lim "$@" > $L/$n.log 2>&1; local rc=$?
  echo "== $n rc=$rc ($((SECONDS-s)) s, at $((SECONDS-t0)) s): $(grep -E 'PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY' $L/$n.log | tail -2 | tr '\n' ' ')"; }
SM90='Dtypes/CudaSm90Grid.EveryPipelineMatchesOracle/float16:Dtypes/CudaSm90Grid.VariantsMatchOracle/*:Dtypes/CudaSm90Grid.VarlenMatchesOracle/*:Dtypes/CudaSm90Grid.BlocksThatSeeNoKeyWriteZerosOnEveryRun/*'
for i in 0 1 2 3 4 5; do
  { GTEST_TOTAL_SHARDS=6 GTEST_SHARD_INDEX=$i st sm90_shard$i 85 bin3/flashtile_cuda_sm90_tests --gtest_filter="$SM90"; } > $L/chain_sm90_$i.txt 2>&1 &
done
TF='CudaTf32x3Sm90.*:-CudaTf32x3Sm90.SelectorChoosesByCoverage:CudaTf32x3Sm90.LongSequenceOnOneHead'
for i in 0 1 2 3; do
  { GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i st tf32sm90_shard$i 60 bin3/flashtile_cuda_tf32x3_sm90_tests --gtest_filter="$TF"; } > $L/chain_tf_$i.txt 2>&1 &
done
{ st tf32sm90_selector 60 bin3/flashtile_cuda_tf32x3_sm90_tests --gtest_filter='CudaTf32x3Sm90.SelectorChoosesByCoverage:CudaTf32x3Sm90.LongSequenceOnOneHead'; } > $L/chain_tf_sel.txt 2>&1 &
{ st tf32x3_default 60 bin3/flashtile_cuda_tf32x3_tests --gtest_filter='CudaTf32x3.Varlen*:CudaTf32x3.NonFinite*:CudaTf32x3.EveryHeadDim*:CudaTf32x3.Refusals*'; } > $L/chain_tf_def.txt 2>&1 &
{ FLASHTILE_SMALL_GRID=1 st racecheck_staggered 80 compute-sanitizer --tool racecheck --error-exitcode 1 bin3/flashtile_cuda_tf32x3_sm90_tests --gtest_filter='CudaTf32x3Sm90.D128SplitSchedulesAgreeBitwise';
  FLASHTILE_SMALL_GRID=1 st memcheck_staggered 40 compute-sanitizer --tool memcheck --error-exitcode 1 bin3/flashtile_cuda_tf32x3_sm90_tests --gtest_filter='CudaTf32x3Sm90.D128SplitSchedulesAgreeBitwise:CudaTf32x3Sm90.VarlenMatchesOracle'; } > $L/chain_san.txt 2>&1 &
wait
cat $L/chain*.txt | tee $L/summary.txt; echo "tests done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
PYTHONUNBUFFERED=1 st peers_f32_d128 60 python3 bench/peers.py --cli $F --dtype f32 --backends cuda_tf32x3 --peers efficient --head-dims 128 --seqlens 1024,4096,16384 --cli-repeats 5 --cli-warmup 1 --out $L/peers_f32
tail -12 $L/peers_f32_d128.log | tee -a $L/summary.txt
FLASHTILE_TF32X3_SM90_SPLIT=between st sweep_between 30 $F bench --sweep --dtype f32 --backends cuda_tf32x3 --sweep-head-dims 128 --sweep-seqlens 1024,4096,16384 --sweep-causal 0,1 --repeats 5 --warmup 1
grep -E "^cuda_tf32x3|TFLOP" $L/sweep_between.log | head -12 | tee -a $L/summary.txt
W="bench --dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64 --backends cuda_tf32x3 --repeats 200"
for r in 1 2 3; do st writeup_$r 30 $F $W; done
grep -h "^cuda_tf32x3" $L/writeup_*.log | tee -a $L/summary.txt
echo "all done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
