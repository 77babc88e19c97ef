#!/usr/bin/env bash
# Fifteenth session, call 5 (H200): call 4's change (it found no machine) with binaries built
# on the development machine for sm_90a and carried in .devbin/: base = 4b.8 (edd293f), new =
# c7684fa's (the pre-pass with 16-byte loads and dQ's zeroing, the grouped heaviest-first
# backward grid under a mask). The backward suite (new), the A/B interleaved, then memcheck.
set -u
L=$OUT/s15c5; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
pack() { tar czf $OUT/s15c5.tgz -C $OUT s15c5; }
B=/tmp/s15b5; mkdir -p $B
for f in base/flashtile new/flashtile new/flashtile_cuda_backward_tests; do
  mkdir -p $B/$(dirname $f); xz -dc .devbin/$f.xz > $B/$f; chmod +x $B/$f; done
T=$B/new/flashtile_cuda_backward_tests
FLASHTILE_SMALL_GRID=1 timeout 110 $T > $L/tests_all.log 2>&1
note "backward suite rc=$? $(grep -hE '^\[  (PASSED|FAILED) |FAILED  \]' $L/tests_all.log | tr '\n' ' ')"
pack
SW="--sweep --pass bwd --dtype bf16 --sweep-head-dims 64,128 --sweep-causal 0,1 --repeats 10 --warmup 2"
bench() { timeout 40 $B/$1/flashtile bench $SW --sweep-seqlens 4096,16384 --backends cuda_sm90 > $L/bench_$2.log 2>&1; note "bench $2 rc=$? $(grep -E '^cuda_sm90 bwd' $L/bench_$2.log | awk '{printf "%s ", $5}')"; }
bench new new_1; bench base base_1; bench new new_2; bench base base_2
timeout 30 $B/new/flashtile bench $SW --sweep-seqlens 4096 --backends cuda_mma > $L/bench_mma_new.log 2>&1
note "mma new rc=$? $(grep -E '^cuda_mma bwd' $L/bench_mma_new.log | awk '{printf "%s ", $5}')"
timeout 30 $B/base/flashtile bench $SW --sweep-seqlens 4096 --backends cuda_mma > $L/bench_mma_base.log 2>&1
note "mma base rc=$? $(grep -E '^cuda_mma bwd' $L/bench_mma_base.log | awk '{printf "%s ", $5}')"
pack
sub="CudaMmaBackward.EveryHeadDim*:BackendsAndDtypes/CudaBackwardGrid.VariantsMatchOracle/cuda_sm90_float16:CudaSm90Backward.BothMainKernels*"
FLASHTILE_SMALL_GRID=1 timeout 50 compute-sanitizer --tool memcheck --error-exitcode 1 $T --gtest_filter="$sub" > $L/memcheck.log 2>&1
note "memcheck rc=$? $(grep -hE 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' $L/memcheck.log | tr '\n' ' ')"
pack
