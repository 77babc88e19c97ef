#!/usr/bin/env bash
# Tenth session, call 1 (H200). Binaries built on the dev machine for sm_90a (main = 30b749b;
# fmaK = the same tree with Sm90Traits<64>'s kFmaExp2Groups = K of every 8 column groups on
# the FMA pipe, step 4.11), carried xz-compressed in .devbin/.
#  1. step 4.11's A/B at d=64: bf16 twice (main, fma1, fma2, fma3 interleaved), fp16 once
#  2. issue 9's selection: cuda_mma against cuda_sm90 on the fp16 grid (128-16k), bf16 below
#     512, and the variants (window, softcap, ALiBi, sinks; bf16 1k/4k/16k, fp16 4k)
#  3. issue 11: the write-up's fp32 case x10 and the tf32x3 breakdown (host against GPU)
#  4. fma2's sm90 tests (small grid; the oracle checks the FMA exp2 at d=64)
set -u
L=$OUT/s10c1; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.devbin/lib
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
B=/tmp/s10bin
for v in main fma1 fma2 fma3; do
  mkdir -p $B/$v
  for f in .devbin/$v/*.xz; do xz -dc $f > $B/$v/$(basename $f .xz) & done
done
wait; chmod +x $B/*/*
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $L/gpu.txt 2>&1
note unpacked
# 1.
d64() {  # d64 VARIANT DTYPE TAG
  timeout 60 $B/$1/flashtile bench --sweep --sweep-seqlens 4096,16384 --sweep-head-dims 64 \
    --sweep-causal 0,1 --dtype $2 --backends cuda_sm90 --repeats 10 --warmup 2 \
    --output $L/fma_$1_$2_$3.csv > $L/fma_$1_$2_$3.log 2>&1
}
for v in main fma1 fma2 fma3; do d64 $v bf16 1; done
for v in fma3 fma2 fma1 main; do d64 $v bf16 2; done
for v in main fma1 fma2 fma3; do d64 $v f16 1; done
note "fma A/B"
# 2.
F=$B/main/flashtile
timeout 150 $F bench --sweep --sweep-seqlens 128,256,512,1024,2048,4096,8192,16384 \
  --sweep-head-dims 64,128,256 --sweep-causal 0,1 --dtype f16 --backends cuda_mma,cuda_sm90 \
  --repeats 10 --warmup 2 --output $L/sel_f16.csv > $L/sel_f16.log 2>&1
timeout 60 $F bench --sweep --sweep-seqlens 128,256,512 --sweep-head-dims 64,128,256 \
  --sweep-causal 0,1 --dtype bf16 --backends cuda_mma,cuda_sm90 --repeats 10 --warmup 2 \
  --output $L/sel_bf16_short.csv > $L/sel_bf16_short.log 2>&1
note "selection grid"
var() {  # var TAG DTYPE SEQLENS CAUSAL FLAGS...
  local tag=$1 dt=$2 sl=$3 c=$4; shift 4
  timeout 90 $F bench --sweep --sweep-seqlens $sl --sweep-head-dims 64,128,256 --sweep-causal $c \
    --dtype $dt --backends cuda_mma,cuda_sm90 --repeats 10 --warmup 2 "$@" \
    --output $L/var_${tag}_$dt.csv > $L/var_${tag}_$dt.log 2>&1
}
var window bf16 1024,4096,16384 0 --window 1024,0
var softcap bf16 1024,4096,16384 1 --softcap 30
var alibi bf16 1024,4096,16384 1 --alibi
var sinks bf16 1024,4096,16384 1 --sinks
for t in window softcap alibi sinks; do :; done
var window f16 4096 0 --window 1024,0
var softcap f16 4096 1 --softcap 30
var alibi f16 4096 1 --alibi
var sinks f16 4096 1 --sinks
note variants
# 3.
for i in $(seq 10); do $F bench --dtype fp32 --batch 1 --heads 1 --seqlen 1024 --head-dim 64 \
  --backends cuda_tf32x3 --repeats 200 >> $L/writeup_tf32x3.log 2>&1; done
timeout 60 $B/main/flashtile_tf32x3_breakdown --repeats 200 > $L/breakdown.log 2>&1
note writeup
# 4.
T=$B/fma2/flashtile_cuda_sm90_tests
$T --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}' | grep -v "Persistent\|Split\|Varlen\|Offsets\|LongerSeq" > $L/test_list.txt
run_test() {
  local n=$(echo $1 | tr '/.' '__')
  FLASHTILE_SMALL_GRID=1 timeout 200 $T --gtest_filter="$1" > $L/test_$n.log 2>&1
  echo "$1 rc=$?" >> $L/test_rc.txt
}
export -f run_test; export T L
xargs -P 8 -L 1 bash -c 'run_test $0' < $L/test_list.txt
note "tests ($(grep -c 'rc=0' $L/test_rc.txt) passed, $(grep -vc 'rc=0' $L/test_rc.txt) not)"
tar czf $OUT/s10c1.tgz -C $OUT s10c1
