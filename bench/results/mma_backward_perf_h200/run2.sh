#!/bin/bash
# Second, short device call (only if the machine is warm): ncu on the new default (E) at the
# profiled shape, causal and not, as run.sh profiled B. Carries .devbin/binsE.tar.xz.
set -uo pipefail
L=$OUT/logs; mkdir -p $L; X=/tmp/bins; mkdir -p $X; tar xJf .devbin/binsE.tar.xz -C $X
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for c in full causal; do
  extra=""; [ $c = causal ] && extra=--causal
  timeout 30 $NCU --clock-control none -k regex:mma_backward_kernel -c 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --section InstructionStats --section SourceCounters \
    --export $L/ncu_E_$c --force-overwrite \
    $X/E/flashtile bench --pass bwd --backends cuda_mma --dtype bf16 --batch 4 --heads 16 \
    --seqlen 4096 --head-dim 128 --warmup 0 --repeats 1 $extra > $L/ncu_E_$c.log 2>&1
  $NCU --import $L/ncu_E_$c.ncu-rep --page raw --csv > $L/ncu_E_${c}_raw.csv 2>&1
  rm -f $L/ncu_E_$c.ncu-rep; grep -E "cuda_mma bwd" $L/ncu_E_$c.log
done
tar czf $OUT/logs.tgz -C $OUT logs
