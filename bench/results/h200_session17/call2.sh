#!/usr/bin/env bash
# NOT RUN YET (seventeenth session: no device). The next session's second call, issue 9:
# the forward's cuda_sm90 figures under the CLI's new queued timing and the old --isolated
# one, then the peers (do_bench) beside the queued CLI (~4 min). Binaries as call1.sh says.
# carry: [".devbin/s17", ".device"]; run as `bash bench/results/h200_session17/call2.sh`.
set -u
source bench/results/h200_session17/setup.sh s17c2 s17
N=/tmp/s17

FW="--sweep --dtype bf16 --sweep-head-dims 64,128,256 --sweep-seqlens 4096,16384 --sweep-causal 0,1 --repeats 10 --warmup 2 --backends cuda_sm90"
timeout 60 $N/flashtile bench $FW > $L/fwd_queued.log 2>&1; note "fwd queued rc=$?"
timeout 60 $N/flashtile bench $FW --isolated > $L/fwd_isolated.log 2>&1; note "fwd isolated rc=$?"
timeout 120 python3 bench/peers.py --cli $N/flashtile --backends cuda_mma,cuda_sm90 --dtype bf16 \
  --head-dims 64,128,256 --seqlens 4096,16384 --peers flash,cudnn --write-each-row \
  --out $L/peers_fwd > $L/peers_fwd.log 2>&1
note "peers fwd rc=$?"
pack
