#!/usr/bin/env bash
# One device call for cuda_mma on the H200. The `run` tool sends /work/main; this worktree
# travels as the carried .wt/mma-perf, main's c0a5533 (the dense baseline) as .wt/mma-base,
# the deps as .device:
#   cd .wt/mma-perf && bash bench/results/mma_h200_run.sh [steps]
# steps (default all): bench cli tests sanitize peers. With build-prev/ in this tree (an
# export of the previous version: `git archive <commit> | tar x -C build-prev`) its harness
# runs too, so the variant lines have a before and after from the same call. CSVs and
# logs.tgz land in $OUT (the logs themselves stay outside it: the tool returns at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(cd ../..; pwd)
deps=$root/.device/deps
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=${OUT:-/tmp/mma-out}; logs=/tmp/mma-logs/logs; mkdir -p "$out" "$logs"
steps=${1:-bench cli tests sanitize peers}
t0=$SECONDS
note() { echo "[$((SECONDS - t0)) s] $*"; }
pack() { tar czf "$out/logs.tgz" -C /tmp/mma-logs logs; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv > "$logs/gpu.txt" 2>&1; cat "$logs/gpu.txt"
common=(-G Ninja -DCMAKE_PREFIX_PATH="$deps" -DCMAKE_CUDA_ARCHITECTURES=90a
        -DFLASHTILE_BUILD_MMA_VARIANTS=ON -DFLASHTILE_BUILD_BENCHMARKS=OFF)
bench_only=(-DFLASHTILE_BUILD_TESTS=OFF -DFLASHTILE_BUILD_TOOLS=OFF)
new_targets="flashtile_cuda_mma_tests flashtile_mma_variants"
case " $steps " in *" cli "*|*" peers "*) new_targets="$new_targets flashtile_cli";; esac
build() {  # build NAME SRC TARGETS EXTRA_CMAKE...
  local name=$1 src=$2 targets=$3; shift 3
  ( timeout ${BUILD_TIMEOUT:-240} cmake -S "$src" -B /tmp/b-$name "${common[@]}" "$@" \
      > "$logs/cfg-$name.log" 2>&1 &&
    timeout ${BUILD_TIMEOUT:-240} ninja -C /tmp/b-$name $targets > "$logs/build-$name.log" 2>&1
    echo $? > "$logs/build-$name.rc" ) &
}
# PREBUILT=DIR: DIR holds flashtile_cuda_mma_tests and flashtile_mma_variants built on the dev
# machine for sm_90a (saves the build's device time); used when they run here, else built.
if [ -n "${PREBUILT:-}" ] && "$PREBUILT/flashtile_cuda_mma_tests" --gtest_list_tests > /dev/null 2>&1; then
  mkdir -p /tmp/b-new/tests; echo 0 > "$logs/build-new.rc"
  cp "$PREBUILT/flashtile_mma_variants" /tmp/b-new/; cp "$PREBUILT/flashtile_cuda_mma_tests" /tmp/b-new/tests/
  note "using the binaries in $PREBUILT"
else
  build new . "$new_targets"
fi
# BASE=0: no c0a5533 build and no dense comparison (a call that re-measures the variants only).
[ "${BASE:-1}" = 1 ] && build base ../mma-base flashtile_mma_variants "${bench_only[@]}"
[ -d build-prev ] && build prev build-prev flashtile_mma_variants "${bench_only[@]}"
wait
note "built: new rc $(cat "$logs/build-new.rc" 2>/dev/null) base rc $(cat "$logs/build-base.rc" 2>/dev/null) prev rc $(cat "$logs/build-prev.rc" 2>/dev/null)"
tail -n 3 "$logs"/build-*.log; pack
N=/tmp/b-new/flashtile_mma_variants; B=/tmp/b-base/flashtile_mma_variants; F=/tmp/b-new/tools/flashtile
P=/tmp/b-prev/flashtile_mma_variants; T=/tmp/b-new/tests/flashtile_cuda_mma_tests
case " $steps " in *" bench "*)
  # Base and new alternate, twice: the dense grid's run-to-run spread shows beside the ratio.
  bt=${BENCH_TIMEOUT:-60}
  [ -x $B ] && timeout $bt $B --grid-only --csv "$out/base1.csv" > "$logs/bench-base1.log" 2>&1
  timeout $bt $N --csv "$out/new1.csv" > "$logs/bench-new1.log" 2>&1
  [ -x $P ] && timeout $bt $P --csv "$out/prev1.csv" > "$logs/bench-prev1.log" 2>&1
  if [ -x $B ]; then
    timeout $bt $B --grid-only --csv "$out/base2.csv" > "$logs/bench-base2.log" 2>&1
    timeout $bt $N --csv "$out/new2.csv" > "$logs/bench-new2.log" 2>&1
  fi
  note "bench done"; grep -v "^dense" "$logs/bench-new1.log"
  [ -x $P ] && { echo "## previous version"; grep -E "^variant|^varlen" "$logs/bench-prev1.log"; }
  python3 - "$out" <<'PY'
import csv, sys, statistics as st
d = sys.argv[1]
def load(n, group="dense"):
    try:
        return {(r["head_dim"], r["causal"], r["seqlen"], r["label"]): float(r["ms"])
                for r in csv.DictReader(open(f"{d}/{n}.csv")) if r["group"] == group}
    except FileNotFoundError:
        return {}
b1, b2, n1, n2 = (load(x) for x in ("base1", "base2", "new1", "new2"))
worst = 9
print("d   causal seqlen   ms: base1 base2 new1 new2   base/new (means; > 1 = new faster)")
for key in b1:
    if key not in n1: continue
    b = [x[key] for x in (b1, b2) if key in x]; n = [x[key] for x in (n1, n2) if key in x]
    r = st.mean(b) / st.mean(n); worst = min(worst, r)
    print(f"{key[0]:>3} {key[1]:>6} {key[2]:>6} " + " ".join(f"{x:.4f}" for x in b + n) + f"   {r:.3f}")
print(f"worst new/base speed {worst:.3f}")
for tree in ("new1", "new2", "prev1"):
    v = load(tree, "variant")
    if not v: continue
    causal = v.get(("128", "1", "16384", "plain"))
    line = [f"{tree}: causal {causal:.4f} ms"]
    for label in ("window(1024,0)", "softcap 50", "alibi", "sinks"):
        x = v.get(("128", "1", "16384", label))
        if x: line.append(f"{label} {x:.4f} ms (" + (f"{causal / x:.2f}x faster" if "window" in label else f"{100 * (x / causal - 1):+.1f}%") + ")")
    print("; ".join(line))
PY
  pack;;
esac
case " $steps " in *" cli "*)
  # End to end through the CLI: every row checked on sampled query rows by the oracle.
  for args in "--causal" "--causal --window 1024,0" "--causal --softcap 50" "--causal --alibi" \
              "--causal --sinks" "--window 256,256 --softcap 30 --alibi --sinks"; do
    timeout 30 $F bench --seqlen 16384 --heads 16 --head-dim 128 --dtype bf16 --backends cuda_mma \
      --repeats 10 $args >> "$logs/cli.log" 2>&1
  done
  note "cli done"; grep -E "^cuda_mma|skipped|rror" "$logs/cli.log"; pack;;
esac
# The tests and the two sanitizers share the GPU (no timing): run side by side.
san_filter="Dtypes/CudaMmaGrid.VariantsMatchOracle/bfloat16:Dtypes/CudaMmaGrid.VarlenMatchesOracle/bfloat16:CudaMma.EveryHeadDim*:CudaMma.Misaligned*:CudaMma.Refuses*:CudaMma.WindowEdges*:Dtypes/CudaMmaGrid.MatchesOracle/float16"
case " $steps " in *" tests "*)
  ( timeout ${TEST_TIMEOUT:-150} $T > "$logs/mma_tests.log" 2>&1; echo $? > "$logs/mma_tests.rc" ) &;;
esac
case " $steps " in *" sanitize "*)
  for tool in memcheck racecheck; do
    ( FLASHTILE_SMALL_GRID=1 timeout ${SAN_TIMEOUT:-150} compute-sanitizer --tool $tool \
        --error-exitcode 1 $T --gtest_filter="$san_filter" > "$logs/$tool.log" 2>&1
      echo $? > "$logs/$tool.rc" ) &
  done;;
esac
wait
for x in mma_tests memcheck racecheck; do
  [ -f "$logs/$x.rc" ] || continue
  echo "$x rc $(cat "$logs/$x.rc")"
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |\[margin\]|tests ran|Failure|ERROR SUMMARY|RACECHECK SUMMARY" "$logs/$x.log" | head -30
done
note "tests and sanitizers done"; pack
case " $steps " in *" peers "*)
  # PyTorch's FlashAttention-2 and cuDNN beside cuda_mma (bf16 grid through the CLI sweep).
  PYTHONUNBUFFERED=1 timeout ${PEERS_TIMEOUT:-200} python3 bench/peers.py --cli $F \
    --out "$out/peers" --dtype bf16 --peers flash,cudnn > "$logs/peers.log" 2>&1
  echo "peers rc $?"; tail -45 "$logs/peers.log"; note "peers done"; pack;;
esac
note "all done"
