#!/usr/bin/env bash
# tf32d128 (JOURNEY 2c.6): the d=128 producer pipeline against main's binary, one device call.
# Binaries built on the dev machine for sm_90a, carried xz-compressed in .devbin/tf32d128:
# flashtile_main (main at 68279f6), flashtile (feat/tf32d128) and its two tf32x3 test suites.
# Ran as `bash .devbin/tf32d128/run.sh` from the session's checkout (the device call sends that
# tree, not the worktree): this script and the four .xz copied into its ignored .devbin/tf32d128,
# carry [".devbin/tf32d128", ".device"]. Logs of that call (H200, 2026-12-02 03:22 UTC) beside it.
# Tests and sanitizers first (parallel chains), then the timed lines one at a time, main's and
# this branch's binaries alternating. The sweep takes d=64 too: the split helpers it shares
# were generalised, so its kernels' SASS moved (integer index arithmetic, same HGMMA).
# Logs come back as $OUT/tf32d128.tgz after every step.
set -u
L=$OUT/tf32d128; mkdir -p $L bin
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
for f in .devbin/tf32d128/*.xz; do b=bin/$(basename $f .xz); xz -dc $f > $b; chmod +x $b; done
pack() { tar czf $OUT/tf32d128.tgz -C $OUT tf32d128; }
st() { local n=$1 lim=$2; shift 2; local s=$SECONDS; timeout $lim "$@" > $L/$n.log 2>&1; local rc=$?
  echo "== $n rc=$rc ($((SECONDS-s)) s, at $((SECONDS-t0)) s): $(grep -E 'PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY' $L/$n.log | tail -2 | tr '\n' ' ')"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $L/gpu.txt
SAN="compute-sanitizer --error-exitcode 1 --tool"
for i in 0 1 2 3; do
  { GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i st tf32sm90_shard$i 120 bin/flashtile_cuda_tf32x3_sm90_tests; } > $L/chain_tfs$i.txt 2>&1 &
done
for i in 0 1; do
  { GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i st tf32x3_shard$i 120 bin/flashtile_cuda_tf32x3_tests; } > $L/chain_tf$i.txt 2>&1 &
done
# The producer schedule is the default: the backend suite's d=128 calls run it unpinned.
{ FLASHTILE_SMALL_GRID=1 st racecheck_tf32_producer 100 $SAN racecheck bin/flashtile_cuda_tf32x3_tests --gtest_filter='CudaTf32x3.EveryHeadDim*'
  FLASHTILE_SMALL_GRID=1 st racecheck_tf32_schedules 100 $SAN racecheck bin/flashtile_cuda_tf32x3_sm90_tests --gtest_filter='CudaTf32x3Sm90.D128SchedulesAgreeBitwise:CudaTf32x3Sm90.SplitCallsRepeatBitwise'
} > $L/chain_san1.txt 2>&1 &
{ FLASHTILE_SMALL_GRID=1 st memcheck_tf32_producer 100 $SAN memcheck bin/flashtile_cuda_tf32x3_sm90_tests --gtest_filter='CudaTf32x3Sm90.Split*:CudaTf32x3Sm90.D128SchedulesAgreeBitwise'
  FLASHTILE_SMALL_GRID=1 st memcheck_tf32_varlen 60 $SAN memcheck bin/flashtile_cuda_tf32x3_tests --gtest_filter='CudaTf32x3.EveryHeadDim*'
} > $L/chain_san2.txt 2>&1 &
wait
cat $L/chain*.txt | sort -t= -k1,1 | tee $L/summary.txt; echo "tests done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
SW="bench --sweep --dtype f32 --backends cuda_tf32x3 --sweep-head-dims 64,128 --sweep-seqlens 1024,4096,16384 --sweep-causal 0,1 --repeats 5 --warmup 1"
for b in flashtile_main flashtile; do
  st sweep_$b 60 bin/$b $SW
  grep -E "^cuda_tf32x3" $L/sweep_$b.log | sed "s/^/$b /" | tee -a $L/summary.txt
done
pack
for b in flashtile flashtile_main; do  # (this branch's first: the acceptance line)
  PYTHONUNBUFFERED=1 st peers_$b 60 python3 bench/peers.py --cli bin/$b --dtype f32 --backends cuda_tf32x3 --peers efficient --head-dims 128 --seqlens 1024,4096,16384 --cli-repeats 5 --cli-warmup 1 --write-each-row --out $L/peers_$b
  tail -9 $L/peers_$b.log | sed "s/^/$b /" | tee -a $L/summary.txt; pack
done
echo "all done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
