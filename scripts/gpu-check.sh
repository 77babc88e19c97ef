#!/usr/bin/env bash
# The GPU machine's run: build, every GPU suite, compute-sanitizer memcheck and racecheck,
# `flashtile check` (10,000 random cases per backend and dtype, variants included), the CLI's
# hardening reproducers, the default `flashtile bench`, the variants' performance lines,
# cpu_flash on the host's cores, and the Python tests. Each step has a time limit (LIMIT).
# Usage (from the repo root, with .device/ carried: see scripts/stage-device-deps.sh):
#   scripts/gpu-check.sh [LOG_DIR]        # LOG_DIR defaults to ./gpu-check-logs
# PHASE=tests runs the build, the C++ suites and the sanitizers; PHASE=rest the build (a
# no-op on a warm machine) and the groups REST names (check cli lines harness cpu python
# peers, default all), so that calls of under 10 minutes each cover it all; the default
# runs everything. In PHASE=tests, SUITES=0 skips the suites and SANITIZERS=0 the
# compute-sanitizer runs, so one call can take the suites and the next the sanitizers.
# Under the device tool ($OUT set) the logs also come back as $OUT/gpu-check-logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${1:-gpu-check-logs}
mkdir -p "$logs"
build=build-gpu
deps=$PWD/.device/deps
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
status=0
step() {  # step NAME COMMAND...: run (at most $LIMIT s), log to $logs/NAME.log, remember failures
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout "${LIMIT:-600}" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  echo "    rc=$rc ($((SECONDS - t0)) s); tail:"; tail -n "${TAIL:-6}" "$logs/$name.log" | sed 's/^/    /'
  [ $rc -eq 0 ] || status=1
  # Refresh the archive after every step, so a call cut short still returns its logs.
  [ -n "${OUT:-}" ] && tar czf "$OUT/gpu-check-logs.tgz" "$logs"
  return $rc
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$logs/gpu.txt" 2>&1
cat "$logs/gpu.txt"
# One build for everything: the C++ suites, the CLI, the cuda_mma harness and the Python
# package laid out in $build/python (FLASHTILE_BUILD_PYTHON), so the module is not compiled a
# second time by pip. On a warm machine (PHASE=rest after PHASE=tests) it is a no-op.
step configure cmake -S . -B $build -G Ninja -DCMAKE_PREFIX_PATH="$deps" \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" -DFLASHTILE_BUILD_PYTHON=ON \
  -DFLASHTILE_BUILD_MMA_VARIANTS=ON -DFLASHTILE_BUILD_BENCHMARKS=OFF \
  -DPython_EXECUTABLE="$(command -v python3)" ${CMAKE_EXTRA:-} || exit 1
step build ninja -C $build ${BUILD_TARGETS:-} || exit 1  # BUILD_TARGETS: only these (e.g. "flashtile _flashtile")
F=$build/tools/flashtile
phase=${PHASE:-all}
if [ "$phase" != rest ] && [ "${SUITES:-1}" != 0 ]; then
  step cuda_tests $build/tests/flashtile_cuda_tests
  step cuda_mma_tests $build/tests/flashtile_cuda_mma_tests
  step cuda_sm90_tests $build/tests/flashtile_cuda_sm90_tests
  step cuda_tf32x3_tests $build/tests/flashtile_cuda_tf32x3_tests
  step cuda_tf32x3_sm90_tests $build/tests/flashtile_cuda_tf32x3_sm90_tests
  # The backward's full grid (1023/1025 lengths) spends minutes in the host oracle: the small
  # grid unless BACKWARD_FULL_GRID is set.
  if [ -n "${BACKWARD_FULL_GRID:-}" ]; then
    step cuda_backward_tests $build/tests/flashtile_cuda_backward_tests
  else
    FLASHTILE_SMALL_GRID=1 step cuda_backward_tests $build/tests/flashtile_cuda_backward_tests
  fi
  # The CPU suites run in CI; here only when asked (the H200 host's 16 cores).
  [ -n "${CPU_TESTS:-}" ] && OMP_WAIT_POLICY=passive step cpu_tests $build/tests/flashtile_cpu_tests
fi
if [ "$phase" != rest ] && [ "${SANITIZERS:-1}" != 0 ]; then
  # Sanitizers on the small grids (FLASHTILE_SMALL_GRID drops the 1023/1025 lengths): every
  # variant, varlen, every head dim, the narrow (unaligned) path, the non-finite rule and
  # the refusals; racecheck on the kernels that share memory between warps.
  mma_subset="Dtypes/CudaMmaGrid.VariantsMatchOracle/bfloat16:Dtypes/CudaMmaGrid.VarlenMatchesOracle/bfloat16"
  mma_subset+=":CudaMma.EveryHeadDim*:CudaMma.Misaligned*:CudaMma.Refuses*:Dtypes/CudaMmaGrid.MatchesOracle/float16"
  mma_subset+=":CudaMma.WindowSchedule*"
  sm90_subset="Sm90Pieces.*:Dtypes/CudaSm90Grid.EveryPipelineMatchesOracle/bfloat16:CudaSm90.ScaleOfAnySign:CudaSm90.Refuses*"
  sm90_subset+=":Dtypes/CudaSm90Grid.BlocksThatSeeNoKeyWriteZerosOnEveryRun/float16:CudaSm90BlockM192.*"
  tf32x3_subset="CudaTf32x3.EveryHeadDim*:CudaTf32x3.Misaligned*:CudaTf32x3.SplitKv*:CudaTf32x3.Refusals*"
  tf32x3_sm90_subset="CudaTf32x3Sm90.VariantsMatchOracle:CudaTf32x3Sm90.VarlenMatchesOracle"
  backward_subset="BackendsAndDtypes/CudaBackwardGrid.VarlenMatchesOracle/cuda_mma_bfloat16:CudaMmaBackward.EveryHeadDim*:CudaMmaBackward.Refuses*"
  backward_subset+=":BackendsAndDtypes/CudaBackwardGrid.VarlenMatchesOracle/cuda_sm90_bfloat16"
  backward_subset+=":BackendsAndDtypes/CudaBackwardGrid.VariantsMatchOracle/cuda_sm90_float16:CudaSm90Backward.Refuses*"
  LIMIT=${SAN_LIMIT:-90}
  FLASHTILE_SMALL_GRID=1 step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 \
    $build/tests/flashtile_cuda_tests --gtest_filter="*MatchesOracle*:*Unsupported*:*NonFinite*"
  for tool in memcheck racecheck; do
    FLASHTILE_SMALL_GRID=1 step ${tool}_mma compute-sanitizer --tool $tool --error-exitcode 1 \
      $build/tests/flashtile_cuda_mma_tests --gtest_filter="$mma_subset"
    FLASHTILE_SMALL_GRID=1 step ${tool}_sm90 compute-sanitizer --tool $tool --error-exitcode 1 \
      $build/tests/flashtile_cuda_sm90_tests --gtest_filter="$sm90_subset"
    FLASHTILE_SMALL_GRID=1 step ${tool}_tf32x3 compute-sanitizer --tool $tool --error-exitcode 1 \
      $build/tests/flashtile_cuda_tf32x3_tests --gtest_filter="$tf32x3_subset"
    FLASHTILE_SMALL_GRID=1 step ${tool}_tf32x3_sm90 compute-sanitizer --tool $tool --error-exitcode 1 \
      $build/tests/flashtile_cuda_tf32x3_sm90_tests --gtest_filter="$tf32x3_sm90_subset"
    FLASHTILE_SMALL_GRID=1 step ${tool}_backward compute-sanitizer --tool $tool --error-exitcode 1 \
      $build/tests/flashtile_cuda_backward_tests --gtest_filter="$backward_subset"
    # cuda_sm90's opt-in persistent pipeline (4.6): several items per CTA on every head dim.
    FLASHTILE_SM90_PIPELINE=tma_persistent step ${tool}_sm90_persistent compute-sanitizer --tool $tool \
      --error-exitcode 1 $build/tests/flashtile_cuda_sm90_tests \
      --gtest_filter=CudaSm90Persistent.ThreeCtasRunEightItemsEach
  done
  unset LIMIT
fi
if [ "$phase" = tests ]; then
  echo "gpu-check (tests): $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
  exit $status
fi
# The rest, in groups (REST names which, in order; default all of them).
want() { case " ${REST:-check cli lines harness cpu python peers} " in *" $1 "*) return 0;; esac; return 1; }
if want check; then
  # cuda_sm90 serves a third of the draws (head dims 64, 128 and 256, 16-bit, dense or
  # varlen): its own run keeps the main one from drawing three times as many shapes.
  LIMIT=${CHECK_LIMIT:-300} step check $F check --shapes "${CHECK_SHAPES:-10000}" \
    --backends cpu_reference,cpu_standard,cpu_flash,cuda_naive,cuda_tiled,cuda_tf32x3,cuda_mma
  [ "${CHECK_SM90_SHAPES:-10000}" != 0 ] && LIMIT=${CHECK_LIMIT:-300} step check_sm90 $F check \
    --shapes "${CHECK_SM90_SHAPES:-10000}" --backends cuda_sm90
fi
if want cli; then
  step cli_hardening python3 tests/cli/test_hardening.py $F
  TAIL=12 step bench $F bench
fi
if want lines; then
  # The performance lines of issue 8 (16k, d=128, bf16): causal, window, softcap, ALiBi,
  # sinks, on cuda_mma and (where it serves them) cuda_sm90.
  for variant in "" "--window 1024,0" "--softcap 30" "--alibi" "--sinks"; do
    TAIL=4 step "bench_variant${variant//[^a-z0-9]/_}" $F bench --dtype bf16 \
      --seqlen 16384 --heads 16 --head-dim 128 --causal $variant \
      --backends cuda_mma,cuda_sm90 --repeats 10
  done
fi
if want harness; then
  # The cuda_mma harness: the dense grid, the variants, the varlen batch through the API
  # beside its kernel and a dense batch of the same work.
  # HARNESS_GROUPS (e.g. "varlen,window") times only those parts of it.
  TAIL=40 LIMIT=200 step mma_variants $build/flashtile_mma_variants --csv "$logs/mma_variants.csv" \
    ${HARNESS_GROUPS:+--groups "$HARNESS_GROUPS"}
fi
if want cpu; then
  # cpu_flash on the host's cores: the window line at one thread, the write-up's case
  # (CPU_FORWARD=0 skips these, about 2 minutes, for the backward lines alone).
  [ "${CPU_FORWARD:-1}" != 0 ] && for window in "" "--window 1024,0"; do
    TAIL=3 step "cpu_flash_16k${window//[^a-z0-9]/_}" $F bench --backends cpu_flash \
      --threads 1 --seqlen 16384 --heads 8 --head-dim 128 --causal $window --repeats 3 --warmup 1
  done
  [ "${CPU_FORWARD:-1}" != 0 ] && for threads in 6 16; do
    TAIL=3 step "cpu_flash_writeup_t$threads" $F bench --backends cpu_flash,cpu_standard \
      --threads $threads --seqlen 1024 --head-dim 64 --repeats 20
  done
  # cpu_flash's backward beside torch CPU SDPA's, at 1 thread and all cores (issue 10), and
  # one core's FMA peak on each SIMD target (bench/micro, when built: FLASHTILE_BUILD_BENCHMARKS).
  for d in 64 128; do
    LIMIT=${CPU_BWD_LIMIT:-150} TAIL=12 step cpu_backward_vs_torch_d$d python3 bench/cpu_vs_torch.py \
      --flashtile $F --pass bwd --threads "1,$(nproc)" --head-dim $d --warmup 1 --repeats 3 \
      --output "$logs/cpu_backward_vs_torch_d$d.json"
  done
  [ -x $build/bench/micro/flashtile_micro_bench ] && TAIL=8 step fma_peak \
    $build/bench/micro/flashtile_micro_bench --benchmark_filter=fma_peak
fi
if want python && [ -z "${SKIP_PYTHON:-}" ]; then
  # The package from the build above, against the image's torch/transformers/JAX.
  for f in ${PYTHON_TESTS:-tests/python/test_*.py}; do  # one process per file
    LIMIT=${PYTEST_LIMIT:-150} PYTHONPATH=$PWD/$build/python step "pytest_$(basename "$f" .py)" \
      python3 -m pytest "$f" -q -rs -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"}
  done
fi
if want peers; then
  # PyTorch's FlashAttention-2 and cuDNN beside cuda_mma and cuda_sm90, one run.
  TAIL=45 LIMIT=${PEERS_LIMIT:-300} PYTHONUNBUFFERED=1 step peers python3 bench/peers.py --cli $F \
    --backends cuda_mma,cuda_sm90 --dtype "${PEERS_DTYPES:-bf16}" --peers flash,cudnn \
    --out "$logs/peers" ${PEERS_ARGS:-}
fi
echo "gpu-check: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
