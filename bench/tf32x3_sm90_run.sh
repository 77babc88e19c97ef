#!/usr/bin/env bash
# cuda_tf32x3's wgmma path (step 2c) on the H200, in one device call: structured `flashtile
# run` cases that show a layout error by its pattern (bench/tf32x3_sm90_probe.py), the
# wgmma tests and the existing cuda_tf32x3 suite (sharded over the host's cores; the default
# path changed under it), compute-sanitizer memcheck and racecheck on a small subset, the
# field grid beside SDPA's memory-efficient kernel (bench/peers.py) and the mma.sync kernel
# on the same grid (FLASHTILE_TF32X3_PATH=mma). Binaries built elsewhere for sm_90a come in
# BIN_TAR (a gzip tar of flashtile, flashtile_cuda_tf32x3_sm90_tests,
# flashtile_cuda_tf32x3_tests); the logs come back as $OUT/logs.tgz.
# Usage (worktree root, .device carried): BIN_TAR=.devbin/bins.tgz OUT=dir bench/tf32x3_sm90_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-tf32x3-sm90-logs}
work=$(mktemp -d)  # the logs, outside $OUT (the device tool returns at most 8 files)
logs=$work/logs
mkdir -p "$logs" "$out"
deps=$(cd "${DEPS:-../../.device/deps}" && pwd)
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bin=/tmp/tf32x3-sm90-bin
mkdir -p "$bin" && tar xzf "${BIN_TAR:-.devbin/bins.tgz}" -C "$bin"
pack() { tar czf "$out/logs.tgz" -C "$work" logs; }
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0)) s] $*"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$logs/gpu.txt"

# 1. Structured cases through the CLI, both kernels (diagnosis if the tests fail).
stamp probe
FLASHTILE_TF32X3_SPLITS=1 timeout 25 python3 bench/tf32x3_sm90_probe.py "$bin/flashtile" "$logs/probe" \
  > "$logs/probe.txt" 2>&1
tail -n 12 "$logs/probe.txt"; pack

# 2. The tests (the wgmma suite and the whole cuda_tf32x3 suite, 6 shards each) and
# compute-sanitizer on a small subset of the wgmma path, side by side (the tests' time is
# the oracle on the host's cores).
stamp tests
CS=compute-sanitizer
command -v $CS > /dev/null || CS=/usr/local/cuda/bin/compute-sanitizer
FLASHTILE_SMALL_GRID=1 timeout 40 $CS --tool memcheck --error-exitcode 1 \
  "$bin/flashtile_cuda_tf32x3_sm90_tests" \
  --gtest_filter='CudaTf32x3Sm90.RunsRepeatBitwise:CudaTf32x3Sm90.VarlenMatchesOracle' \
  > "$logs/memcheck.log" 2>&1 &
mem_pid=$!
FLASHTILE_SMALL_GRID=1 timeout 40 $CS --tool racecheck --error-exitcode 1 \
  "$bin/flashtile_cuda_tf32x3_sm90_tests" --gtest_filter='CudaTf32x3Sm90.VarlenMatchesOracle' \
  > "$logs/racecheck.log" 2>&1 &
race_pid=$!
pids=""
for suite in flashtile_cuda_tf32x3_sm90_tests flashtile_cuda_tf32x3_tests; do
  for i in 0 1 2 3 4 5; do
    GTEST_TOTAL_SHARDS=6 GTEST_SHARD_INDEX=$i timeout 40 "$bin/$suite" > "$logs/${suite}_$i.log" 2>&1 &
    pids="$pids $!"
  done
done
rc=0
for pid in $pids; do wait "$pid" || rc=1; done
stamp "tests rc=$rc"
grep -h "PASSED\|FAILED\|worst\|median\|Failure" "$logs"/flashtile_cuda_tf32x3*_tests_*.log | sort | uniq -c | head -40
wait $mem_pid; echo "memcheck rc=$?"
wait $race_pid; echo "racecheck rc=$?"
tail -n 3 "$logs/memcheck.log" "$logs/racecheck.log"; pack

# 3. The field grid: the wgmma path beside SDPA efficient, then the mma.sync kernel.
stamp peers
PYTHONUNBUFFERED=1 timeout 45 python3 bench/peers.py --cli "$bin/flashtile" --dtype f32 \
  --backends cuda_tf32x3 --peers efficient --head-dims 64,128 --seqlens 1024,4096,16384 \
  --cli-repeats 5 --cli-warmup 1 --out "$logs" --tag _tf32x3_sm90 > "$logs/peers.txt" 2>&1
echo "peers rc=$?"; tail -n 16 "$logs/peers.txt"; pack
stamp mma
FLASHTILE_TF32X3_PATH=mma timeout 25 "$bin/flashtile" bench --sweep --dtype f32 --backends cuda_tf32x3 \
  --sweep-head-dims 64,128 --sweep-seqlens 1024,4096,16384 --sweep-causal 0,1 --repeats 5 --warmup 1 \
  --output "$logs/mma_sync_grid.json" > "$logs/mma_sync_grid.txt" 2>&1
echo "mma rc=$?"; tail -n 14 "$logs/mma_sync_grid.txt"
stamp done; pack
