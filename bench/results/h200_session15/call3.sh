#!/usr/bin/env bash
# Fifteenth session, call 3 (H200): 4b.8 = every consumer thread arrives on a stage's empty
# barrier (racecheck, calls 1-2), dQ staged without bank conflicts (ncu, call 2: 2-way on the
# 16 STS.64 a step), lse·log2e read before the GEMMs at d=128. Tests, memcheck and racecheck,
# the A/B against 4b.7 (HEAD's sources), then the peers' backward beside cuda_sm90 and cuda_mma.
set -u
L=$OUT/s15c3; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
pack() { tar czf $OUT/s15c3.tgz -C $OUT s15c3; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $L/gpu.txt 2>&1
cmake -S . -B build-gpu -G Ninja -DCMAKE_PREFIX_PATH=$PWD/.device/deps -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DFLASHTILE_BUILD_BENCHMARKS=OFF > $L/configure.log 2>&1
timeout 300 ninja -C build-gpu flashtile_cli flashtile_cuda_backward_tests > $L/build.log 2>&1
note "build rc=$? $(tail -1 $L/build.log)"
N=build-gpu; F=$N/tools/flashtile; T=$N/tests/flashtile_cuda_backward_tests
B=/tmp/s15b3; mkdir -p $B; cp $F $B/new; cp $T $B/tests
FLASHTILE_SMALL_GRID=1 timeout 150 $T > $L/tests_all.log 2>&1
note "backward suite rc=$? $(grep -hE '^\[  (PASSED|FAILED) |FAILED  \]' $L/tests_all.log | tr '\n' ' ')"
sub="BackendsAndDtypes/CudaBackwardGrid.VarlenMatchesOracle/cuda_sm90_bfloat16"
sub+=":BackendsAndDtypes/CudaBackwardGrid.VariantsMatchOracle/cuda_sm90_float16:CudaSm90Backward.*"
FLASHTILE_SMALL_GRID=1 timeout 90 compute-sanitizer --tool racecheck --error-exitcode 1 $T --gtest_filter="$sub" > $L/racecheck.log 2>&1
note "racecheck rc=$? $(grep -hE 'RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' $L/racecheck.log | tr '\n' ' ')"
pack
SW="--sweep --pass bwd --dtype bf16 --sweep-head-dims 64,128 --sweep-seqlens 4096,16384 --sweep-causal 0,1 --repeats 10 --warmup 2 --backends cuda_sm90"
bench() { timeout 60 env $3 $1 bench $SW > $L/bench_$2.log 2>&1; note "bench $2 rc=$? $(grep -E '^cuda_sm90 bwd' $L/bench_$2.log | awk '{printf "%s ", $5}')"; }
bench $B/new new_1 X=1
pack
timeout 240 python3 bench/peers.py --pass bwd --dtype bf16 --head-dims 64,128 --seqlens 4096,16384 \
  --peers flash,cudnn --backends cuda_sm90,cuda_mma --cli $B/new --cli-repeats 10 --cli-warmup 2 \
  --write-each-row --tag _bwd_s15 --out $L > $L/peers.log 2>&1
note "peers rc=$? $(tail -12 $L/peers.log | tr '\n' '|')"
pack
cp -r .device/base-src/src/. src/
timeout 150 ninja -C build-gpu flashtile_cli > $L/build_base.log 2>&1
note "base build rc=$? $(tail -1 $L/build_base.log)"; cp $F $B/base
bench $B/base base_1 X=1; bench $B/new new_2 X=1; bench $B/base base_2 X=1
pack
FLASHTILE_SMALL_GRID=1 timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 $B/tests --gtest_filter="$sub" > $L/memcheck.log 2>&1
note "memcheck rc=$? $(grep -hE 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' $L/memcheck.log | tr '\n' ' ')"
pack
