#!/usr/bin/env bash
# Thirteenth session, call 2 (H200): cuda_sm90 backward 4b.4 (dQ added by the copy engine:
# two tensor-map reductions per warpgroup tile; row stats' loads a step ahead) against 4b.1
# (call 1's binary, "base") and against its own 4b.1 path (FLASHTILE_SM90_BACKWARD_DQ=atomics),
# interleaved; the backward suite (small grid) on both backends, the atomics path's sm90
# subset, the sanitizer subset, and ncu of the new d=128 kernel.
set -u
L=$OUT/s13c2; mkdir -p $L/ncu
export LD_LIBRARY_PATH=$PWD/.devbin/lib
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
pack() { tar czf $OUT/s13c2.tgz --exclude='*.ncu-rep' -C $OUT s13c2; }
B=/tmp/s13bin2; mkdir -p $B/new $B/base
for v in new base; do for f in .devbin/$v/*.xz; do xz -dc $f > $B/$v/$(basename $f .xz) & done; done; wait; chmod +x $B/*/*
note start
SW="--sweep --pass bwd --dtype bf16 --sweep-head-dims 64,128 --sweep-seqlens 4096,16384 --sweep-causal 0,1 --repeats 10 --warmup 2 --backends cuda_sm90"
bench() { timeout 60 env $2 $B/$1/flashtile bench $SW > $L/bench_$3.log 2>&1; note "bench $3 rc=$? $(grep -E 'cuda_sm90 bwd' $L/bench_$3.log | awk '{printf "%s ", $4}')"; }
bench base X=1 base_1
bench new X=1 tma_1
bench new FLASHTILE_SM90_BACKWARD_DQ=atomics atomics_1
bench base X=1 base_2
bench new X=1 tma_2
pack
T=$B/new/flashtile_cuda_backward_tests
FLASHTILE_SMALL_GRID=1 timeout 200 $T > $L/tests.log 2>&1
note "tests rc=$? $(grep -hE '^\[  (PASSED|FAILED) |FAILED  \]' $L/tests.log | tr '\n' ' ')"
pack
FLASHTILE_SM90_BACKWARD_DQ=atomics FLASHTILE_SMALL_GRID=1 timeout 60 $T --gtest_filter='BackendsAndDtypes/CudaBackwardGrid.MatchesOracle/cuda_sm90_bfloat16:BackendsAndDtypes/CudaBackwardGrid.VarlenMatchesOracle/cuda_sm90_float16' > $L/tests_atomics.log 2>&1
note "atomics tests rc=$? $(grep -hE '^\[  (PASSED|FAILED) |FAILED  \]' $L/tests_atomics.log | tr '\n' ' ')"
SUB='BackendsAndDtypes/CudaBackwardGrid.VarlenMatchesOracle/cuda_sm90_bfloat16:BackendsAndDtypes/CudaBackwardGrid.VariantsMatchOracle/cuda_sm90_float16:CudaSm90Backward.*'
for tool in memcheck racecheck; do
  FLASHTILE_SMALL_GRID=1 timeout 90 compute-sanitizer --tool $tool --error-exitcode 1 $T --gtest_filter="$SUB" > $L/$tool.log 2>&1
  note "$tool rc=$? $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log | tr '\n' ' ')"
done
pack
timeout 60 ncu --clock-control none --set full --import-source yes -k regex:sm90_backward_kernel \
  -c 1 -f -o $L/ncu/d128 $B/new/flashtile bench --pass bwd --backends cuda_sm90 --dtype bf16 \
  --warmup 0 --repeats 1 --batch 1 --heads 16 --seqlen 16384 --head-dim 128 > $L/ncu/d128.run.log 2>&1
note "ncu rc=$?"
ncu -i $L/ncu/d128.ncu-rep --page raw --csv > $L/ncu/d128.raw.csv 2>&1
ncu -i $L/ncu/d128.ncu-rep --page source --csv --print-source sass > $L/ncu/d128.sass.csv 2>&1
note done
pack
