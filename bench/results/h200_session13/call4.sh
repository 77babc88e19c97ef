#!/usr/bin/env bash
# Thirteenth session, call 4 (H200): cuda_sm90 backward 4b.5 (the next step's cp.async wait,
# fence and row stats before the dQ adds are issued, so that the fence does not wait for
# them), built on the device, against 4b.1 (call 1's binary, "base"), interleaved; its SASS
# counts; the sm90 backward tests (small grid) and the sanitizer subset.
set -u
L=$OUT/s13c4; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib:$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
pack() { tar czf $OUT/s13c4.tgz -C $OUT s13c4; }
B=/tmp/s13bin4; mkdir -p $B/base
for f in .devbin/base/*.xz; do xz -dc $f > $B/base/$(basename $f .xz) & done; wait; chmod +x $B/base/*
cmake -S . -B build-gpu -G Ninja -DCMAKE_PREFIX_PATH=$PWD/.device/deps -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DFLASHTILE_BUILD_BENCHMARKS=OFF > $L/configure.log 2>&1
timeout 300 ninja -C build-gpu flashtile_cli flashtile_cuda_backward_tests > $L/build.log 2>&1
note "build rc=$? $(tail -1 $L/build.log)"
N=build-gpu; F=$N/tools/flashtile; T=$N/tests/flashtile_cuda_backward_tests
cuobjdump -sass $N/CMakeFiles/flashtile_sm90.dir/src/cuda/04_sm90/backward_hdim128.cu.o > $L/bwd128.sass 2>&1
note "sass d128: LDL $(grep -c LDL $L/bwd128.sass) STL $(grep -c STL $L/bwd128.sass) HGMMA $(grep -c HGMMA $L/bwd128.sass)"
gzip -9 $L/bwd128.sass
SW="--sweep --pass bwd --dtype bf16 --sweep-head-dims 64,128 --sweep-seqlens 4096,16384 --sweep-causal 0,1 --repeats 10 --warmup 2 --backends cuda_sm90"
bench() { timeout 60 $1 bench $SW > $L/bench_$2.log 2>&1; note "bench $2 rc=$? $(grep -E '^cuda_sm90 bwd' $L/bench_$2.log | awk '{printf "%s ", $5}')"; }
bench $B/base/flashtile base_1; bench $F new_1; bench $B/base/flashtile base_2; bench $F new_2
pack
FLASHTILE_SMALL_GRID=1 timeout 150 $T --gtest_filter='*cuda_sm90*:CudaSm90Backward.*:CudaBackward.DeterministicIsBitwiseEqualOver100Runs:CudaBackward.AtomicMode*' > $L/tests.log 2>&1
note "tests rc=$? $(grep -hE '^\[  (PASSED|FAILED) |FAILED  \]' $L/tests.log | tr '\n' ' ')"
SUB='BackendsAndDtypes/CudaBackwardGrid.VarlenMatchesOracle/cuda_sm90_bfloat16:BackendsAndDtypes/CudaBackwardGrid.VariantsMatchOracle/cuda_sm90_float16:CudaSm90Backward.*'
for tool in memcheck racecheck; do
  FLASHTILE_SMALL_GRID=1 timeout 90 compute-sanitizer --tool $tool --error-exitcode 1 $T --gtest_filter="$SUB" > $L/$tool.log 2>&1
  note "$tool rc=$? $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log | tr '\n' ' ')"
done
pack
