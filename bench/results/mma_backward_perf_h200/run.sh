#!/bin/bash
# The one device call of the cuda_mma backward's speed work (issue 10, sm80 path), run from
# .wt/bwd-perf with .devbin/bins.tar.xz carried: binaries built on the dev VM for sm_90a from
# the commits named in docs/JOURNEY.md "Step 3b" (A = 4 warps, B = 8 warps, C = B + red.v2
# dQ adds, D = B + red.v4 dQ adds, E = D + one barrier per step). Order: A/B sweeps on a
# quiet GPU, then the correctness suite and sanitizers on the fastest variant (B if it
# fails), ncu on the 4k d=128 shape, and the peers beside FA2 and cuDNN. Logs: $OUT/logs.tgz.
set -uo pipefail
root=$PWD/../..
export LD_LIBRARY_PATH=$root/.device/deps/lib/x86_64-linux-gnu:$root/.device/deps/lib:${LD_LIBRARY_PATH:-}
L=$OUT/logs; mkdir -p $L
X=/tmp/bins; mkdir -p $X; tar xJf .devbin/bins.tar.xz -C $X
T0=$SECONDS
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
step() {  # step NAME LIMIT CMD...: log to $L/NAME.log
  local name=$1 lim=$2; shift 2; local t0=$SECONDS
  timeout $lim "$@" > $L/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $((SECONDS-t0))s (at $((SECONDS-T0))s)"; pack; return $rc; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader; uname -r; } | tee $L/gpu.txt
if ! $X/B/flashtile info > $L/info.txt 2>&1; then cat $L/info.txt; ldd $X/B/flashtile; pack; exit 1; fi
sweep() { step sweep_$1 50 $X/$1/flashtile bench --sweep --pass bwd --backends cuda_mma --dtype bf16 \
  --sweep-head-dims 64,128 --sweep-seqlens 1024,4096,16384 --sweep-causal 0,1 --output $L/sweep_$1.json; }
for v in B C D E; do sweep $v; done
geo() { python3 -c "import json,math,sys; r=json.load(open(sys.argv[1])); print(math.exp(sum(math.log(x['tflops']) for x in r)/len(r)))" $L/sweep_$1.json 2>/dev/null || echo 0; }
for v in A B C D E; do echo "$v geomean TFLOP/s $(geo $v)"; done | tee $L/geomean.txt
order=$(for v in B C D E; do echo "$(geo $v) $v"; done | sort -rn | awk '{print $2}' | tr '\n' ' ')
echo "order: $order" | tee -a $L/geomean.txt
san="Dtypes/CudaMmaBackwardGrid.VarlenMatchesOracle/bfloat16:CudaMmaBackward.EveryHeadDim*:CudaMmaBackward.Refuses*:CudaMmaBackward.Plan*"
race="Dtypes/CudaMmaBackwardGrid.VarlenMatchesOracle/bfloat16:CudaMmaBackward.EveryHeadDim*"
W=""
for v in $order; do
  [ $((SECONDS-T0)) -gt 150 ] && break
  t=$X/$v/flashtile_cuda_mma_backward_tests
  FLASHTILE_SMALL_GRID=1 step tests_$v 75 $t & p1=$!
  FLASHTILE_SMALL_GRID=1 step memcheck_$v 75 compute-sanitizer --tool memcheck --error-exitcode 1 $t --gtest_filter="$san" & p2=$!
  FLASHTILE_SMALL_GRID=1 step racecheck_$v 75 compute-sanitizer --tool racecheck --error-exitcode 1 $t --gtest_filter="$race" & p3=$!
  step check_$v 75 $X/$v/flashtile check --pass bwd --backends cuda_mma --shapes 100 & p4=$!
  ok=1; for p in $p1 $p2 $p3 $p4; do wait $p || ok=0; done
  grep -hE "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|margin|worst" $L/tests_$v.log $L/memcheck_$v.log $L/racecheck_$v.log $L/check_$v.log | head -20
  if [ $ok = 1 ]; then W=$v; break; fi
done
echo "default candidate: ${W:-none}" | tee $L/winner.txt
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
prof() {  # prof TAG VARIANT [--causal]
  local tag=$1 v=$2; shift 2
  step ncu_$tag 40 $NCU --clock-control none -k regex:mma_backward_kernel -c 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --section InstructionStats --section SourceCounters \
    --export $L/ncu_$tag --force-overwrite \
    $X/$v/flashtile bench --pass bwd --backends cuda_mma --dtype bf16 --batch 4 --heads 16 \
    --seqlen 4096 --head-dim 128 --warmup 0 --repeats 1 "$@"
  [ -f $L/ncu_$tag.ncu-rep ] && $NCU --import $L/ncu_$tag.ncu-rep --page raw --csv > $L/ncu_${tag}_raw.csv 2>&1
  rm -f $L/ncu_$tag.ncu-rep; pack
}
prof B_full B; prof B_causal B --causal
[ -n "$W" ] && step peers 90 env PYTHONUNBUFFERED=1 python3 bench/peers.py --pass bwd --dtype bf16 \
  --head-dims 64,128 --seqlens 1024,4096,16384 --peers flash,cudnn --backends cuda_mma \
  --cli $X/$W/flashtile --out $L
tail -14 $L/peers.log 2>/dev/null
# Optional, while the call stays under its planned length: the 4-warp baseline's sweep and
# the default candidate's profile.
[ $((SECONDS-T0)) -lt 195 ] && sweep A
[ -n "$W" ] && [ "$W" != B ] && [ $((SECONDS-T0)) -lt 205 ] && prof ${W}_full $W
python3 - $L <<'PY'
import json, sys, os
L = sys.argv[1]
rows = {}
for v in "ABCDE":
    f = os.path.join(L, f"sweep_{v}.json")
    if os.path.exists(f):
        for r in json.load(open(f)):
            rows.setdefault((r["head_dim"], r["causal"], r["seqlen_q"]), {})[v] = r["tflops"]
print("d causal seqlen " + " ".join("ABCDE"))
for k in sorted(rows):
    print(*k, *(f"{rows[k].get(v, 0):.1f}" for v in "ABCDE"))
PY
pack
