#!/usr/bin/env bash
# Ninth session, call 3: the write-up's fp32 case x10 (calls 1 and 2 read 17.4-23.0 us
# between runs), and the split count swept at B=1 H=1 (bf16, d 64/128, N 1024/4096, full),
# to see what the combine's partials cost against the CTAs a split adds. Binaries as call 2.
set -u
L=$OUT/s9c3; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib
t0=$SECONDS
B=/tmp/s9bin; mkdir -p $B
for f in .devbin/s9/flashtile.xz; do xz -dc $f > $B/$(basename $f .xz); done; chmod +x $B/*
F=$B/flashtile
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $L/gpu.txt 2>&1
for i in $(seq 10); do $F bench --dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64 \
  --backends cuda_tf32x3 --repeats 200 >> $L/writeup_tf32x3.log 2>&1; done
for d in 64 128; do for n in 1024 4096; do for s in 1 2 4 8 16 auto; do
  v=$s; [ $s = auto ] && v=
  FLASHTILE_MMA_SPLITS=$v FLASHTILE_SM90_SPLITS=$v $F bench --dtype bf16 --batch 1 --heads 1 \
    --seqlen $n --head-dim $d --backends cuda_mma,cuda_sm90 --repeats 50 --warmup 5 \
    --output $L/splits_${s}_d${d}_n$n.json >> $L/splits.log 2>&1
done; done; done
echo "done at $((SECONDS-t0)) s"
tar czf $OUT/s9c3.tgz -C $OUT s9c3
