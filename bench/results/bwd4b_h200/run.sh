#!/usr/bin/env bash
# bwd4b's one device call (H200), modelled on ../bwd4_h200/run.sh. Run from the repo root of
# the device's copy (main's tree, "M") with carry [".wt/bwd4b", ".device"]:
#   bash .wt/bwd4b/bench/results/bwd4b_h200/run.sh
# .wt/bwd4b is feat/bwd4b ("N": 191bef8 applied + 6d20c58). Logs: $OUT/bwd4b.tgz, re-packed
# after every step so that a cut call still returns them.
#  0. build on the device: M's CLI in /tmp/build-M, N's CLI and backward suite in /tmp/build-N,
#     both at once (ninja -j16 each), sm_90a only;
#  1. A/B (GPU to itself): M then N, bf16, d 64/128, causal and not, 4k and 16k;
#  2. correctness of N: every backward test (small grid) as its own process, memcheck and
#     racecheck on gpu-check.sh's backward subset, all at once;
#  3. A/B again at 4k, N then M; 4. N beside FA2 (peers.py, flash only), d=128 first, with
#     what is left of the script's own limit (LIMIT s).
set -u
R=$PWD; W=$R/.wt/bwd4b; MT=$R/.wt/bwd4b-M; DEPS=$R/.device/deps
L=$OUT/bwd4b; mkdir -p $L
LIMIT=${LIMIT:-270}
export LD_LIBRARY_PATH=$DEPS/lib/x86_64-linux-gnu
export PYTHONUNBUFFERED=1
t0=$SECONDS
pack() { tar czf $OUT/bwd4b.tgz -C $OUT bwd4b; }
log() { echo "== $* at $((SECONDS-t0)) s" | tee -a $L/steps.txt; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $L/gpu.txt 2>&1
{ nproc; nvcc --version | tail -2; cmake --version | head -1; ninja --version
  sha256sum $MT/src/cuda/03_mma/backward_kernel.cuh $MT/src/cuda/03_mma/backward_traits.cuh \
            $W/src/cuda/03_mma/backward_kernel.cuh $W/src/cuda/03_mma/backward_traits.cuh; } > $L/env.txt 2>&1
# 0.
cfg() {  # cfg SRC BUILD EXTRA...
  local s=$1 b=$2; shift 2
  cmake -S $s -B $b -G Ninja -DCMAKE_PREFIX_PATH=$DEPS -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DFLASHTILE_BUILD_BENCHMARKS=OFF "$@"
}
{ cfg $MT /tmp/build-M -DFLASHTILE_BUILD_TESTS=OFF && time ninja -C /tmp/build-M -j16 flashtile_cli; } > $L/build_M.log 2>&1 &
{ cfg $W /tmp/build-N && time ninja -C /tmp/build-N -j16 flashtile_cli flashtile_cuda_mma_backward_tests; } > $L/build_N.log 2>&1 &
wait
FM=/tmp/build-M/tools/flashtile; FN=/tmp/build-N/tools/flashtile; TN=/tmp/build-N/tests/flashtile_cuda_mma_backward_tests
log "built: M $([ -x $FM ] && echo ok || echo MISSING), N $([ -x $FN ] && echo ok || echo MISSING), tests $([ -x $TN ] && echo ok || echo MISSING)"
pack
ab() {  # ab TAG BINARY SEQLENS LIMIT
  timeout $4 $2 bench --sweep --pass bwd --backends cuda_mma --dtype bf16 --sweep-head-dims 64,128 \
    --sweep-seqlens $3 --sweep-causal 0,1 --repeats 10 --warmup 2 --output $L/ab_$1.json > $L/ab_$1.log 2>&1
  log "A/B $1 rc=$?"
}
# 1.
ab M1 $FM 4096,16384 40
ab N1 $FN 4096,16384 40
pack
# 2.
export FLASHTILE_SMALL_GRID=1
tests=$($TN --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}')
for t in $tests; do n=$(echo $t | tr '/.' '__'); timeout 80 $TN --gtest_filter="$t" > $L/test_$n.log 2>&1 & done
sub="Dtypes/CudaMmaBackwardGrid.VarlenMatchesOracle/bfloat16:CudaMmaBackward.EveryHeadDim*:CudaMmaBackward.Refuses*"
for tool in memcheck racecheck; do timeout 80 compute-sanitizer --tool $tool --error-exitcode 1 $TN --gtest_filter="$sub" > $L/$tool.log 2>&1 & done
wait
unset FLASHTILE_SMALL_GRID
{ for f in $L/test_*.log $L/memcheck.log $L/racecheck.log; do echo "$(basename $f): $(grep -hE '^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY' $f | tr '\n' ' ')"; done; } > $L/tests_summary.txt
grep -h "err/bound\|worst" $L/test_*.log | head -40 > $L/tests_worst.txt 2>/dev/null
log "tests done ($(grep -c 'PASSED' $L/tests_summary.txt) lines with PASSED of $(wc -l < $L/tests_summary.txt))"; pack
# 3.
ab N2 $FN 4096 20
ab M2 $FM 4096 20
python3 $W/bench/results/bwd4b_h200/ab_table.py $L > $L/ab_table.md 2>&1
pack
# 4.
left=$((LIMIT - (SECONDS - t0)))
if [ $left -gt 25 ]; then
  timeout $left python3 $W/bench/peers.py --pass bwd --dtype bf16 --head-dims 128,64 --seqlens 4096,16384 \
    --peers flash --backends cuda_mma --cli $FN --cli-repeats 10 --cli-warmup 2 \
    --write-each-row --out $L --tag _bwd4b > $L/peers_log.txt 2>&1
  log "peers rc=$?"
else
  log "peers skipped ($left s left)"
fi
pack
