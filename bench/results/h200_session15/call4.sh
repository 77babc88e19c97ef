#!/usr/bin/env bash
# NOT RUN: no device machine could be started for it; call5.sh ran the same change with
# binaries built on the development machine.
# Fifteenth session, call 4 (H200): the backward pre-pass with 16-byte loads where O's and
# dO's rows allow them, and the dQ accumulator zeroed there instead of by a memset (both
# backends' passes). The backward suite, the A/B against 4b.8 (HEAD), then memcheck.
set -u
L=$OUT/s15c4; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
pack() { tar czf $OUT/s15c4.tgz -C $OUT s15c4; }
cmake -S . -B build-gpu -G Ninja -DCMAKE_PREFIX_PATH=$PWD/.device/deps -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DFLASHTILE_BUILD_BENCHMARKS=OFF > $L/configure.log 2>&1
timeout 200 ninja -C build-gpu flashtile_cli flashtile_cuda_backward_tests > $L/build.log 2>&1
note "build rc=$? $(tail -1 $L/build.log)"
N=build-gpu; F=$N/tools/flashtile; T=$N/tests/flashtile_cuda_backward_tests
B=/tmp/s15b4; mkdir -p $B; cp $F $B/new
FLASHTILE_SMALL_GRID=1 timeout 110 $T > $L/tests_all.log 2>&1
note "backward suite rc=$? $(grep -hE '^\[  (PASSED|FAILED) |FAILED  \]' $L/tests_all.log | tr '\n' ' ')"
pack
SW="--sweep --pass bwd --dtype bf16 --sweep-head-dims 64,128 --sweep-causal 0,1 --repeats 10 --warmup 2"
bench() { timeout 60 $1 bench $SW --sweep-seqlens 4096,16384 --backends cuda_sm90 > $L/bench_$2.log 2>&1; note "bench $2 rc=$? $(grep -E '^cuda_sm90 bwd' $L/bench_$2.log | awk '{printf "%s ", $5}')";
  timeout 40 $1 bench $SW --sweep-seqlens 4096 --backends cuda_mma > $L/bench_mma_$2.log 2>&1; note "bench mma $2 rc=$? $(grep -E '^cuda_mma bwd' $L/bench_mma_$2.log | awk '{printf "%s ", $5}')"; }
bench $B/new new_1
pack
cp -r .device/base-src/src/. src/
timeout 150 ninja -C build-gpu flashtile_cli > $L/build_base.log 2>&1
note "base build rc=$? $(tail -1 $L/build_base.log)"; cp $F $B/base
bench $B/base base_1
pack
sub="CudaMmaBackward.EveryHeadDim*:BackendsAndDtypes/CudaBackwardGrid.VariantsMatchOracle/cuda_sm90_float16:CudaSm90Backward.BothMainKernels*"
FLASHTILE_SMALL_GRID=1 timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 $T --gtest_filter="$sub" > $L/memcheck.log 2>&1
note "memcheck rc=$? $(grep -hE 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' $L/memcheck.log | tr '\n' ' ')"
pack
