#!/usr/bin/env bash
# NOT RUN YET (seventeenth session: no device). Step 4.13's timelines (~1 min): where a CTA's
# fixed cost goes, at the points issue 9 misses most (4k) and at 16k, and issue 8's window.
# Binary: the CLI of a build configured with -DFLASHTILE_SM90_TIMELINE=ON, carried as
# .devbin/s17tl/flashtile.xz:
#   cmake -S . -B build-tl -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
#     -DFLASHTILE_BUILD_BENCHMARKS=OFF -DFLASHTILE_BUILD_TESTS=OFF -DFLASHTILE_SM90_TIMELINE=ON
#   ninja -C build-tl flashtile_cli; strip -o /tmp/flashtile build-tl/tools/flashtile
#   mkdir -p .devbin/s17tl; xz -6 -c /tmp/flashtile > .devbin/s17tl/flashtile.xz
# carry: [".devbin/s17tl", ".device"]; run as `bash bench/results/h200_session17/call3.sh`.
set -u
source bench/results/h200_session17/setup.sh s17c3 s17tl
B=/tmp/s17tl
# name  pin  flags (the field grid: 16k tokens, hidden 2048)
run() {
  local name=$1 pin=$2; shift 2
  FLASHTILE_SM90_TIMELINE=$L/$name.bin FLASHTILE_SM90_PIPELINE=$pin timeout 30 $B/flashtile bench \
    --backends cuda_sm90 --dtype bf16 --repeats 3 --warmup 0 "$@" > $L/$name.log 2>&1
  note "$name rc=$? $(grep -E 'cuda_sm90' $L/$name.log | head -1)"
}
for d in 64 128 256; do
  h=$((2048 / d))
  for s in 4096 16384; do
    b=$((16384 / s))
    run d${d}_full_$s "" --batch $b --heads $h --seqlen $s --head-dim $d
    run d${d}_causal_$s "" --batch $b --heads $h --seqlen $s --head-dim $d --causal
    run d${d}_full_${s}_persistent tma_persistent --batch $b --heads $h --seqlen $s --head-dim $d
  done
done
run d128_window1024_16384 "" --batch 1 --heads 16 --seqlen 16384 --head-dim 128 --window 1024,0
run d128_window1024_16384_persistent tma_persistent --batch 1 --heads 16 --seqlen 16384 --head-dim 128 --window 1024,0
python3 bench/sm90_timeline.py $L/*.bin > $L/summary.txt 2>&1
note "summary rc=$?"
pack
