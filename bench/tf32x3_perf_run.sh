#!/usr/bin/env bash
# cuda_tf32x3's speed, one H200 call (issue 11, second session): the write-up's case on this
# tree and on the previous kernel (base: commit f934e2d) alternately, their outputs compared
# bit for bit, the per-launch breakdown, the suite whole beside compute-sanitizer memcheck and
# racecheck (gpu-check.sh's tf32x3_subset), then the fp32 field grid beside PyTorch SDPA.
# Binaries built on the dev machine for sm_90a come in .devbin/bins.tar.xz (new/ and base/).
# Usage (worktree root on the device, .device carried beside the checkout):
#   OUT=dir bench/tf32x3_perf_run.sh
# Each step has a time limit; logs go to /tmp/tf32x3-perf/logs, packed into $OUT/logs.tgz
# after every step (the device tool returns at most 8 files), a summary to stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-tf32x3-perf-out}
mkdir -p "$out"
work=/tmp/tf32x3-perf
logs=$work/logs
mkdir -p "$logs"
deps=$(cd ../.. && pwd)/.device/deps
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bin=/tmp/tf32x3-bin
mkdir -p $bin && tar xJf .devbin/bins.tar.xz -C $bin
NEW=$bin/new/flashtile BASE=$bin/base/flashtile
t0=$SECONDS
stamp() { echo "--- $1 at $((SECONDS - t0)) s"; }
pack() { tar czf "$out/logs.tgz" -C "$work" logs; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$logs/gpu.txt"

stamp writeup
writeup="--dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64"
for round in 1 2; do
  extra=""; [ $round = 1 ] && extra=",cuda_tiled,cpu_standard"
  timeout 30 $NEW bench $writeup --backends cuda_tf32x3$extra --repeats 100 > "$logs/writeup_new_$round.txt" 2>&1
  timeout 30 $BASE bench $writeup --backends cuda_tf32x3 --repeats 100 > "$logs/writeup_base_$round.txt" 2>&1
done
FLASHTILE_TF32X3_MODE=single timeout 30 $NEW bench $writeup --backends cuda_tf32x3 --repeats 100 \
  > "$logs/writeup_new_single.txt" 2>&1
grep -h "^cuda_\|^cpu_" "$logs"/writeup_*.txt | sed 's/^/  /'
pack

stamp bitwise
# The same inputs through both kernels: the new split, loads and launch must not move a bit.
timeout 40 python3 - "$NEW" "$BASE" "$logs" > "$logs/bitwise.txt" 2>&1 <<'EOF'
import os, subprocess, sys, tempfile
import numpy as np
new, base, logs = sys.argv[1:]
rng = np.random.default_rng(11)
cases = [("writeup", (1, 1024, 1, 64), []), ("d128_causal", (2, 700, 4, 128), ["--causal"]),
         ("d64_window_softcap", (2, 513, 4, 64), ["--window", "100,0", "--softcap", "20"])]
with tempfile.TemporaryDirectory() as tmp:
    for name, shape, flags in cases:
        paths = {}
        for t in "qkv":
            paths[t] = os.path.join(tmp, f"{name}_{t}.npy")
            np.save(paths[t], rng.uniform(-1, 1, shape).astype(np.float32))
        outs = {}
        for tag, cli in (("new", new), ("base", base)):
            o = os.path.join(tmp, f"{name}_{tag}.npy")
            subprocess.run([cli, "run", "--q", paths["q"], "--k", paths["k"], "--v", paths["v"],
                            "--out", o, "--backend", "cuda_tf32x3"] + flags, check=True)
            outs[tag] = np.load(o)
        same = np.array_equal(outs["new"].view(np.uint32), outs["base"].view(np.uint32))
        print(f"{name}: new and base outputs bitwise equal: {same} "
              f"(max |diff| {np.max(np.abs(outs['new'] - outs['base'])):.3g})")
EOF
cat "$logs/bitwise.txt" | sed 's/^/  /'

stamp breakdown
timeout 30 $bin/new/flashtile_tf32x3_breakdown --repeats 200 --csv "$logs/breakdown.csv" > "$logs/breakdown.txt" 2>&1
sed 's/^/  /' "$logs/breakdown.txt"
pack

stamp "tests + sanitizers"
T=$bin/new/flashtile_cuda_tf32x3_tests
pids=""
for i in 0 1 2 3 4 5 6 7; do
  OMP_NUM_THREADS=2 GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout ${TEST_LIMIT:-55} $T \
    > "$logs/tests_shard$i.log" 2>&1 &
  pids+=" $!"
done
subset="CudaTf32x3.EveryHeadDim*:CudaTf32x3.Misaligned*:CudaTf32x3.SplitKv*:CudaTf32x3.Refusals*"
for tool in memcheck racecheck; do
  FLASHTILE_SMALL_GRID=1 OMP_NUM_THREADS=2 timeout ${SAN_LIMIT:-55} compute-sanitizer --tool $tool \
    --error-exitcode 1 $T --gtest_filter="$subset" > "$logs/$tool.log" 2>&1 &
  pids+=" $!"
done
for p in $pids; do wait $p; echo "  pid $p rc=$?"; done
grep -h -E "^\[  FAILED|^\[  PASSED|^\[errors\]|Failure$|ERROR SUMMARY|^\[       OK \]" "$logs"/tests_shard*.log \
  "$logs"/memcheck.log "$logs"/racecheck.log | sed 's/^/  /'
pack

stamp peers
PYTHONUNBUFFERED=1 timeout ${PEERS_LIMIT:-60} python3 bench/peers.py --cli $NEW --dtype f32 \
  --head-dims 64,128 --seqlens 1024,4096,16384 --peers efficient,math \
  --backends cuda_tf32x3,cuda_tiled --cli-repeats 5 --cli-warmup 1 --out "$logs" --tag _fp32 \
  > "$logs/peers_fp32.txt" 2>&1
echo "  peers rc=$?"
tail -n 20 "$logs/peers_fp32.txt" | sed 's/^/  /'
pack
stamp done
