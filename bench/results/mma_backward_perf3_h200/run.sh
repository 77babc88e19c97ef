#!/bin/bash
# The one device call of this session (issue 10, sm80 path), run from .wt/bwd2 with
# .devbin/*.xz carried: flashtile CLIs built on the dev VM for sm_90a from the commits named in
# predictions_before_call.md (M = main, P, Q, R, I = candidate default) and I's backward tests.
# Order, on a quiet GPU: M's sweep, the P-Q-R chain at 4k, bench/peers.py for I beside FA2
# and cuDNN; then I's tests with memcheck and racecheck beside them, in the time left of 132 s.
# Logs: $OUT/logs.tgz.
set -uo pipefail
root=$PWD/../..
export LD_LIBRARY_PATH=$root/.device/deps/lib/x86_64-linux-gnu:$root/.device/deps/lib:${LD_LIBRARY_PATH:-}
L=$OUT/logs; mkdir -p $L
X=/tmp/bins; T0=$SECONDS
for f in .devbin/*.xz; do  # name.xz -> $X/<variant>/<binary>
  n=$(basename $f .xz); v=${n%%_*}; b=${n#*_}; mkdir -p $X/$v
  (xz -dc $f > $X/$v/$b 2>/dev/null || python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" $f > $X/$v/$b; chmod +x $X/$v/$b) &
done; wait
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
step() {  # step NAME LIMIT CMD...: log to $L/NAME.log
  local name=$1 lim=$2; shift 2; local t0=$SECONDS
  timeout $lim "$@" > $L/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $((SECONDS-t0))s (at $((SECONDS-T0))s)" | tee -a $L/steps.txt
  [ "${PACK:-1}" = 1 ] && pack; return $rc; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader; uname -r; echo "unpacked at $((SECONDS-T0))s"; } | tee $L/gpu.txt
if ! $X/M/flashtile info > $L/info.txt 2>&1; then cat $L/info.txt; ldd $X/M/flashtile; pack; exit 1; fi
sweep() {  # sweep VARIANT SEQLENS LIMIT
  step sweep_$1 $3 $X/$1/flashtile bench --sweep --pass bwd --backends cuda_mma --dtype bf16 \
    --sweep-head-dims 64,128 --sweep-seqlens $2 --sweep-causal 0,1 --repeats 10 --warmup 2 \
    --output $L/sweep_$1.json; }
sweep M 1024,4096,16384 30
for v in P Q R; do sweep $v 4096 15; done
# I's own sweep is the one peers.py runs (the same `bench --sweep`, 10 timed calls).
step peers 45 env PYTHONUNBUFFERED=1 python3 bench/peers.py --pass bwd --dtype bf16 \
  --head-dims 64,128 --seqlens 1024,4096,16384 --peers flash,cudnn --backends cuda_mma \
  --cli $X/I/flashtile --cli-repeats 10 --cli-warmup 2 --out $L
tail -14 $L/peers.log 2>/dev/null
t=$X/I/flashtile_cuda_mma_backward_tests
san="Dtypes/CudaMmaBackwardGrid.VarlenMatchesOracle/bfloat16:CudaMmaBackward.EveryHeadDim*:CudaMmaBackward.Refuses*"
left=$((132 - (SECONDS - T0)))
PACK=0 FLASHTILE_SMALL_GRID=1 step tests_I $left $t & p1=$!
PACK=0 FLASHTILE_SMALL_GRID=1 step memcheck_I $left compute-sanitizer --tool memcheck --error-exitcode 1 $t --gtest_filter="$san" & p2=$!
PACK=0 FLASHTILE_SMALL_GRID=1 step racecheck_I $left compute-sanitizer --tool racecheck --error-exitcode 1 $t --gtest_filter="$san" & p3=$!
wait $p1 $p2 $p3
grep -hE "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|worst|tests ran" $L/tests_I.log $L/memcheck_I.log $L/racecheck_I.log | head -24
python3 - $L <<'PY'
import json, sys, os
L = sys.argv[1]; rows = {}
for v in "MPQRI":
    f = os.path.join(L, f"sweep_{v}.json")
    if os.path.exists(f):
        for r in json.load(open(f)):
            rows.setdefault((r["head_dim"], r["causal"], r["seqlen_q"]), {})[v] = r["tflops"]
f = os.path.join(L, "peers_bwd.json")  # I: the sweep peers.py ran
if os.path.exists(f):
    for r in json.load(open(f))["rows"]:
        if r["impl"] == "flashtile:cuda_mma":
            rows.setdefault((r["head_dim"], int(r["causal"]), r["seqlen"]), {})["I"] = r["tflops"]
print("d causal seqlen " + " ".join("MPQRI"))
for k in sorted(rows):
    print(*k, *(f"{rows[k].get(v, 0):.1f}" for v in "MPQRI"))
PY
pack
