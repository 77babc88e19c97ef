#!/bin/bash
# Step 4.8's one device call: main's sm_90a CLI (the lead's build of 8124956, carried gzipped),
# default pipelines against the persistent 4.6 kernel at 4k and 16k (4.6 was measured at 16k only).
set -u
cd .wt/sm90e
export LD_LIBRARY_PATH=/work/main/.device/deps/lib/x86_64-linux-gnu:$PWD/../../.device/deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p /tmp/ft && gunzip -c .devbin/flashtile.gz > /tmp/ft/flashtile && chmod +x /tmp/ft/flashtile
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt 2>&1
for pin in "" tma_persistent; do
  echo "== pipeline=${pin:-default}"
  FLASHTILE_SM90_PIPELINE=$pin timeout 45 /tmp/ft/flashtile bench --sweep --sweep-seqlens 4096,16384 \
    --sweep-head-dims 64,128,256 --sweep-causal 0,1 --dtype bf16 --backends cuda_sm90 --repeats 10 --warmup 2
  echo "rc=$?"
done > $OUT/ab.txt 2>&1
cat $OUT/ab.txt
