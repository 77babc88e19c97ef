#!/usr/bin/env bash
# Twelfth session, call 2 (H200): cuda_sm90 backward step 4b.2 (dQ by bulk reductions from a
# staged tile) against 4b.1 (FLASHTILE_SM90_BACKWARD_DQ=atomics, same binary), both beside
# cuda_mma; the backward peers (PyTorch FA2 and cuDNN) in the same call; the suite again.
set -u
L=$OUT/s12c2; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
B=/tmp/s12bin2; mkdir -p $B
for f in .devbin/new/*.xz; do xz -dc $f > $B/$(basename $f .xz) & done; wait; chmod +x $B/*
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $L/gpu.txt 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())" >> $L/gpu.txt 2>&1
note start
T=$B/flashtile_cuda_backward_tests
FLASHTILE_SMALL_GRID=1 timeout 200 $T --gtest_filter='*cuda_sm90*:CudaSm90Backward.*:CudaBackward.*' > $L/tests.log 2>&1
note "tests rc=$? $(grep -hE '^\[  (PASSED|FAILED) ' $L/tests.log | tr '\n' ' ')"
SW="--sweep --pass bwd --dtype bf16 --sweep-head-dims 64,128 --sweep-causal 0,1 --repeats 10 --warmup 2"
timeout 120 $B/flashtile bench $SW --sweep-seqlens 1024,2048,4096,16384 --backends cuda_sm90,cuda_mma > $L/bench_bulk.log 2>&1
note "bench bulk rc=$?"
FLASHTILE_SM90_BACKWARD_DQ=atomics timeout 60 $B/flashtile bench $SW --sweep-seqlens 4096,16384 --backends cuda_sm90 > $L/bench_atomics.log 2>&1
note "bench atomics rc=$?"
PYTHONUNBUFFERED=1 timeout 200 python3 bench/peers.py --pass bwd --dtype bf16 --head-dims 64,128 \
  --seqlens 4096,16384 --peers flash,cudnn --backends cuda_sm90,cuda_mma --cli $B/flashtile \
  --cli-repeats 10 --cli-warmup 2 --write-each-row --tag _bwd_s12 --out $L > $L/peers.log 2>&1
note "peers rc=$?"
SUB='BackendsAndDtypes/CudaBackwardGrid.VarlenMatchesOracle/cuda_sm90_bfloat16:CudaSm90Backward.*'
for tool in memcheck racecheck; do
  FLASHTILE_SMALL_GRID=1 timeout 60 compute-sanitizer --tool $tool --error-exitcode 1 $T --gtest_filter="$SUB" > $L/$tool.log 2>&1
  note "$tool rc=$? $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log | tr '\n' ' ')"
done
tar czf $OUT/s12c2.tgz -C $OUT s12c2
