#!/usr/bin/env bash
# NOT RUN: three tries found no machine (the device tool's "no device machine could be
# started"), and the budget then left too little to start one.
# Sixteenth session, call 4: main at 284d4c7 (d=128 full calls at 1k-2k on the persistent
# kernel), binaries built here for sm_90a. The default sweep at d=128/256 over 1k-16k (what
# the selection now takes), then the whole cuda_sm90 suite (small grid).
set -u
L=$OUT/s16c4; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
pack() { tar czf $OUT/s16c4.tgz -C $OUT s16c4; }
B=/tmp/s16d; mkdir -p $B
for f in flashtile flashtile_cuda_sm90_tests; do (xz -dc .devbin/d/$f.xz > $B/$f; chmod +x $B/$f) & done; wait
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader > $L/gpu.txt 2>&1
note "start; $(cat $L/gpu.txt)"
SW="--sweep --dtype bf16 --repeats 10 --warmup 2 --backends cuda_sm90 --sweep-seqlens 1024,2048,4096,8192,16384 --sweep-causal 0,1"
for r in 1 2; do
  timeout 60 $B/flashtile bench $SW --sweep-head-dims 128,256 > $L/default_$r.log 2>&1
  note "default $r rc=$? $(grep -E 'TFLOP/s' $L/default_$r.log | grep -v backend | awk '{printf "%s ", $1}')"
done
pack
FLASHTILE_SMALL_GRID=1 timeout 200 $B/flashtile_cuda_sm90_tests > $L/sm90_suite.log 2>&1
note "sm90 suite rc=$? $(grep -hE '^\[  (PASSED|FAILED) |FAILED  \]' $L/sm90_suite.log | tr '\n' ' ')"
pack
