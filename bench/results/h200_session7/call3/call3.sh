#!/usr/bin/env bash
# Session 7, call 3 on main with the two new defaults (cuda_tf32x3 d=128 ping-pong; cuda_sm90
# d=256 persistent from 4k): binaries built here for sm_90a, carried xz-compressed. The sm90
# suite's default-path tests (variants and the grid now reach 4.6 at d=256) and racecheck on
# them, then the fp32 peers line on the new default and the bf16 forward peers line.
set -u
L=$OUT/c3; mkdir -p $L bin
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
for f in .devbin/b7g/*.xz; do b=bin/$(basename $f .xz); xz -dc $f > $b; chmod +x $b; done
F=bin/flashtile
pack() { tar czf $OUT/c3.tgz -C $OUT c3; }
st() { local n=$1 lim=$2; shift 2; local s=$SECONDS; timeout $lim "$@" > $L/$n.log 2>&1; local rc=$?
  echo "== $n rc=$rc ($((SECONDS-s)) s, at $((SECONDS-t0)) s): $(grep -E 'PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY' $L/$n.log | tail -2 | tr '\n' ' ')"; }
SAN="compute-sanitizer --error-exitcode 1 --tool"
G='Dtypes/CudaSm90Grid.MatchesOracle/*:Dtypes/CudaSm90Grid.VariantsMatchOracle/*:Dtypes/CudaSm90Grid.BlocksThatSeeNoKeyWriteZerosOnEveryRun/*:CudaSm90.*:CudaSm90Persistent.*'
for i in 0 1 2 3 4 5; do
  { GTEST_TOTAL_SHARDS=6 GTEST_SHARD_INDEX=$i st sm90_shard$i 120 bin/flashtile_cuda_sm90_tests --gtest_filter="$G"; } > $L/chain_sm90_$i.txt 2>&1 &
done
{ FLASHTILE_SMALL_GRID=1 st racecheck_sm90_variants 120 $SAN racecheck bin/flashtile_cuda_sm90_tests --gtest_filter='Dtypes/CudaSm90Grid.VariantsMatchOracle/bfloat16'; } > $L/chain_san1.txt 2>&1 &
{ FLASHTILE_SMALL_GRID=1 st memcheck_sm90_variants 120 $SAN memcheck bin/flashtile_cuda_sm90_tests --gtest_filter='Dtypes/CudaSm90Grid.VariantsMatchOracle/float16'; } > $L/chain_san2.txt 2>&1 &
{ st tf32sm90_sel 60 bin/flashtile_cuda_tf32x3_sm90_tests --gtest_filter='CudaTf32x3Sm90.SelectorChoosesByCoverage:CudaTf32x3Sm90.UnknownScheduleIsRefusedAndWritesNothing';
  st tf32x3_default 90 bin/flashtile_cuda_tf32x3_tests --gtest_filter='CudaTf32x3.VariantsMatchOracle:CudaTf32x3.VarlenMatchesOracle:CudaTf32x3.NonFinite*'; } > $L/chain_tf.txt 2>&1 &
wait
cat $L/chain*.txt | tee $L/summary.txt; echo "tests done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
PYTHONUNBUFFERED=1 st peers_f32 60 python3 bench/peers.py --cli $F --dtype f32 --backends cuda_tf32x3 --peers efficient --head-dims 64,128 --seqlens 1024,4096,16384 --cli-repeats 5 --cli-warmup 1 --write-each-row --out $L/peers_f32
tail -14 $L/peers_f32.log | tee -a $L/summary.txt; pack
PYTHONUNBUFFERED=1 st peers_bf16 200 python3 bench/peers.py --cli $F --backends cuda_mma,cuda_sm90 --dtype bf16 --head-dims 64,128,256 --seqlens 4096,16384 --peers flash,cudnn --write-each-row --out $L/peers_bf16
tail -16 $L/peers_bf16.log | tee -a $L/summary.txt
echo "all done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
