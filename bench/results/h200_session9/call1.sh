#!/usr/bin/env bash
# Ninth session, call 1 (issue 11: split-KV for the 16-bit kernels). Binaries built on the dev
# VM for sm_90a, carried xz-compressed in .devbin/s9 (flashtile = this tree, flashtile_main =
# main before the change, cea2144 + the bwd4b merge's backward only; the test binaries of
# this tree), stripped. Run from the repo root with carry [".devbin"]. Logs: $OUT/s9c1.tgz.
#  1. B=1 H=1 bf16, d 64/128/256, N 1024/4096, full and causal, cuda_mma and cuda_sm90:
#     main's binary, this one pinned unsplit (FLASHTILE_{MMA,SM90}_SPLITS=1), this one auto;
#     the write-up's fp32 case on cuda_tf32x3 (its split moved to the shared host code);
#  2. the 16k/2k field grid, main's binary against this one (the unsplit kernels' speed);
#  3. the suites, each test its own process, small grid but for the split tests;
#     memcheck and racecheck on the split tests;
#  4. peers.py at B=1 H=1 beside FA2 and cuDNN, with what is left.
set -u
L=$OUT/s9c1; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib  # libhwy (the binaries are static otherwise)
export PYTHONUNBUFFERED=1
t0=$SECONDS
pack() { tar czf $OUT/s9c1.tgz -C $OUT s9c1; }
note() { echo "== $1 at $((SECONDS-t0)) s" | tee -a $L/steps.txt; pack; }
B=/tmp/s9bin; mkdir -p $B
for f in .devbin/s9/*.xz; do xz -dc $f > $B/$(basename $f .xz) & done; wait; chmod +x $B/*
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $L/gpu.txt 2>&1
F=$B/flashtile; M=$B/flashtile_main
note unpacked
# 1.
one() {  # one TAG BINARY ENV... -- ARGS
  local tag=$1 bin=$2; shift 2
  env "$@" $bin bench --dtype bf16 --batch 1 --heads 1 --backends cuda_mma,cuda_sm90 --repeats 30 \
    --warmup 5 $ARGS --output $L/one_${tag}_$NAME.json >> $L/one_head.log 2>&1
}
for d in 64 128 256; do for n in 1024 4096; do for c in 0 1; do
  NAME=d${d}_n${n}_c${c}; ARGS="--seqlen $n --head-dim $d $([ $c = 1 ] && echo --causal)"
  one main $M A=1; one before $F FLASHTILE_MMA_SPLITS=1 FLASHTILE_SM90_SPLITS=1; one after $F A=1
done; done; done
note one_head
for i in 1 2 3; do $F bench --dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64 \
  --backends cuda_tf32x3 --repeats 200 >> $L/writeup_tf32x3.log 2>&1; done
note writeup
# 2.
for tag in main new main2 new2; do
  bin=$F; case $tag in main*) bin=$M;; esac
  timeout 60 $bin bench --sweep --dtype bf16 --backends cuda_mma,cuda_sm90 --sweep-head-dims 64,128,256 \
    --sweep-seqlens 2048,16384 --sweep-causal 0,1 --repeats 10 --warmup 2 --output $L/grid_$tag.json \
    > $L/grid_$tag.log 2>&1
  note "grid $tag rc=$?"
done
# 3.
export FLASHTILE_SMALL_GRID=1
for bin in cuda_mma_tests cuda_sm90_tests cuda_tf32x3_tests cuda_tf32x3_sm90_tests; do
  for t in $($B/flashtile_$bin --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}'); do
    n=$(echo $bin.$t | tr '/.' '__')
    case $t in *Split*) grid=0;; *) grid=1;; esac
    FLASHTILE_SMALL_GRID=$grid timeout 200 $B/flashtile_$bin --gtest_filter="$t" > $L/test_$n.log 2>&1 &
  done
done
sub_mma="Dtypes/CudaMmaGrid.SplitKvMatchesOracle/bfloat16:CudaMma.SmallCallsSplitTheirKeys"
sub_sm90="Dtypes/CudaSm90Grid.SplitKvMatchesOracle/float16:CudaSm90.SmallCallsSplitTheirKeys"
for tool in memcheck racecheck; do
  timeout 200 compute-sanitizer --tool $tool --error-exitcode 1 $B/flashtile_cuda_mma_tests --gtest_filter="$sub_mma" > $L/${tool}_mma.log 2>&1 &
  timeout 200 compute-sanitizer --tool $tool --error-exitcode 1 $B/flashtile_cuda_sm90_tests --gtest_filter="$sub_sm90" > $L/${tool}_sm90.log 2>&1 &
done
wait
{ for f in $L/test_*.log $L/memcheck*.log $L/racecheck*.log; do echo "$(basename $f): $(grep -hE '^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY' $f | tr '\n' ' ')"; done; } > $L/tests_summary.txt
grep -L "PASSED\|ERROR SUMMARY: 0\|RACECHECK SUMMARY: 0" $L/test_*.log $L/memcheck*.log $L/racecheck*.log > $L/tests_not_passed.txt
unset FLASHTILE_SMALL_GRID
note tests
# 4.
left=$((480 - (SECONDS - t0)))
[ $left -gt 20 ] && timeout $left python3 bench/peers.py --batch-heads 1,1 --dtype bf16 --head-dims 64,128,256 \
  --seqlens 1024,4096 --causal 0,1 --peers flash,cudnn --backends cuda_mma,cuda_sm90 --cli $F \
  --cli-repeats 30 --cli-warmup 5 --write-each-row --out $L --tag _one_head > $L/peers_log.txt 2>&1
note "peers rc=$?"
