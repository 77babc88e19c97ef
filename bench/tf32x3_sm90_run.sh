#!/usr/bin/env bash
# cuda_tf32x3's wgmma path (step 2c) on the H200, in one device call. Two modes:
#  (default) the whole step 2c run: structured `flashtile run` cases that show a layout
#    error by its pattern (bench/tf32x3_sm90_probe.py), the wgmma tests and the existing
#    cuda_tf32x3 suite (sharded over the host's cores), compute-sanitizer memcheck and
#    racecheck on a small subset, the field grid beside SDPA's memory-efficient kernel
#    (bench/peers.py) and the mma.sync kernel on the same grid (FLASHTILE_TF32X3_PATH=mma).
#  d128: step 2c.4's A/B in under a minute: the wgmma tests (both d=128 schedules)
#    and two default-path cuda_tf32x3 suites, sharded; racecheck on the schedules' bitwise
#    test (small grid); the d=128 field grid beside SDPA-efficient with "together" pinned,
#    then the CLI's sweep of the same grid with FLASHTILE_TF32X3_SM90_SCHEDULE=pingpong.
# Binaries: from a build tree (BIN_DIR=build-gpu: tools/flashtile, tests/...) or a gzip tar
# built elsewhere for sm_90a (BIN_TAR: flashtile, flashtile_cuda_tf32x3_sm90_tests,
# flashtile_cuda_tf32x3_tests, flat). The logs come back as $OUT/logs.tgz.
# Usage (repo or worktree root, .device carried):
#   BIN_DIR=build-gpu OUT=dir bench/tf32x3_sm90_run.sh d128
#   BIN_TAR=.devbin/bins.tgz OUT=dir bench/tf32x3_sm90_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-tf32x3-sm90-logs}
work=$(mktemp -d)  # the logs, outside $OUT (the device tool returns at most 8 files)
logs=$work/logs
mkdir -p "$logs" "$out"
default_deps=.device/deps
[ -d "$default_deps" ] || default_deps=../../.device/deps  # (from a worktree inside main)
deps=$(cd "${DEPS:-$default_deps}" && pwd)
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [ -n "${BIN_DIR:-}" ]; then
  F=$BIN_DIR/tools/flashtile
  T_SM90=$BIN_DIR/tests/flashtile_cuda_tf32x3_sm90_tests
  T_TF32=$BIN_DIR/tests/flashtile_cuda_tf32x3_tests
else
  bin=/tmp/tf32x3-sm90-bin
  mkdir -p "$bin" && tar xzf "${BIN_TAR:-.devbin/bins.tgz}" -C "$bin"
  F=$bin/flashtile T_SM90=$bin/flashtile_cuda_tf32x3_sm90_tests T_TF32=$bin/flashtile_cuda_tf32x3_tests
fi
pack() { tar czf "$out/logs.tgz" -C "$work" logs; }
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0)) s] $*"; }
CS=compute-sanitizer
command -v $CS > /dev/null || CS=/usr/local/cuda/bin/compute-sanitizer

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$logs/gpu.txt"

if [ "${1:-}" = d128 ]; then
  # Tests (their time is the host oracle: shards on the host's cores) beside racecheck.
  stamp tests
  FLASHTILE_SMALL_GRID=1 timeout 40 $CS --tool racecheck --error-exitcode 1 "$T_SM90" \
    --gtest_filter='CudaTf32x3Sm90.D128SchedulesAgreeBitwise' > "$logs/racecheck.log" 2>&1 &
  race_pid=$!
  pids=""
  sm90_filter='CudaTf32x3Sm90.*:-CudaTf32x3Sm90.SelectorChoosesByCoverage:CudaTf32x3Sm90.LongSequenceOnOneHead'
  for i in 0 1 2 3 4 5 6 7; do
    GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 30 "$T_SM90" --gtest_filter="$sm90_filter" \
      > "$logs/sm90_tests_$i.log" 2>&1 &
    pids="$pids $!"
  done
  # The default path (pingpong at d=128 since the seventh session) through the backend's own suite.
  for t in VarlenMatchesOracle NonFiniteValuesFollowTheRule; do
    timeout 30 "$T_TF32" --gtest_filter="CudaTf32x3.$t" > "$logs/tf32x3_$t.log" 2>&1 &
    pids="$pids $!"
  done
  rc=0
  for pid in $pids; do wait "$pid" || rc=1; done
  stamp "tests rc=$rc"
  grep -h "^\[  PASSED\|^\[  FAILED\|^\[  SKIPPED\|^\[       OK\|worst\|median\|Failure" "$logs"/sm90_tests_*.log \
    "$logs"/tf32x3_*.log | sort | uniq -c | head -40
  wait $race_pid; echo "racecheck rc=$?"; tail -n 3 "$logs/racecheck.log"; pack
  # d=128 beside SDPA-efficient (together pinned), then ping-pong pinned.
  stamp peers
  FLASHTILE_TF32X3_SM90_SCHEDULE=together PYTHONUNBUFFERED=1 timeout 30 python3 bench/peers.py --cli "$F" --dtype f32 \
    --backends cuda_tf32x3 --peers efficient --head-dims 128 --seqlens 1024,4096,16384 \
    --cli-repeats 5 --cli-warmup 1 --out "$logs" --tag _tf32x3_d128_together > "$logs/peers.txt" 2>&1
  echo "peers rc=$?"; tail -n 10 "$logs/peers.txt"; pack
  stamp pingpong
  FLASHTILE_TF32X3_SM90_SCHEDULE=pingpong timeout 15 "$F" bench --sweep --dtype f32 --backends cuda_tf32x3 \
    --sweep-head-dims 128 --sweep-seqlens 1024,4096,16384 --sweep-causal 0,1 --repeats 5 --warmup 1 \
    --output "$logs/d128_pingpong.json" > "$logs/d128_pingpong.txt" 2>&1
  echo "pingpong rc=$?"; grep "TFLOP" "$logs/d128_pingpong.txt"
  stamp done; pack
  exit 0
fi

# 1. Structured cases through the CLI, both kernels (diagnosis if the tests fail).
stamp probe
FLASHTILE_TF32X3_SPLITS=1 timeout 25 python3 bench/tf32x3_sm90_probe.py "$F" "$logs/probe" \
  > "$logs/probe.txt" 2>&1
tail -n 12 "$logs/probe.txt"; pack

# 2. The tests (the wgmma suite and the whole cuda_tf32x3 suite, 6 shards each) and
# compute-sanitizer on a small subset of the wgmma path, side by side (the tests' time is
# the oracle on the host's cores).
stamp tests
FLASHTILE_SMALL_GRID=1 timeout 40 $CS --tool memcheck --error-exitcode 1 \
  "$T_SM90" \
  --gtest_filter='CudaTf32x3Sm90.RunsRepeatBitwise:CudaTf32x3Sm90.VarlenMatchesOracle' \
  > "$logs/memcheck.log" 2>&1 &
mem_pid=$!
FLASHTILE_SMALL_GRID=1 timeout 40 $CS --tool racecheck --error-exitcode 1 \
  "$T_SM90" --gtest_filter='CudaTf32x3Sm90.VarlenMatchesOracle' \
  > "$logs/racecheck.log" 2>&1 &
race_pid=$!
pids=""
for suite_bin in "$T_SM90" "$T_TF32"; do
  suite=$(basename "$suite_bin")
  for i in 0 1 2 3 4 5; do
    GTEST_TOTAL_SHARDS=6 GTEST_SHARD_INDEX=$i timeout 40 "$suite_bin" > "$logs/${suite}_$i.log" 2>&1 &
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
PYTHONUNBUFFERED=1 timeout 45 python3 bench/peers.py --cli "$F" --dtype f32 \
  --backends cuda_tf32x3 --peers efficient --head-dims 64,128 --seqlens 1024,4096,16384 \
  --cli-repeats 5 --cli-warmup 1 --out "$logs" --tag _tf32x3_sm90 > "$logs/peers.txt" 2>&1
echo "peers rc=$?"; tail -n 16 "$logs/peers.txt"; pack
stamp mma
FLASHTILE_TF32X3_PATH=mma timeout 25 "$F" bench --sweep --dtype f32 --backends cuda_tf32x3 \
  --sweep-head-dims 64,128 --sweep-seqlens 1024,4096,16384 --sweep-causal 0,1 --repeats 5 --warmup 1 \
  --output "$logs/mma_sync_grid.json" > "$logs/mma_sync_grid.txt" 2>&1
echo "mma rc=$?"; tail -n 14 "$logs/mma_sync_grid.txt"
stamp done; pack
