#!/usr/bin/env bash
# cuda_tf32x3's H200 run (issue 11): the write-up case with and without split-KV, the suite
# (sharded, the oracle on the host's cores), compute-sanitizer on a small subset, and
# optionally the fp32 field grid beside PyTorch SDPA. Binaries built elsewhere for sm_90a
# come in bins.tar.xz (BIN= a folder that already holds them skips the unpacking).
# Usage: OUT=dir bench/tf32x3_device_run.sh [checks|bench|tests|sanitize|grid|peers]...
# (checks = tests and sanitize side by side, waited for by process id: a `pgrep -f` on the
# binaries' names also matches the calling shell, whose command line names them.)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-tf32x3-logs}
mkdir -p "$out"
export LD_LIBRARY_PATH=${DEPS:-/work/main/.device/deps}/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bin=${BIN:-/tmp/tf32x3-bin}
if [ ! -x "$bin/flashtile" ]; then mkdir -p "$bin" && tar xJf bins.tar.xz -C "$bin"; fi
F=$bin/flashtile
writeup="--dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64"
for what in "$@"; do
  case $what in
    checks)
      "$0" tests > "$out/tests.txt" 2>&1 &
      tests_pid=$!
      "$0" sanitize > "$out/sanitize.txt" 2>&1
      wait $tests_pid
      cat "$out/tests.txt" "$out/sanitize.txt"
      ;;
    bench)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
      timeout 60 $F bench $writeup --backends cuda_tf32x3,cuda_tiled,cpu_standard,cpu_flash --repeats 50 \
        2>&1 | tee "$out/writeup.txt"
      for s in 1 2 4 8 16; do
        echo "splits=$s"
        FLASHTILE_TF32X3_SPLITS=$s timeout 30 $F bench $writeup --backends cuda_tf32x3 --repeats 100 2>&1
      done | tee "$out/writeup_splits.txt"
      FLASHTILE_TF32X3_MODE=single timeout 30 $F bench $writeup --backends cuda_tf32x3 --repeats 100 \
        2>&1 | tee "$out/writeup_single.txt"
      ;;
    tests)
      pids=""
      for i in 0 1 2 3 4 5; do
        GTEST_TOTAL_SHARDS=6 GTEST_SHARD_INDEX=$i timeout ${TEST_LIMIT:-200} $bin/flashtile_cuda_tf32x3_tests \
          > "$out/tests_shard$i.log" 2>&1 &
        pids+=" $!"
      done
      timeout ${TEST_LIMIT:-200} $bin/flashtile_cuda_tests --gtest_filter='CudaF32.*:CudaBackends.*:CudaThreads.*' \
        > "$out/cuda_tests.log" 2>&1; echo "cuda_tests rc=$?"
      for p in $pids; do wait $p; echo "shard rc=$?"; done
      grep -h -E "^\[  FAILED|^\[  PASSED|^\[errors\]|Failure|error" "$out"/tests_shard*.log "$out/cuda_tests.log" | head -60
      ;;
    sanitize)
      # racecheck is slow on the varlen batches (41 s): memcheck alone takes them.
      sub="CudaTf32x3.EveryHeadDim*:CudaTf32x3.Misaligned*:CudaTf32x3.Refusals*:CudaTf32x3.NonFinite*:CudaTf32x3.SplitKv*"
      for tool in memcheck racecheck; do
        filter=$sub; [ $tool = memcheck ] && filter="$sub:CudaTf32x3.VarlenMatchesOracle"
        FLASHTILE_SMALL_GRID=1 timeout ${SAN_LIMIT:-90} compute-sanitizer --tool $tool --error-exitcode 1 \
          $bin/flashtile_cuda_tf32x3_tests --gtest_filter="$filter" > "$out/$tool.log" 2>&1
        echo "$tool rc=$?"; tail -n 4 "$out/$tool.log"
      done
      ;;
    grid)
      timeout 200 $F bench --sweep --dtype f32 --backends cuda_tf32x3,cuda_tiled --sweep-head-dims 64,128 \
        --sweep-seqlens 1024,4096,16384 --sweep-causal 0,1 --output "$out/grid.json" 2>&1 | tee "$out/grid.txt"
      ;;
    peers)
      PYTHONUNBUFFERED=1 timeout 300 python3 bench/peers.py --cli $F --dtype f32 --head-dims 64,128 \
        --seqlens 1024,4096,16384 --peers efficient,math --backends cuda_tf32x3,cuda_tiled \
        --out "$out" --tag _fp32 2>&1 | tee "$out/peers_fp32.txt"
      ;;
  esac
done
