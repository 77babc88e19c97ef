#!/usr/bin/env bash
# Session 8, call 1 (lead): where the write-up case's 13.4 us forward and 4.6 us combine tail go.
# (1) cluster_probe: how many clusters of N 225-KB CTAs the H200 holds at once (the cluster
#     merge needs 8 clusters of 16); (2) ncu --set full of the split forward (16 splits) and the
#     combine on the write-up case; (3) the write-up line and the breakdown, as last session.
set -u
L=$OUT/c1; mkdir -p $L/ncu bin
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
# Main's binaries, built here (16 cores) rather than on the 2-core dev machine.
cmake -S . -B build-c1 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHTILE_DEVELOPER_BUILD=ON -DFLASHTILE_BUILD_BENCHMARKS=OFF -DFLASHTILE_BUILD_TF32X3_BREAKDOWN=ON -DCMAKE_PREFIX_PATH=$PWD/.device/deps > $L/configure.log 2>&1
timeout 300 ninja -C build-c1 -j16 tools/flashtile flashtile_tf32x3_breakdown > $L/build.log 2>&1; echo "build rc=$? at $((SECONDS-t0)) s"
cp build-c1/tools/flashtile build-c1/flashtile_tf32x3_breakdown bin/ 2>/dev/null; ls bin
cp /dev/null /dev/null; xz -dc .devbin/s8a/cluster_probe.xz > bin/cluster_probe; chmod +x bin/cluster_probe
F=bin/flashtile
pack() { tar czf $OUT/c1.tgz --exclude='*.ncu-rep' -C $OUT c1; }
timeout 20 bin/cluster_probe > $L/cluster_probe.txt 2>&1; cat $L/cluster_probe.txt
W="--dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64 --backends cuda_tf32x3"
prof() { local n=$1 k=$2; shift 2; local s=$SECONDS
  timeout 90 ncu --clock-control none --set full --import-source yes -k regex:$k -s 3 -c 1 -f -o $L/ncu/$n $F bench --warmup 0 --repeats 4 "$@" > $L/ncu/$n.run.log 2>&1
  ncu -i $L/ncu/$n.ncu-rep --page details --print-details all > $L/ncu/$n.details.txt 2>&1
  ncu -i $L/ncu/$n.ncu-rep --page raw --csv > $L/ncu/$n.raw.csv 2>&1
  ncu -i $L/ncu/$n.ncu-rep --page source --csv --print-source sass > $L/ncu/$n.sass.csv 2>&1
  echo "== ncu $n ($((SECONDS-s)) s): $(grep -m1 -E 'Duration' $L/ncu/$n.details.txt)"; }
prof writeup_forward tf32x3_sm90 $W
prof writeup_combine combine_split_kv $W
pack
for r in 1 2; do timeout 30 $F bench $W --repeats 200 > $L/writeup_$r.log 2>&1; grep -h "^cuda_tf32x3" $L/writeup_$r.log; done
timeout 40 bin/flashtile_tf32x3_breakdown --repeats 200 > $L/breakdown.log 2>&1; cat $L/breakdown.log
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $L/smi.txt
pack; echo "all done at $((SECONDS-t0)) s"
