#!/usr/bin/env bash
# Session 8, final call (lead) on merged main (2c.5 write-up trims + in-kernel merge, 2c.6
# d=128 producer, sm90 4.9): binaries built on the dev machine for sm_90a, carried
# xz-compressed. Tests and sanitizers in parallel chains, then the timed lines one at a time.
set -u
L=$OUT/final; mkdir -p $L bin
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
for f in .devbin/s8f/*.xz; do b=bin/$(basename $f .xz); xz -dc $f > $b; chmod +x $b; done
F=bin/flashtile
pack() { tar czf $OUT/final.tgz -C $OUT final; }
st() { local n=$1 lim=$2; shift 2; local s=$SECONDS; timeout $lim "$@" > $L/$n.log 2>&1; local rc=$?
  echo "== $n rc=$rc ($((SECONDS-s)) s, at $((SECONDS-t0)) s): $(grep -E 'PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY' $L/$n.log | tail -2 | tr '\n' ' ')"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $L/gpu.txt
SAN="compute-sanitizer --error-exitcode 1 --tool"
for i in 0 1 2 3; do { GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i st tfs$i 150 bin/flashtile_cuda_tf32x3_sm90_tests; } > $L/chain_tfs$i.txt 2>&1 & done
for i in 0 1; do { GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i st tf$i 150 bin/flashtile_cuda_tf32x3_tests; } > $L/chain_tf$i.txt 2>&1 & done
for i in 0 1 2 3; do { GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i st sm90_$i 150 bin/flashtile_cuda_sm90_tests; } > $L/chain_sm90_$i.txt 2>&1 & done
{ st mma_split 150 bin/flashtile_cuda_mma_tests --gtest_filter='*Split*:*split*'; } > $L/chain_mma.txt 2>&1 &
T="CudaTf32x3Sm90.MergeInGrid*:CudaTf32x3Sm90.SplitCallsRepeatBitwise:CudaTf32x3Sm90.D128SchedulesAgreeBitwise"
{ FLASHTILE_SMALL_GRID=1 st memcheck_tf32 150 $SAN memcheck bin/flashtile_cuda_tf32x3_sm90_tests --gtest_filter="$T"; } > $L/chain_san1.txt 2>&1 &
{ FLASHTILE_SMALL_GRID=1 st racecheck_tf32 150 $SAN racecheck bin/flashtile_cuda_tf32x3_sm90_tests --gtest_filter="$T"
  FLASHTILE_SMALL_GRID=1 st racecheck_tf32_heads 90 $SAN racecheck bin/flashtile_cuda_tf32x3_tests --gtest_filter='CudaTf32x3.EveryHeadDim*'; } > $L/chain_san2.txt 2>&1 &
{ FLASHTILE_SMALL_GRID=1 st memcheck_mma_split 120 $SAN memcheck bin/flashtile_cuda_mma_tests --gtest_filter='*Split*'; } > $L/chain_san3.txt 2>&1 &
wait
cat $L/chain*.txt | sort | tee $L/summary.txt; echo "tests done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
# Timed lines on a quiet machine.
W="bench --dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64 --backends cuda_tf32x3 --repeats 200"
for r in 1 2 3 4 5; do st writeup_$r 30 $F $W; done
for r in 1 2 3; do FLASHTILE_TF32X3_MERGE=combine st writeup_combine_$r 30 $F $W; done
st writeup_noflush 30 $F $W --no-flush
st writeup_cpu_standard 60 $F bench --dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64 --backends cpu_standard --repeats 3 --warmup 1
st breakdown 40 bin/flashtile_tf32x3_breakdown --repeats 200
grep -H "^cuda_tf32x3\|^cpu_standard" $L/writeup_*.log | sed "s@$L/@@" | tee -a $L/summary.txt
grep -E "wgmma|call|gpu|host " $L/breakdown.log | tee -a $L/summary.txt
pack
PYTHONUNBUFFERED=1 st peers_f32 110 python3 bench/peers.py --cli $F --dtype f32 --backends cuda_tf32x3 --peers efficient --head-dims 64,128 --seqlens 1024,4096,16384 --cli-repeats 5 --cli-warmup 1 --write-each-row --out $L/peers_f32
tail -16 $L/peers_f32.log | tee -a $L/summary.txt; pack
echo "all done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
