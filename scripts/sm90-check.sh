#!/usr/bin/env bash
# One device call for cuda_sm90 on the H200 (issue 9), in groups (SM90_GROUPS names which, in
# order; default all):
#   tests     the layout probes, a smoke run, the suite (TEST_FILTER; FLASHTILE_SMALL_GRID=1
#             when QUICK=1)
#   sanitize  compute-sanitizer memcheck and racecheck on a small subset
#   ncu       Nsight Compute on one d=128 16k causal bf16 call of 4.3 and 4.4 (and of the
#             baseline binary's 4.4 when BASE_BIN names one): tensor-pipe use, stall reasons
#   peers     bench/peers.py: the default pipeline and cuda_mma beside PyTorch's
#             FlashAttention-2 and cuDNN (bf16, d 64/128/256, seqlen 4k/16k, causal and not)
#   pipelines every pipeline named in PIPELINES pinned (FLASHTILE_SM90_PIPELINE), cuda_sm90
#             alone on the same grid; BASE_PIPELINES the same on BASE_BIN's flashtile
#   grid      GRID_DTYPES (bf16 f16) at GRID_SEQLENS (512-2k) beside cuda_mma, on the pipelines
#             in GRID_PIPELINES (default: the default one), for the selection rule
# Uses binaries built elsewhere for sm_90a when BIN names them (or BIN_TGZ, a tarball of
# them) and they run here, else builds the two targets it needs. Logs go to ./sm90-check-logs;
# under the device tool they also come back as $OUT/sm90-check-logs.tgz, refreshed after
# every step.
# Usage (repo root, .device/ carried): [SM90_GROUPS=...] scripts/sm90-check.sh [BIN_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
logs=sm90-check-logs
mkdir -p "$logs"
deps=${DEPS:-$PWD/.device/deps}
[ -d "$deps" ] || deps=$PWD/../../.device/deps  # run from a worktree under .wt/
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bin=${1:-${BIN:-}}
if [ -n "${BIN_TGZ:-}" ]; then mkdir -p /tmp/sm90bin && tar xzf "$BIN_TGZ" -C /tmp/sm90bin; fi
step() {  # step NAME SECONDS COMMAND...: run under a time limit, log, print the tail
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  echo "    rc=$rc ($((SECONDS - t0)) s)"; tail -n "${TAIL:-4}" "$logs/$name.log" | sed 's/^/    /'
  [ -n "${OUT:-}" ] && tar czf "$OUT/sm90-check-logs.tgz" "$logs"
  return $rc
}
want() { case " ${SM90_GROUPS:-tests sanitize ncu peers pipelines grid} " in *" $1 "*) return 0;; esac; return 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [ -z "$bin" ] || ! "$bin/flashtile_cuda_sm90_tests" --gtest_list_tests >/dev/null 2>&1 ||
   ! "$bin/flashtile" info >/dev/null 2>&1; then
  echo "carried binaries do not run here: building"
  build=/tmp/build-sm90
  step configure 120 cmake -S . -B $build -G Ninja -DCMAKE_PREFIX_PATH="$deps" \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHTILE_BUILD_BENCHMARKS=OFF || exit 1
  step build 300 ninja -C $build flashtile_cuda_sm90_tests flashtile_cli || exit 1
  mkdir -p $build/bin && cp $build/tests/flashtile_cuda_sm90_tests $build/bin/ &&
    cp $build/tools/flashtile $build/bin/
  bin=$build/bin
fi
tests=$bin/flashtile_cuda_sm90_tests
cli=$bin/flashtile
grid=(--sweep --sweep-seqlens 4096,16384 --sweep-head-dims ${HEAD_DIMS:-64,128,256} --sweep-causal 0,1 --dtype bf16)

if want tests; then
  TAIL=8 step pieces 30 "$tests" --gtest_filter='Sm90Pieces.*'
  # A smoke run of the default pipeline first: if it fails or hangs, the rest of the call
  # runs on the previous step, so the call still returns numbers.
  if ! FLASHTILE_SMALL_GRID=1 step smoke 30 "$tests" \
       --gtest_filter='Dtypes/CudaSm90Grid.MatchesOracle/bfloat16'; then
    echo "!!! the default pipeline failed its smoke run: pinning ${FALLBACK:=tma_ws}"
    export FLASHTILE_SM90_PIPELINE=$FALLBACK
  fi
  if [ "${QUICK:-0}" = 1 ]; then export FLASHTILE_SMALL_GRID=1; fi
  TAIL=24 step tests ${TEST_LIMIT:-120} "$tests" --gtest_filter="${TEST_FILTER:--Sm90Pieces.*}"
  unset FLASHTILE_SMALL_GRID
fi
if want sanitize; then
  FLASHTILE_SMALL_GRID=1 step memcheck ${SAN_LIMIT:-40} compute-sanitizer --tool memcheck \
    --error-exitcode 1 "$tests" \
    --gtest_filter='Sm90Pieces.*:Dtypes/CudaSm90Grid.EveryPipelineMatchesOracle/bfloat16:CudaSm90.ScaleOfAnySign:CudaSm90.Refuses*'
  FLASHTILE_SMALL_GRID=1 step racecheck ${SAN_LIMIT:-40} compute-sanitizer --tool racecheck \
    --error-exitcode 1 "$tests" --gtest_filter='Sm90Pieces.*:CudaSm90.ScaleOfAnySign'
fi
if want ncu; then
  # One call's first cuda_sm90 kernel (bench checks it against the oracle before timing).
  one_call=(bench --batch 1 --heads 16 --seqlen 16384 --head-dim 128 --causal --dtype bf16
            --backends cuda_sm90 --warmup 0 --repeats 1)
  profile=(ncu --clock-control none -k regex:sm90 -c 1
           --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats
           --section SchedulerStats
           --metrics sm__pipe_tensor_op_hgmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active)
  for pipeline in ${NCU_PIPELINES:-tma_ws tma_ws_overlap}; do
    FLASHTILE_SM90_PIPELINE=$pipeline TAIL=2 step ncu_$pipeline ${NCU_LIMIT:-30} \
      "${profile[@]}" "$cli" "${one_call[@]}"
  done
  if [ -n "${BASE_BIN:-}" ]; then
    FLASHTILE_SM90_PIPELINE=tma_ws_overlap TAIL=2 step ncu_base_tma_ws_overlap ${NCU_LIMIT:-30} \
      "${profile[@]}" "$BASE_BIN/flashtile" "${one_call[@]}"
  fi
fi
if want peers; then
  TAIL=20 PYTHONUNBUFFERED=1 step peers ${PEERS_LIMIT:-120} python3 bench/peers.py --cli "$cli" \
    --backends cuda_sm90,cuda_mma --dtype bf16 --peers flash,cudnn \
    --head-dims ${HEAD_DIMS:-64,128,256} --seqlens 4096,16384 --out "$logs/peers"
fi
if want pipelines; then
  for pipeline in ${PIPELINES:-tma_ws_overlap tma_ping_pong}; do
    FLASHTILE_SM90_PIPELINE=$pipeline TAIL=14 step bench_$pipeline ${BENCH_LIMIT:-40} \
      "$cli" bench "${grid[@]}" --backends cuda_sm90 --output "$logs/sm90_bench_$pipeline.csv"
  done
  if [ -n "${BASE_BIN:-}" ]; then
    for pipeline in ${BASE_PIPELINES:-tma_ws}; do
      FLASHTILE_SM90_PIPELINE=$pipeline TAIL=10 step base_bench_$pipeline ${BENCH_LIMIT:-40} \
        "$BASE_BIN/flashtile" bench "${grid[@]/64,128,256/64,128}" --backends cuda_sm90 \
        --output "$logs/sm90_base_bench_$pipeline.csv"
    done
  fi
fi
if want grid; then
  for pipeline in ${GRID_PIPELINES:-default}; do
    for dtype in ${GRID_DTYPES:-bf16 f16}; do
      if [ "$pipeline" = default ]; then unset FLASHTILE_SM90_PIPELINE; else export FLASHTILE_SM90_PIPELINE=$pipeline; fi
      TAIL=40 step grid_${pipeline}_$dtype ${BENCH_LIMIT:-40} "$cli" bench --sweep \
        --sweep-seqlens ${GRID_SEQLENS:-512,1024,2048} --sweep-head-dims ${HEAD_DIMS:-64,128,256} --sweep-causal 0,1 \
        --backends cuda_sm90,cuda_mma --dtype $dtype --output "$logs/sm90_grid_${pipeline}_$dtype.csv"
    done
  done
  unset FLASHTILE_SM90_PIPELINE
fi
echo "sm90-check: done"
