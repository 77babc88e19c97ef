#!/usr/bin/env bash
# Sixteenth session, call 1 (H200): cuda_sm90 forward 4.12, binaries built on the development
# machine for sm_90a and carried xz'd in .devbin/: base = ea03f5f (main at the session's
# start), b = 4.12a (O's rescale skipped when no row's max moved), ab = 4.12a + 4.12b (d=128
# full on 176-key tiles, d=256 on 80-key tiles). The new tests first (ab), then the field
# grid's sweep interleaved base / b / ab twice, the shorter lengths, then the sm90 suite.
set -u
L=$OUT/s16c1; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
pack() { tar czf $OUT/s16c1.tgz -C $OUT s16c1; }
B=/tmp/s16b; mkdir -p $B
for f in base/flashtile b/flashtile ab/flashtile ab/flashtile_cuda_sm90_tests; do
  mkdir -p $B/$(dirname $f); (xz -dc .devbin/$f.xz > $B/$f; chmod +x $B/$f) & done; wait
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $L/gpu.txt 2>&1
note "unpacked; $(tail -1 $L/gpu.txt)"
T=$B/ab/flashtile_cuda_sm90_tests
FLASHTILE_SMALL_GRID=1 timeout 100 $T --gtest_filter='CudaSm90WideKeys.*:Sm90Pieces.*:Dtypes/CudaSm90Grid.MatchesOracle/*' > $L/tests_new.log 2>&1
note "new tests rc=$? $(grep -hE '^\[  (PASSED|FAILED) |FAILED  \]' $L/tests_new.log | tr '\n' ' ')"
pack
SW="--sweep --dtype bf16 --repeats 10 --warmup 2 --backends cuda_sm90"
bench() {  # bench BINARY TAG SEQLENS HEAD_DIMS [PINNED_PIPELINE]
  FLASHTILE_SM90_PIPELINE=${5:-} timeout 45 $B/$1/flashtile bench $SW --sweep-seqlens $3 --sweep-head-dims $4 --sweep-causal 0,1 > $L/bench_$2.log 2>&1
  note "bench $2 rc=$? $(grep -E 'TFLOP/s' $L/bench_$2.log | grep -v backend | awk '{printf "%s ", $1}')"
}
for r in 1 2; do
  for v in base b ab; do bench $v ${v}_$r 4096,16384 64,128,256; done
  pack
done
bench ab ab_short 1024,2048 128,256; bench base base_short 1024,2048 128,256
# Same binary, the other consumers / tiles pinned: d=256 on 4.5 (no spill) against its
# default; d=128 on 128-key 4.5 against the 176-key default.
bench ab ab_pp256 4096,16384 256 tma_ping_pong; bench ab ab_pp128 4096,16384 128 tma_ping_pong
for w in "" "--window 1024,0"; do
  timeout 40 $B/ab/flashtile bench --dtype bf16 --seqlen 16384 --heads 16 --head-dim 128 --causal $w \
    --backends cuda_mma,cuda_sm90 --repeats 10 >> $L/window_line.log 2>&1
done
note "window line: $(grep -E '^cuda_(mma|sm90) ' $L/window_line.log | awk '{printf "%s %s; ", $1, $2}')"
pack
FLASHTILE_SMALL_GRID=1 timeout 150 $T --gtest_filter='Dtypes/CudaSm90Grid.EveryPipelineMatchesOracle/*:Dtypes/CudaSm90Grid.VariantsMatchOracle/*:Dtypes/CudaSm90Grid.SplitKvMatchesOracle/*:CudaSm90.DeterministicOver100Runs:CudaSm90.ScaleOfAnySign' > $L/tests_more.log 2>&1
note "more tests rc=$? $(grep -hE '^\[  (PASSED|FAILED) |FAILED  \]' $L/tests_more.log | tr '\n' ' ')"
grep -h "Failure\|Expected\|which is\|error" $L/tests_*.log | head -20 >> $L/steps.txt
pack
