#!/usr/bin/env bash
# Fifteenth session, call 1 (H200): cuda_sm90 backward 4b.7 (Pᵀ's exp2s under dPᵀ's GEMM,
# dSᵀ under dV's: S and dP committed as two groups, dV issued once P is packed), built on the
# device. Tests and sanitizers of the backward, then timings interleaved with the committed
# 4b.6 (HEAD's sources from .device/base-src, built second).
set -u
L=$OUT/s15c1; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
pack() { tar czf $OUT/s15c1.tgz -C $OUT s15c1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $L/gpu.txt 2>&1
cmake -S . -B build-gpu -G Ninja -DCMAKE_PREFIX_PATH=$PWD/.device/deps -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DFLASHTILE_BUILD_BENCHMARKS=OFF > $L/configure.log 2>&1
timeout 300 ninja -C build-gpu flashtile_cli flashtile_cuda_backward_tests > $L/build.log 2>&1
note "build rc=$? $(tail -1 $L/build.log)"
N=build-gpu; F=$N/tools/flashtile; T=$N/tests/flashtile_cuda_backward_tests
B=/tmp/s15b1; mkdir -p $B; cp $F $B/new
FLASHTILE_SMALL_GRID=1 timeout 100 $T --gtest_filter='CudaSm90Backward.*' > $L/tests_sm90.log 2>&1
note "sm90 tests rc=$? $(grep -hE '^\[  (PASSED|FAILED) |FAILED  \]' $L/tests_sm90.log | tr '\n' ' ')"
grep -h "Failure\|Expected\|which is\|margin" $L/tests_sm90.log | head -20 >> $L/steps.txt
pack
SW="--sweep --pass bwd --dtype bf16 --sweep-head-dims 64,128 --sweep-seqlens 4096,16384 --sweep-causal 0,1 --repeats 10 --warmup 2 --backends cuda_sm90"
bench() { timeout 60 env $3 $1 bench $SW > $L/bench_$2.log 2>&1; note "bench $2 rc=$? $(grep -E '^cuda_sm90 bwd' $L/bench_$2.log | awk '{printf "%s ", $5}')"; }
bench $B/new new_1 X=1
pack
FLASHTILE_SMALL_GRID=1 timeout 170 $T > $L/tests_all.log 2>&1
note "backward suite rc=$? $(grep -hE '^\[  (PASSED|FAILED) |FAILED  \]' $L/tests_all.log | tr '\n' ' ')"
pack
sub="BackendsAndDtypes/CudaBackwardGrid.VarlenMatchesOracle/cuda_sm90_bfloat16"
sub+=":BackendsAndDtypes/CudaBackwardGrid.VariantsMatchOracle/cuda_sm90_float16:CudaSm90Backward.*"
for tool in memcheck racecheck; do
  FLASHTILE_SMALL_GRID=1 timeout 100 compute-sanitizer --tool $tool --error-exitcode 1 $T --gtest_filter="$sub" > $L/$tool.log 2>&1
  note "$tool rc=$? $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' $L/$tool.log | tr '\n' ' ')"
  pack
done
cp -r .device/base-src/src/. src/
timeout 150 ninja -C build-gpu flashtile_cli > $L/build_base.log 2>&1
note "base build rc=$? $(tail -1 $L/build_base.log)"; cp $F $B/base
bench $B/base base_1 X=1; bench $B/new new_2 X=1; bench $B/base base_2 X=1; bench $B/new new_3 X=1
pack
