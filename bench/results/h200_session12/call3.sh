#!/usr/bin/env bash
# Twelfth session, call 3 (H200): the committed tree (cuda_sm90 backward 4b.1 as the kernel,
# 4b.2 reverted after call 2 measured it slower; auto's backward rule): the whole CUDA
# backward suite on both backends (small grid), gpu-check.sh's backward sanitizer subset,
# and the backward peers beside both backends once more.
set -u
L=$OUT/s12c3; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
B=/tmp/s12bin3; mkdir -p $B
for f in .devbin/new/*.xz; do xz -dc $f > $B/$(basename $f .xz) & done; wait; chmod +x $B/*
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $L/gpu.txt 2>&1
note start
T=$B/flashtile_cuda_backward_tests
# Two processes at once (the host oracle is the slow part): the cuda_sm90 tests and the rest.
FLASHTILE_SMALL_GRID=1 timeout 280 $T --gtest_filter='*cuda_sm90*:CudaSm90Backward.*' > $L/tests_sm90.log 2>&1 &
FLASHTILE_SMALL_GRID=1 timeout 280 $T --gtest_filter='-*cuda_sm90*:CudaSm90Backward.*' > $L/tests_rest.log 2>&1
wait
note "tests: sm90 $(grep -hE '^\[  (PASSED|FAILED) ' $L/tests_sm90.log | tr '\n' ' ') rest $(grep -hE '^\[  (PASSED|FAILED) ' $L/tests_rest.log | tr '\n' ' ')"
grep -h "FAILED\|margin" $L/tests_*.log | head -20 >> $L/steps.txt
SUB="BackendsAndDtypes/CudaBackwardGrid.VarlenMatchesOracle/cuda_mma_bfloat16:CudaMmaBackward.EveryHeadDim*:CudaMmaBackward.Refuses*"
SUB+=":BackendsAndDtypes/CudaBackwardGrid.VarlenMatchesOracle/cuda_sm90_bfloat16"
SUB+=":BackendsAndDtypes/CudaBackwardGrid.VariantsMatchOracle/cuda_sm90_float16:CudaSm90Backward.Refuses*"
for tool in memcheck racecheck; do
  FLASHTILE_SMALL_GRID=1 timeout 120 compute-sanitizer --tool $tool --error-exitcode 1 $T --gtest_filter="$SUB" > $L/$tool.log 2>&1
  note "$tool rc=$? $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log | tr '\n' ' ')"
done
PYTHONUNBUFFERED=1 timeout 120 python3 bench/peers.py --pass bwd --dtype bf16 --head-dims 64,128 \
  --seqlens 4096,16384 --peers flash,cudnn --backends cuda_sm90,cuda_mma --cli $B/flashtile \
  --cli-repeats 10 --cli-warmup 2 --write-each-row --tag _bwd_s12 --out $L > $L/peers.log 2>&1
note "peers rc=$?"
tar czf $OUT/s12c3.tgz -C $OUT s12c3
