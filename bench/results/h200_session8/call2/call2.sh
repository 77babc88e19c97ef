#!/usr/bin/env bash
# Session 8, call 2 (lead): cuda_tf32x3 step 2c.5 on the write-up case — the P and K/V/Q splits
# behind one finiteness test each, and the d=64 split forward merging its own partials behind
# a grid barrier (cooperative launch). Built here; tests and sanitizers first, then the timed
# lines, A/B in this binary through FLASHTILE_TF32X3_MERGE=combine (the old merge).
set -u
L=$OUT/c2; mkdir -p $L/ncu bin
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
pack() { tar czf $OUT/c2.tgz --exclude='*.ncu-rep' -C $OUT c2; }
cmake -S . -B build-c2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHTILE_DEVELOPER_BUILD=ON -DFLASHTILE_BUILD_BENCHMARKS=OFF -DFLASHTILE_BUILD_TF32X3_BREAKDOWN=ON -DCMAKE_PREFIX_PATH=$PWD/.device/deps > $L/configure.log 2>&1
timeout 300 ninja -C build-c2 -j16 tools/flashtile flashtile_tf32x3_breakdown tests/flashtile_cuda_tf32x3_sm90_tests tests/flashtile_cuda_tf32x3_tests > $L/build.log 2>&1; echo "build rc=$? at $((SECONDS-t0)) s"; tail -3 $L/build.log
cp build-c2/tools/flashtile build-c2/flashtile_tf32x3_breakdown build-c2/tests/flashtile_cuda_tf32x3_sm90_tests build-c2/tests/flashtile_cuda_tf32x3_tests bin/
F=bin/flashtile
st() { local n=$1 lim=$2; shift 2; local s=$SECONDS; timeout $lim "$@" > $L/$n.log 2>&1; local rc=$?
  echo "== $n rc=$rc ($((SECONDS-s)) s, at $((SECONDS-t0)) s): $(grep -E 'PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY' $L/$n.log | tail -2 | tr '\n' ' ')"; }
SAN="compute-sanitizer --error-exitcode 1 --tool"
for i in 0 1 2 3; do { GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i st tfs$i 150 bin/flashtile_cuda_tf32x3_sm90_tests; } > $L/chain_tfs$i.txt 2>&1 & done
for i in 0 1; do { GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i st tf$i 170 bin/flashtile_cuda_tf32x3_tests; } > $L/chain_tf$i.txt 2>&1 & done
{ FLASHTILE_SMALL_GRID=1 st memcheck_merge 150 $SAN memcheck bin/flashtile_cuda_tf32x3_sm90_tests --gtest_filter='CudaTf32x3Sm90.MergeInGrid*:CudaTf32x3Sm90.SplitCallsRepeatBitwise'; } > $L/chain_san1.txt 2>&1 &
{ FLASHTILE_SMALL_GRID=1 st racecheck_merge 150 $SAN racecheck bin/flashtile_cuda_tf32x3_sm90_tests --gtest_filter='CudaTf32x3Sm90.MergeInGrid*:CudaTf32x3Sm90.SplitCallsRepeatBitwise'; } > $L/chain_san2.txt 2>&1 &
wait
cat $L/chain*.txt | sort | tee $L/summary.txt; echo "tests done at $((SECONDS-t0)) s" | tee -a $L/summary.txt; pack
W="bench --dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64 --backends cuda_tf32x3 --repeats 200"
for r in 1 2 3; do
  st writeup_merge_$r 30 $F $W
  FLASHTILE_TF32X3_MERGE=combine st writeup_combine_$r 30 $F $W
done
st writeup_merge_noflush 30 $F $W --no-flush
FLASHTILE_TF32X3_MERGE=combine st writeup_combine_noflush 30 $F $W --no-flush
grep -H "^cuda_tf32x3" $L/writeup_*.log | sed "s@$L/@@" | tee -a $L/summary.txt
st breakdown 40 bin/flashtile_tf32x3_breakdown --repeats 200
FLASHTILE_TF32X3_MERGE=combine st breakdown_combine 40 bin/flashtile_tf32x3_breakdown --repeats 200
pack
timeout 60 ncu --clock-control none --set full --import-source yes -k regex:tf32x3_sm90 -s 3 -c 1 -f -o $L/ncu/writeup_forward $F bench --warmup 0 --repeats 4 --dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64 --backends cuda_tf32x3 > $L/ncu/run.log 2>&1
ncu -i $L/ncu/writeup_forward.ncu-rep --page details --print-details all > $L/ncu/writeup_forward.details.txt 2>&1
ncu -i $L/ncu/writeup_forward.ncu-rep --page source --csv --print-source sass > $L/ncu/writeup_forward.sass.csv 2>&1
grep -m2 -E "Duration|SM Active" $L/ncu/writeup_forward.details.txt
pack; echo "all done at $((SECONDS-t0)) s"
