#!/usr/bin/env bash
# Eleventh session, call 5 (H200): issue 11's write-up case beside PyTorch SDPA's
# memory-efficient backend (fp32, TF32 matmul off) in one run, through bench/peers.py, and
# eight more runs of the CLI's line on this session's binary.
set -u
L=$OUT/s11c5; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib
B=/tmp/s11bin/new; mkdir -p $B
xz -dc .devbin/new/flashtile.xz > $B/flashtile; chmod +x $B/flashtile
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $L/gpu.txt 2>&1
PYTHONUNBUFFERED=1 timeout 200 python3 bench/peers.py --cli $B/flashtile --backends cuda_tf32x3 \
  --dtype f32 --head-dims 64 --seqlens 1024 --causal 0 --batch-heads 1,1 --peers efficient,math \
  --cli-repeats 200 --write-each-row --out $L > $L/peers_writeup.log 2>&1
for i in 1 2 3 4 5 6 7 8; do
  $B/flashtile bench --dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64 \
    --backends cuda_tf32x3 --repeats 200 >> $L/writeup_new.log 2>&1
done
echo "new (ms): $(awk '$1 == "cuda_tf32x3" {print $2}' $L/writeup_new.log | tr '\n' ' ')" > $L/writeup_summary.txt
cat $L/writeup_summary.txt; tail -8 $L/peers_writeup.log
tar czf $OUT/s11c5.tgz -C $OUT s11c5
