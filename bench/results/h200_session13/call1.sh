#!/usr/bin/env bash
# Thirteenth session, call 1 (H200): where cuda_sm90's backward spends its step. ncu
# (--set full, SASS-level source counters) of the main kernel at d=128 and d=64, full,
# bf16, 16k; and the 131072-token backward on cuda_sm90 (issue 10's memory line).
set -u
L=$OUT/s13c1; mkdir -p $L/ncu
export LD_LIBRARY_PATH=$PWD/.devbin/lib
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
pack() { tar czf $OUT/s13c1.tgz --exclude='*.ncu-rep' -C $OUT s13c1; }
B=/tmp/s13bin1; mkdir -p $B
for f in .devbin/base/*.xz; do xz -dc $f > $B/$(basename $f .xz) & done; wait; chmod +x $B/*
note "start $(nvidia-smi -L | head -1) $(ncu --version | tail -1)"
timeout 90 $B/flashtile bench --pass bwd --dtype bf16 --seqlen 131072 --heads 16 --head-dim 128 \
  --causal --backends cuda_sm90 --repeats 3 --warmup 1 > $L/bwd_131072.log 2>&1
note "131072 rc=$? $(grep -E 'cuda_sm90|workspace|memory' $L/bwd_131072.log | tr '\n' ' ')"
pack
prof() {  # prof NAME ARGS...
  local n=$1; shift; local s=$SECONDS
  timeout 150 ncu --clock-control none --set full --import-source yes -k regex:sm90_backward_kernel \
    -c 1 -f -o $L/ncu/$n $B/flashtile bench --pass bwd --backends cuda_sm90 --dtype bf16 \
    --warmup 0 --repeats 1 "$@" > $L/ncu/$n.run.log 2>&1
  note "ncu $n rc=$? ($((SECONDS-s)) s)"
  ncu -i $L/ncu/$n.ncu-rep --page details --print-details all > $L/ncu/$n.details.txt 2>&1
  ncu -i $L/ncu/$n.ncu-rep --page raw --csv > $L/ncu/$n.raw.csv 2>&1
  ncu -i $L/ncu/$n.ncu-rep --page source --csv --print-source sass > $L/ncu/$n.sass.csv 2>&1
  note "$n: $(grep -m1 -E 'Duration' $L/ncu/$n.details.txt)"
  pack
}
prof d128_full --batch 1 --heads 16 --seqlen 16384 --head-dim 128
prof d64_full --batch 1 --heads 32 --seqlen 16384 --head-dim 64
note done
pack
