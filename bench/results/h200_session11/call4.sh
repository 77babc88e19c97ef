#!/usr/bin/env bash
# Eleventh session, call 4 (H200, warm after call 3; same binaries):
#  1. bf16 peers refresh: PyTorch's FlashAttention-2 and cuDNN beside cuda_mma and cuda_sm90
#     (seqlen 4k and 16k, d 64/128/256, causal and not; bench/results/peers.csv's grid)
#  2. issue 8's lines: 16k d=128 bf16 causal and window (1024,0) on both backends
#  3. the cuda_sm90 tests that call 3's 320 s limit cut off (sm90_done_in_call3.txt lists
#     the ones that passed there)
set -u
L=$OUT/s11c4; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
B=/tmp/s11bin/new
if [ ! -x $B/flashtile ]; then mkdir -p $B; for f in .devbin/new/*.xz; do xz -dc $f > $B/$(basename $f .xz) & done; wait; chmod +x $B/*; fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $L/gpu.txt 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())" >> $L/gpu.txt 2>&1
note start
PYTHONUNBUFFERED=1 timeout 270 python3 bench/peers.py --cli $B/flashtile --backends cuda_mma,cuda_sm90 \
  --dtype bf16 --seqlens 4096,16384 --head-dims 64,128,256 --peers flash,cudnn --write-each-row \
  --out $L > $L/peers.log 2>&1
note peers
for variant in "" "--window 1024,0"; do
  timeout 60 $B/flashtile bench --dtype bf16 --seqlen 16384 --heads 16 --head-dim 128 --causal $variant \
    --backends cuda_mma,cuda_sm90 --repeats 10 >> $L/lines.log 2>&1
done
note lines
timeout 200 $B/flashtile_cuda_sm90_tests --gtest_filter="-$(cat bench/results/h200_session11/sm90_done_in_call3.txt)" > $L/cuda_sm90_rest.log 2>&1
echo "sm90 rest rc=$?" >> $L/steps.txt
note "sm90 rest: $(grep -hE '^\[  (PASSED|FAILED) ' $L/cuda_sm90_rest.log | tr '\n' ' ')"
tar czf $OUT/s11c4.tgz -C $OUT s11c4
