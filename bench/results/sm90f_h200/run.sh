#!/usr/bin/env bash
# sm90f (JOURNEY 4.9): one H200 call. Carried sm_90a binaries (built here, xz): main's CLI at
# 68279f6 (flashtile_main) and this branch's CLI and sm90 suite. First the suite's tests that
# reach the grouped grid order (sharded) beside memcheck/racecheck on a small grid, then, on a
# quiet GPU, the A/B of main's and this branch's default sweeps, a causal replicate with 8k,
# and this branch's pipelines pinned at causal 4k. Logs come back as $OUT/sm90f.tgz.
set -u
L=$OUT/sm90f; mkdir -p $L bin
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
for f in .devbin/sm90f/*.xz; do b=bin/$(basename $f .xz); xz -dc $f > $b; chmod +x $b; done
A=bin/flashtile_main; B=bin/flashtile; T=bin/flashtile_cuda_sm90_tests
pack() { tar czf $OUT/sm90f.tgz -C $OUT sm90f; }
st() { local n=$1 lim=$2; shift 2; local s=$SECONDS; timeout $lim "$@" > $L/$n.log 2>&1; local rc=$?
  echo "== $n rc=$rc ($((SECONDS-s)) s, at $((SECONDS-t0)) s): $(grep -E 'PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY' $L/$n.log | tail -2 | tr '\n' ' ')"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $L/gpu.txt
SAN="compute-sanitizer --error-exitcode 1 --tool"
G='Dtypes/CudaSm90Grid.MatchesOracle/*:Dtypes/CudaSm90Grid.VariantsMatchOracle/*:CudaSm90.*:CudaSm90BlockM192.*:Sm90Pieces.*'
for i in 0 1 2 3 4 5; do
  { GTEST_TOTAL_SHARDS=6 GTEST_SHARD_INDEX=$i st sm90_shard$i 95 $T --gtest_filter="$G"; } > $L/chain_sm90_$i.txt 2>&1 &
done
{ FLASHTILE_SMALL_GRID=1 st every_pipeline_small 95 $T --gtest_filter='Dtypes/CudaSm90Grid.EveryPipelineMatchesOracle/*'; } > $L/chain_ep.txt 2>&1 &
{ FLASHTILE_SMALL_GRID=1 st racecheck_grouped 95 $SAN racecheck $T --gtest_filter='CudaSm90.GroupedMaskedGridComputesEveryBlock'; } > $L/chain_san1.txt 2>&1 &
{ FLASHTILE_SMALL_GRID=1 st memcheck_grouped 95 $SAN memcheck $T --gtest_filter='CudaSm90.GroupedMaskedGridComputesEveryBlock:Dtypes/CudaSm90Grid.MatchesOracle/bfloat16'; } > $L/chain_san2.txt 2>&1 &
wait
cat $L/chain*.txt | tee $L/summary.txt; echo "tests done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
S="bench --sweep --dtype bf16 --backends cuda_sm90 --repeats 10 --warmup 2"
sw() { local n=$1 bin=$2; shift 2; st $n 40 $bin $S "$@"; grep -A1 -E '^\[[0-9]+/' $L/$n.log | grep -v '^--' | paste - - | sed "s/^/$n /" >> $L/rows.txt; }
sw main_grid $A --sweep-head-dims 64,128,256 --sweep-seqlens 4096,16384 --sweep-causal 0,1
sw new_grid $B --sweep-head-dims 64,128,256 --sweep-seqlens 4096,16384 --sweep-causal 0,1
pack
sw new_causal $B --sweep-head-dims 64,128,256 --sweep-seqlens 4096,8192 --sweep-causal 1
sw main_causal $A --sweep-head-dims 64,128,256 --sweep-seqlens 4096,8192 --sweep-causal 1
pack
for pin in tma_ws tma_ws_overlap tma_ping_pong tma_persistent; do
  FLASHTILE_SM90_PIPELINE=$pin sw new_pin_$pin $B --sweep-head-dims 64,128,256 --sweep-seqlens 4096 --sweep-causal 1
done
FLASHTILE_SM90_PIPELINE=tma_ws_overlap sw main_pin_tma_ws_overlap $A --sweep-head-dims 256 --sweep-seqlens 4096 --sweep-causal 1
FLASHTILE_SM90_PIPELINE=tma_ping_pong_m192 sw new_pin_m192pp $B --sweep-head-dims 64 --sweep-seqlens 4096 --sweep-causal 1
cat $L/rows.txt
echo "all done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
