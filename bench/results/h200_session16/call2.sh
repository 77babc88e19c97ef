#!/usr/bin/env bash
# Sixteenth session, call 2: main at 5c6f67d (4.12 as kept: d=256 on 80-key tiles, O's
# rescale skipped at d >= 128), binaries built on the development machine for sm_90a.
#  1. beside PyTorch's FlashAttention-2 and cuDNN in one run (bf16, then fp16; 4k and 16k)
#  2. the whole cuda_sm90 suite (small grid), memcheck and racecheck on gpu-check's subset
#  3. the backward items the fifteenth session left unrun: cuda_sm90's fp16 variants and
#     the varlen tests, and memcheck on them
set -u
L=$OUT/s16c2; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
pack() { tar czf $OUT/s16c2.tgz -C $OUT s16c2; }
B=/tmp/s16c; mkdir -p $B
for f in flashtile flashtile_cuda_sm90_tests flashtile_cuda_backward_tests; do
  (xz -dc .devbin/c/$f.xz > $B/$f; chmod +x $B/$f) & done; wait
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $L/gpu.txt 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())" >> $L/gpu.txt 2>&1
note "unpacked; $(sed -n 2p $L/gpu.txt)"
for dt in bf16 f16; do
  PYTHONUNBUFFERED=1 timeout 110 python3 bench/peers.py --cli $B/flashtile --backends cuda_mma,cuda_sm90 \
    --dtype $dt --seqlens 4096,16384 --head-dims 64,128,256 --peers flash,cudnn --write-each-row \
    --out $L/peers_$dt > $L/peers_$dt.log 2>&1
  note "peers $dt rc=$?"
  pack
done
T=$B/flashtile_cuda_sm90_tests
FLASHTILE_SMALL_GRID=1 timeout 150 $T > $L/sm90_suite.log 2>&1
note "sm90 suite rc=$? $(grep -hE '^\[  (PASSED|FAILED) |FAILED  \]' $L/sm90_suite.log | tr '\n' ' ')"
pack
sub="Sm90Pieces.*:Dtypes/CudaSm90Grid.EveryPipelineMatchesOracle/bfloat16:CudaSm90.ScaleOfAnySign:CudaSm90.Refuses*"
sub+=":Dtypes/CudaSm90Grid.BlocksThatSeeNoKeyWriteZerosOnEveryRun/float16:CudaSm90BlockM192.*:Dtypes/CudaSm90Grid.VariantsMatchOracle/bfloat16"
for tool in memcheck racecheck; do
  FLASHTILE_SMALL_GRID=1 timeout 100 compute-sanitizer --tool $tool --error-exitcode 1 $T --gtest_filter="$sub" > $L/$tool.log 2>&1
  note "$tool rc=$? $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' $L/$tool.log | tr '\n' ' ')"
  pack
done
BT=$B/flashtile_cuda_backward_tests
bsub="BackendsAndDtypes/CudaBackwardGrid.VariantsMatchOracle/cuda_sm90_float16:BackendsAndDtypes/CudaBackwardGrid.VarlenMatchesOracle/*"
FLASHTILE_SMALL_GRID=1 timeout 100 $BT --gtest_filter="$bsub" > $L/bwd_tests.log 2>&1
note "backward fp16 variants + varlen rc=$? $(grep -hE '^\[  (PASSED|FAILED) |FAILED  \]' $L/bwd_tests.log | tr '\n' ' ')"
pack
FLASHTILE_SMALL_GRID=1 timeout 80 compute-sanitizer --tool memcheck --error-exitcode 1 $BT \
  --gtest_filter="BackendsAndDtypes/CudaBackwardGrid.VariantsMatchOracle/cuda_sm90_float16:BackendsAndDtypes/CudaBackwardGrid.VarlenMatchesOracle/cuda_sm90_bfloat16" > $L/bwd_memcheck.log 2>&1
note "backward memcheck rc=$? $(grep -hE 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' $L/bwd_memcheck.log | tr '\n' ' ')"
grep -h "Failure\|Expected\|which is" $L/*.log | head -20 >> $L/steps.txt
pack
