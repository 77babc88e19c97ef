#!/usr/bin/env bash
# Session 7, final call on merged main: binaries built here for sm_90a, carried xz-compressed.
# Tests and sanitizers of what changed this session (cuda_tf32x3: split calls on wgmma and the
# ping-pong hand-over; the cuda_mma backward's step A; cuda_mma's new window test), in
# parallel chains, then the timed lines one at a time. Logs come back as $OUT/final.tgz.
set -u
L=$OUT/final; mkdir -p $L bin
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
for f in .devbin/b7f/*.xz; do b=bin/$(basename $f .xz); xz -dc $f > $b; chmod +x $b; done
F=bin/flashtile
pack() { tar czf $OUT/final.tgz -C $OUT final; }
st() { local n=$1 lim=$2; shift 2; local s=$SECONDS; timeout $lim "$@" > $L/$n.log 2>&1; local rc=$?
  echo "== $n rc=$rc ($((SECONDS-s)) s, at $((SECONDS-t0)) s): $(grep -E 'PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY' $L/$n.log | tail -2 | tr '\n' ' ')"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $L/gpu.txt
SAN="compute-sanitizer --error-exitcode 1 --tool"
for i in 0 1 2 3; do
  { GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i st tf32sm90_shard$i 150 bin/flashtile_cuda_tf32x3_sm90_tests; } > $L/chain_tfs$i.txt 2>&1 &
done
for i in 0 1; do
  { GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i st tf32x3_shard$i 170 bin/flashtile_cuda_tf32x3_tests; } > $L/chain_tf$i.txt 2>&1 &
done
for i in 0 1 2; do
  { FLASHTILE_SMALL_GRID=1 GTEST_TOTAL_SHARDS=3 GTEST_SHARD_INDEX=$i st backward_shard$i 200 bin/flashtile_cuda_mma_backward_tests; } > $L/chain_bwd$i.txt 2>&1 &
done
{ st mma_window 170 bin/flashtile_cuda_mma_tests --gtest_filter='*Window*'; } > $L/chain_mma.txt 2>&1 &
{ for s in together pingpong; do FLASHTILE_SMALL_GRID=1 FLASHTILE_TF32X3_SM90_SCHEDULE=$s st racecheck_tf32_$s 90 $SAN racecheck bin/flashtile_cuda_tf32x3_tests --gtest_filter='CudaTf32x3.EveryHeadDim*'; done
  FLASHTILE_SMALL_GRID=1 st racecheck_tf32_split 90 $SAN racecheck bin/flashtile_cuda_tf32x3_sm90_tests --gtest_filter='CudaTf32x3Sm90.SplitCallsRepeatBitwise:CudaTf32x3Sm90.D128SchedulesAgreeBitwise'
} > $L/chain_san1.txt 2>&1 &
{ FLASHTILE_SMALL_GRID=1 st memcheck_tf32_split 120 $SAN memcheck bin/flashtile_cuda_tf32x3_sm90_tests --gtest_filter='CudaTf32x3Sm90.Split*:CudaTf32x3Sm90.D128SchedulesAgreeBitwise'
  FLASHTILE_SMALL_GRID=1 st memcheck_window 90 $SAN memcheck bin/flashtile_cuda_mma_tests --gtest_filter='CudaMma.WindowSizesAndVariantsMatchOracle:CudaMma.WindowEdgesAndEmptyRows'
} > $L/chain_san2.txt 2>&1 &
B="Dtypes/CudaMmaBackwardGrid.VarlenMatchesOracle/bfloat16:CudaMmaBackward.EveryHeadDim*:CudaMmaBackward.Refuses*"
{ for t in memcheck racecheck; do FLASHTILE_SMALL_GRID=1 st ${t}_backward 120 $SAN $t bin/flashtile_cuda_mma_backward_tests --gtest_filter="$B"; done; } > $L/chain_san3.txt 2>&1 &
wait
cat $L/chain*.txt | sort -t= -k1,1 | tee $L/summary.txt; echo "tests done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
# Timed lines on a quiet machine.
W="bench --dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64 --backends cuda_tf32x3 --repeats 200"
for r in 1 2 3; do st writeup_$r 30 $F $W; done
FLASHTILE_TF32X3_PATH=unsplit st writeup_unsplit_pinned 30 $F $W
st writeup_cpu_standard 60 $F bench --dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64 --backends cpu_standard --repeats 3 --warmup 1
st tf32x3_breakdown 40 bin/flashtile_tf32x3_breakdown --repeats 200 --csv $L/tf32x3_breakdown.csv
grep -h "^cuda_tf32x3\|^cpu_standard" $L/writeup_*.log | tee -a $L/summary.txt
for s in together pingpong; do
  FLASHTILE_TF32X3_SM90_SCHEDULE=$s st sweep_$s 35 $F bench --sweep --dtype f32 --backends cuda_tf32x3 --sweep-head-dims 128 --sweep-seqlens 1024,4096,16384 --sweep-causal 0,1 --repeats 5 --warmup 1
  grep -E "^cuda_tf32x3" $L/sweep_$s.log | sed "s/^/$s /" | tee -a $L/summary.txt
done
pack
PYTHONUNBUFFERED=1 st peers_f32 100 python3 bench/peers.py --cli $F --dtype f32 --backends cuda_tf32x3 --peers efficient --head-dims 64,128 --seqlens 1024,4096,16384 --cli-repeats 5 --cli-warmup 1 --write-each-row --out $L/peers_f32
tail -16 $L/peers_f32.log | tee -a $L/summary.txt; pack
for v in "" "--window 1024,0"; do
  st "line16k${v//[^a-z0-9]/_}" 40 $F bench --dtype bf16 --seqlen 16384 --heads 16 --head-dim 128 --causal $v --backends cuda_mma --repeats 10
done
grep -h "^cuda_" $L/line16k*.log | tee -a $L/summary.txt
for pin in "" tma_persistent "" tma_persistent; do
  FLASHTILE_SM90_PIPELINE=$pin st "sm90_d256_${pin:-default}_$SECONDS" 30 $F bench --sweep --sweep-seqlens 4096,16384 --sweep-head-dims 256 --sweep-causal 0,1 --dtype bf16 --backends cuda_sm90 --repeats 10 --warmup 2
done
grep -H "^cuda_sm90" $L/sm90_d256_*.log | sed "s|$L/||" | tee -a $L/summary.txt; pack
PYTHONUNBUFFERED=1 st peers_bwd ${BWD_LIMIT:-120} python3 bench/peers.py --cli $F --pass bwd --dtype bf16 --backends cuda_mma --peers flash,cudnn --head-dims 64,128 --seqlens 1024,4096,16384 --cli-repeats 10 --cli-warmup 2 --write-each-row --out $L/peers_bwd
tail -16 $L/peers_bwd.log | tee -a $L/summary.txt
echo "all done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
