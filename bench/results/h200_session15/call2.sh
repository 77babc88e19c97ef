#!/usr/bin/env bash
# Fifteenth session, call 2 (H200): 4b.7 with the consumers' __syncwarp before their arrival
# on a stage's empty barrier (racecheck, call 1) and dV waited for before dSᵀ at d=64 (the
# ws kernel's spills 68 -> 0 B). racecheck and the sm90 tests again, the A/B against 4b.6
# (HEAD's sources), a sweep over seqlen at d=128, then Nsight Compute on the backward's
# kernels at d=128, full, 4k and 16k.
set -u
L=$OUT/s15c2; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
pack() { tar czf $OUT/s15c2.tgz -C $OUT s15c2; }
cmake -S . -B build-gpu -G Ninja -DCMAKE_PREFIX_PATH=$PWD/.device/deps -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DFLASHTILE_BUILD_BENCHMARKS=OFF > $L/configure.log 2>&1
timeout 300 ninja -C build-gpu flashtile_cli flashtile_cuda_backward_tests > $L/build.log 2>&1
note "build rc=$? $(tail -1 $L/build.log)"
N=build-gpu; F=$N/tools/flashtile; T=$N/tests/flashtile_cuda_backward_tests
B=/tmp/s15b2; mkdir -p $B; cp $F $B/new
FLASHTILE_SMALL_GRID=1 timeout 100 $T --gtest_filter='CudaSm90Backward.*:*cuda_sm90*' > $L/tests_sm90.log 2>&1
note "sm90 tests rc=$? $(grep -hE '^\[  (PASSED|FAILED) |FAILED  \]' $L/tests_sm90.log | tr '\n' ' ')"
sub="BackendsAndDtypes/CudaBackwardGrid.VariantsMatchOracle/cuda_sm90_float16:CudaSm90Backward.*"
FLASHTILE_SMALL_GRID=1 timeout 100 compute-sanitizer --tool racecheck --error-exitcode 1 $T --gtest_filter="$sub" > $L/racecheck.log 2>&1
note "racecheck rc=$? $(grep -hE 'RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' $L/racecheck.log | tr '\n' ' ')"
pack
SW="--sweep --pass bwd --dtype bf16 --sweep-head-dims 64,128 --sweep-seqlens 4096,16384 --sweep-causal 0,1 --repeats 10 --warmup 2 --backends cuda_sm90"
bench() { timeout 60 env $3 $1 bench $SW > $L/bench_$2.log 2>&1; note "bench $2 rc=$? $(grep -E '^cuda_sm90 bwd' $L/bench_$2.log | awk '{printf "%s ", $5}')"; }
bench $B/new new_1 X=1
timeout 60 $B/new bench --sweep --pass bwd --dtype bf16 --sweep-head-dims 128 --sweep-seqlens 1024,2048,4096,8192,16384 --sweep-causal 0 --repeats 10 --warmup 2 --backends cuda_sm90 > $L/bench_seqlens.log 2>&1
note "seqlens rc=$? $(grep -E '^cuda_sm90 bwd' $L/bench_seqlens.log | awk '{printf "%s ", $5}')"
pack
cp -r .device/base-src/src/. src/
timeout 150 ninja -C build-gpu flashtile_cli > $L/build_base.log 2>&1
note "base build rc=$? $(tail -1 $L/build_base.log)"; cp $F $B/base
bench $B/base base_1 X=1; bench $B/new new_2 X=1; bench $B/base base_2 X=1
pack
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SourceCounters"
for s in 4096 16384; do
  b=$((16384 / s))
  timeout 150 ncu --clock-control none $S -k regex:backward -c 4 -o $L/ncu_$s $B/new bench --pass bwd --dtype bf16 --batch $b --heads 16 --seqlen $s --head-dim 128 --repeats 1 --warmup 0 --backends cuda_sm90 > $L/ncu_$s.log 2>&1
  note "ncu $s rc=$? $(tail -2 $L/ncu_$s.log | tr '\n' ' ')"
  ncu -i $L/ncu_$s.ncu-rep --page details > $L/ncu_${s}_details.txt 2>&1
  ncu -i $L/ncu_$s.ncu-rep --page source --csv --print-source sass -k regex:ws_backward > $L/ncu_${s}_source.csv 2>&1
  note "ncu $s import: $(wc -c < $L/ncu_${s}_details.txt) B details, $(wc -c < $L/ncu_${s}_source.csv) B source"
  pack
done
