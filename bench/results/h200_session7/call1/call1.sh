#!/usr/bin/env bash
# Session 7, call 1: main at f3b4542, binaries built here for sm_90a and carried xz-compressed.
# (1) cuda_sm90's EveryPipelineMatchesOracle/float16 on the full grid, alone (cut last session);
# (2) ncu profiles of main's kernels for this session's engineers (sequential, nothing else on the GPU);
set -u
L=$OUT/c1; mkdir -p $L/ncu bin7
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
for f in .devbin/b7/*.xz; do b=bin7/$(basename $f .xz); xz -dc $f > $b; chmod +x $b; done
F=bin7/flashtile
pack() { tar czf $OUT/c1.tgz --exclude='*.ncu-rep' -C $OUT c1; }
prof() { local n=$1 k=$2; shift 2; local s=$SECONDS
  timeout 60 ncu --clock-control none --set full --import-source yes -k regex:$k -c 1 -f -o $L/ncu/$n $F bench --warmup 0 --repeats 1 --backends "$@" > $L/ncu/$n.run.log 2>&1
  ncu -i $L/ncu/$n.ncu-rep --page details --print-details all > $L/ncu/$n.details.txt 2>&1
  ncu -i $L/ncu/$n.ncu-rep --page source --csv --print-source sass > $L/ncu/$n.sass.csv 2>&1
  echo "== ncu $n ($((SECONDS-s)) s): $(grep -m1 -E 'Duration' $L/ncu/$n.details.txt)"; }
s=$SECONDS; timeout 150 bin7/flashtile_cuda_sm90_tests --gtest_filter='Dtypes/CudaSm90Grid.EveryPipelineMatchesOracle/float16' > $L/sm90_fp16_grid.log 2>&1
echo "== sm90 fp16 grid rc=$? ($((SECONDS-s)) s): $(grep -E 'PASSED|FAILED|OK \]' $L/sm90_fp16_grid.log | tail -3 | tr '\n' ' ')" | tee $L/test_summary.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee $L/smi.txt
{
prof sm90_d128_full_4k sm90_ws cuda_sm90 --dtype bf16 --batch 4 --heads 16 --seqlen 4096 --head-dim 128
prof sm90_d128_full_16k sm90_ws cuda_sm90 --dtype bf16 --batch 1 --heads 16 --seqlen 16384 --head-dim 128
prof sm90_d64_causal_4k sm90_ws cuda_sm90 --dtype bf16 --batch 4 --heads 32 --seqlen 4096 --head-dim 64 --causal
prof bwd_d64_full_4k mma_backward_kernel cuda_mma --pass bwd --dtype bf16 --batch 4 --heads 32 --seqlen 4096 --head-dim 64
prof bwd_d64_causal_4k mma_backward_kernel cuda_mma --pass bwd --dtype bf16 --batch 4 --heads 32 --seqlen 4096 --head-dim 64 --causal
prof bwd_d128_full_4k mma_backward_kernel cuda_mma --pass bwd --dtype bf16 --batch 4 --heads 16 --seqlen 4096 --head-dim 128
prof bwd_d128_causal_4k mma_backward_kernel cuda_mma --pass bwd --dtype bf16 --batch 4 --heads 16 --seqlen 4096 --head-dim 128 --causal
prof tf32_d128_full_4k tf32x3_sm90 cuda_tf32x3 --dtype f32 --batch 4 --heads 16 --seqlen 4096 --head-dim 128
prof tf32_d128_causal_1k tf32x3_sm90 cuda_tf32x3 --dtype f32 --batch 16 --heads 16 --seqlen 1024 --head-dim 128 --causal
prof window_d128_16k mma_forward cuda_mma --dtype bf16 --batch 1 --heads 16 --seqlen 16384 --head-dim 128 --causal --window 1024,0
prof causal_d128_16k_mma mma_forward cuda_mma --dtype bf16 --batch 1 --heads 16 --seqlen 16384 --head-dim 128 --causal
} 2>&1 | tee $L/ncu_summary.txt
pack
echo "all done at $((SECONDS-t0)) s" | tee -a $L/ncu_summary.txt; pack
