#!/usr/bin/env bash
# Twelfth session, call 4 (H200): cuda_sm90 backward 4b.3 (plain logits: P while dPᵀ is
# computed, dV issued before dS) against 4b.1 (call 3's binary, "prev"), interleaved
# prev/new/prev/new; 4b.3's suite (small grid) and the sanitizer subset.
set -u
L=$OUT/s12c4; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
B=/tmp/s12bin4; mkdir -p $B/new $B/prev
for v in new prev; do for f in .devbin/$v/*.xz; do xz -dc $f > $B/$v/$(basename $f .xz) & done; done; wait; chmod +x $B/*/*
note start
SW="--sweep --pass bwd --dtype bf16 --sweep-head-dims 64,128 --sweep-seqlens 4096,16384 --sweep-causal 0,1 --repeats 10 --warmup 2 --backends cuda_sm90"
for i in 1 2; do for v in prev new; do
  timeout 60 $B/$v/flashtile bench $SW > $L/bench_${v}_$i.log 2>&1; note "bench $v $i rc=$?"
done; done
T=$B/new/flashtile_cuda_backward_tests
FLASHTILE_SMALL_GRID=1 timeout 150 $T --gtest_filter='*cuda_sm90*:CudaSm90Backward.*:CudaBackward.DeterministicIsBitwiseEqualOver100Runs:CudaBackward.AtomicMode*' > $L/tests.log 2>&1
note "tests rc=$? $(grep -hE '^\[  (PASSED|FAILED) ' $L/tests.log | tr '\n' ' ')"
SUB='BackendsAndDtypes/CudaBackwardGrid.VarlenMatchesOracle/cuda_sm90_bfloat16:BackendsAndDtypes/CudaBackwardGrid.VariantsMatchOracle/cuda_sm90_float16:CudaSm90Backward.*'
for tool in memcheck racecheck; do
  FLASHTILE_SMALL_GRID=1 timeout 90 compute-sanitizer --tool $tool --error-exitcode 1 $T --gtest_filter="$SUB" > $L/$tool.log 2>&1
  note "$tool rc=$? $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log | tr '\n' ' ')"
done
tar czf $OUT/s12c4.tgz -C $OUT s12c4
