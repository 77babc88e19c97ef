#!/usr/bin/env bash
# Tenth session, call 3 (H200): which cuda_sm90 pipeline windowed calls should take. Windows
# run step 4.3 (tma_ws) by default, chosen without a measurement (few key tiles a CTA, like
# short causal calls). Each pipeline pinned (FLASHTILE_SM90_PIPELINE), bf16, window (1024, 0)
# at 4k and 16k and (4096, 0) at 16k, d 64/128/256, beside the default causal 16k (issue 8's
# window line compares the two). Binary: this session's tree (dff3528), sm_90a.
set -u
L=$OUT/s10c3; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
B=/tmp/s10bin; mkdir -p $B
xz -dc .devbin/new/flashtile.xz > $B/flashtile; chmod +x $B/flashtile
F=$B/flashtile
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $L/gpu.txt 2>&1
sw() {  # sw TAG PIPELINE HEADDIMS SEQLENS FLAGS...
  local tag=$1 pipe=$2 hd=$3 sl=$4; shift 4
  FLASHTILE_SM90_PIPELINE=$pipe timeout 60 $F bench --sweep --sweep-seqlens $sl --sweep-head-dims $hd \
    --dtype bf16 --backends cuda_sm90 --repeats 10 --warmup 2 "$@" \
    --output $L/${tag}_${pipe:-default}.csv > $L/${tag}_${pipe:-default}.log 2>&1
}
sw causal "" 64,128,256 16384 --sweep-causal 1
for rep in 1 2; do
  for pipe in "" tma_ws_overlap tma_ping_pong tma_persistent; do
    sw w1024_r$rep "$pipe" 64,128,256 4096,16384 --sweep-causal 0 --window 1024,0
  done
  for pipe in tma_ws_m192 tma_ws_overlap_m192 tma_ping_pong_m192; do
    sw w1024_r$rep $pipe 64 4096,16384 --sweep-causal 0 --window 1024,0
  done
done
note "window 1024"
for pipe in "" tma_ws_overlap tma_ping_pong tma_persistent; do
  sw w4096 "$pipe" 64,128,256 16384 --sweep-causal 0 --window 4096,0
done
for pipe in tma_ws_overlap_m192 tma_ping_pong_m192; do
  sw w4096 $pipe 64 16384 --sweep-causal 0 --window 4096,0
done
note "window 4096"
tar czf $OUT/s10c3.tgz -C $OUT s10c3
