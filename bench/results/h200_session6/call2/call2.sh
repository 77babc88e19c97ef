#!/usr/bin/env bash
# Session 6, call 2 on merged main: build everything, every GPU suite and the sanitizer phase
# at once (chains in parallel: the host's 16 cores run the oracles), then the timed lines on a
# quiet machine. Logs come back as $OUT/c2.tgz (refreshed after each phase).
set -u
L=$OUT/c2; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
B=build-gpu; T=$B/tests; F=$B/tools/flashtile
pack() { tar czf $OUT/c2.tgz -C $OUT c2; }
st() { local n=$1 lim=$2; shift 2; local s=$SECONDS; timeout $lim "$@" > $L/$n.log 2>&1; local rc=$?
  echo "== $n rc=$rc ($((SECONDS-s)) s, at $((SECONDS-t0)) s): $(grep -E 'PASSED|FAILED|passed|failed|ERROR SUMMARY|RACECHECK SUMMARY' $L/$n.log | tail -2 | tr '\n' ' ')"; }
cmake -S . -B $B -G Ninja -DCMAKE_PREFIX_PATH=$PWD/.device/deps -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DFLASHTILE_BUILD_PYTHON=ON -DFLASHTILE_BUILD_MMA_VARIANTS=ON -DFLASHTILE_BUILD_BENCHMARKS=ON \
  -DFLASHTILE_BUILD_TF32X3_BREAKDOWN=ON -DPython_EXECUTABLE=$(command -v python3) > $L/configure.log 2>&1 &&
  ninja -C $B > $L/build.log 2>&1 || { tail -40 $L/configure.log $L/build.log; pack; exit 1; }
echo "built at $((SECONDS-t0)) s" | tee $L/summary.txt
export PYTHONPATH=$PWD/$B/python
PY="python3 -m pytest -q -rs -p no:cacheprovider"
{ st cuda_tests 100 $T/flashtile_cuda_tests; st cuda_mma_tests 200 $T/flashtile_cuda_mma_tests; } > $L/chain1.txt 2>&1 &
{ st cuda_sm90_tests 250 $T/flashtile_cuda_sm90_tests; } > $L/chain2.txt 2>&1 &
{ st cuda_tf32x3_tests 150 $T/flashtile_cuda_tf32x3_tests; st cuda_tf32x3_sm90_tests 100 $T/flashtile_cuda_tf32x3_sm90_tests; } > $L/chain3.txt 2>&1 &
for i in 0 1 2; do
  { FLASHTILE_SMALL_GRID=1 GTEST_TOTAL_SHARDS=3 GTEST_SHARD_INDEX=$i st backward_shard$i 250 $T/flashtile_cuda_mma_backward_tests; } > $L/chain_bwd$i.txt 2>&1 &
done
{ st py_backward 120 $PY tests/python/test_backward.py -k cuda; st py_torch 100 $PY tests/python/test_torch.py -k "cuda and not fullgraph"; } > $L/chain_py.txt 2>&1 &
{ CMAKE_EXTRA="-DFLASHTILE_BUILD_BENCHMARKS=ON -DFLASHTILE_BUILD_TF32X3_BREAKDOWN=ON" SAN_LIMIT=150 PHASE=tests SUITES=0 bash scripts/gpu-check.sh $L/san > $L/san_summary.txt 2>&1; } &
wait
cat $L/chain*.txt | tee -a $L/summary.txt; grep -E "===|rc=" $L/san_summary.txt | tee -a $L/summary.txt
echo "tests done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
# Timed lines, one at a time on a quiet machine.
W="bench --dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64 --backends cuda_tf32x3 --repeats 200"
for r in 1 2 3; do st writeup_one_launch_$r 30 $F $W; done
FLASHTILE_TF32X3_MERGE=combine st writeup_two_launches 30 $F $W
st tf32x3_breakdown 40 $B/flashtile_tf32x3_breakdown --repeats 200 --csv $L/tf32x3_breakdown.csv
grep -h "^cuda_tf32x3" $L/writeup_*.log | tee -a $L/summary.txt
for v in "" "--window 1024,0"; do
  st "line16k${v//[^a-z0-9]/_}" 60 $F bench --dtype bf16 --seqlen 16384 --heads 16 --head-dim 128 --causal $v --backends cuda_mma,cuda_sm90 --repeats 10
done
grep -h "^cuda_" $L/line16k*.log | tee -a $L/summary.txt
st harness_varlen 90 $B/flashtile_mma_variants --groups varlen --csv $L/varlen.csv
tail -12 $L/harness_varlen.log | tee -a $L/summary.txt; pack
PYTHONUNBUFFERED=1 st peers 150 python3 bench/peers.py --cli $F --backends cuda_mma,cuda_sm90 --dtype bf16 --head-dims 64,128,256 --seqlens 4096,16384 --peers flash,cudnn --out $L/peers
tail -16 $L/peers.log | tee -a $L/summary.txt
st fma_peak 30 $B/bench/micro/flashtile_micro_bench --benchmark_filter=fma_peak
tail -5 $L/fma_peak.log | tee -a $L/summary.txt
echo "all done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
