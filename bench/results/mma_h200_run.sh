#!/usr/bin/env bash
# One device call for cuda_mma on the H200 (the `run` tool sends /work/main; this worktree
# travels as the carried .wt/mma, main's c0a5533 as .wt/mma-base, the deps as .device):
#   cd .wt/mma && bash bench/results/mma_h200_run.sh [steps]
# steps (default all): bench cli tests memcheck racecheck peers. CSVs and logs.tgz land in
# $OUT (the logs themselves stay outside it: the tool returns at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(cd ../..; pwd)
deps=$root/.device/deps
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=${OUT:-/tmp/mma-out}; logs=/tmp/mma-logs/logs; mkdir -p "$out" "$logs"
steps=${1:-bench cli tests memcheck racecheck peers}
t0=$SECONDS
note() { echo "[$((SECONDS - t0)) s] $*"; }
pack() { tar czf "$out/logs.tgz" -C /tmp/mma-logs logs; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv > "$logs/gpu.txt" 2>&1; cat "$logs/gpu.txt"
common=(-G Ninja -DCMAKE_PREFIX_PATH="$deps" -DCMAKE_CUDA_ARCHITECTURES=90a
        -DFLASHTILE_BUILD_MMA_VARIANTS=ON -DFLASHTILE_BUILD_BENCHMARKS=OFF)
( cmake -S . -B /tmp/b-new "${common[@]}" > "$logs/cfg-new.log" 2>&1 &&
  ninja -C /tmp/b-new flashtile_cuda_mma_tests flashtile_cli flashtile_mma_variants \
    > "$logs/build-new.log" 2>&1; echo $? > "$logs/build-new.rc" ) &
( cmake -S ../mma-base -B /tmp/b-base "${common[@]}" -DFLASHTILE_BUILD_TESTS=OFF \
    -DFLASHTILE_BUILD_TOOLS=OFF > "$logs/cfg-base.log" 2>&1 &&
  ninja -C /tmp/b-base flashtile_mma_variants > "$logs/build-base.log" 2>&1;
  echo $? > "$logs/build-base.rc" ) &
wait
note "built: new rc $(cat "$logs/build-new.rc" 2>/dev/null) base rc $(cat "$logs/build-base.rc" 2>/dev/null)"
tail -3 "$logs/build-new.log" "$logs/build-base.log"; pack
N=/tmp/b-new/flashtile_mma_variants; B=/tmp/b-base/flashtile_mma_variants; F=/tmp/b-new/tools/flashtile
T=/tmp/b-new/tests/flashtile_cuda_mma_tests
case " $steps " in *" bench "*)
  # Base and new alternate, twice: the dense grid's run-to-run spread shows beside the ratio.
  $B --grid-only --csv "$out/base1.csv" > "$logs/bench-base1.log" 2>&1
  $N --csv "$out/new1.csv" > "$logs/bench-new1.log" 2>&1
  $B --grid-only --csv "$out/base2.csv" > "$logs/bench-base2.log" 2>&1
  $N --grid-only --csv "$out/new2.csv" > "$logs/bench-new2.log" 2>&1
  note "bench done"; grep -v "^dense" "$logs/bench-new1.log"
  python3 - "$out" <<'PY'
import csv, sys, statistics as st
d = sys.argv[1]
def load(n):
    try:
        return {(r["head_dim"], r["causal"], r["seqlen"]): float(r["tflops"])
                for r in csv.DictReader(open(f"{d}/{n}.csv")) if r["group"] == "dense"}
    except FileNotFoundError:
        return {}
b1, b2, n1, n2 = (load(x) for x in ("base1", "base2", "new1", "new2"))
worst = 9
print("d   causal seqlen   base1  base2   new1   new2   new/base (means)")
for key in b1:
    if key not in n1: continue
    b = [x[key] for x in (b1, b2) if key in x]; n = [x[key] for x in (n1, n2) if key in x]
    r = st.mean(n) / st.mean(b); worst = min(worst, r)
    print(f"{key[0]:>3} {key[1]:>6} {key[2]:>6} " + " ".join(f"{x:6.1f}" for x in b + n) + f"   {r:.3f}")
print(f"worst new/base {worst:.3f}")
PY
  pack;;
esac
case " $steps " in *" cli "*)
  # End to end through the CLI: every row checked on sampled query rows by the oracle.
  for args in "--causal" "--causal --window 1024,0" "--causal --softcap 50" "--causal --alibi" \
              "--causal --sinks" "--window 256,256 --softcap 30 --alibi --sinks"; do
    $F bench --seqlen 16384 --heads 16 --head-dim 128 --dtype bf16 --backends cuda_mma \
      --repeats 10 $args >> "$logs/cli.log" 2>&1
  done
  for args in "" "--causal"; do
    $F bench --varlen random:256-4096:16384 --heads 16 --head-dim 128 --dtype bf16 \
      --backends cuda_mma --repeats 10 $args >> "$logs/cli.log" 2>&1
  done
  note "cli done"; grep -E "^cuda_mma|skipped|rror" "$logs/cli.log"; pack;;
esac
case " $steps " in *" tests "*)
  timeout 150 $T > "$logs/mma_tests.log" 2>&1; echo "mma tests rc $?"
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |\[margin\]|tests ran|Failure|error" "$logs/mma_tests.log" | head -40
  note "tests done"; pack;;
esac
san_filter="Dtypes/CudaMmaGrid.VariantsMatchOracle/bfloat16:Dtypes/CudaMmaGrid.VarlenMatchesOracle/bfloat16:CudaMma.EveryHeadDim*:CudaMma.Misaligned*:CudaMma.Refuses*:Dtypes/CudaMmaGrid.MatchesOracle/float16"
for tool in memcheck racecheck; do
  case " $steps " in *" $tool "*)
    FLASHTILE_SMALL_GRID=1 timeout ${SAN_TIMEOUT:-90} compute-sanitizer --tool $tool \
      --error-exitcode 1 $T --gtest_filter="$san_filter" > "$logs/$tool.log" 2>&1
    echo "$tool rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|tests ran|PASSED|FAILED" "$logs/$tool.log" | head
    note "$tool done"; pack;;
  esac
done
case " $steps " in *" peers "*)
  # PyTorch's FlashAttention-2 and cuDNN beside cuda_mma (bf16 grid through the CLI sweep).
  PYTHONUNBUFFERED=1 timeout ${PEERS_TIMEOUT:-200} python3 bench/peers.py --cli $F \
    --out "$out/peers" --dtype bf16 --peers flash,cudnn > "$logs/peers.log" 2>&1
  echo "peers rc $?"; tail -45 "$logs/peers.log"; note "peers done"; pack;;
esac
note "all done"
