#!/usr/bin/env bash
# NOT RUN YET: the seventeenth session had no device (the device tool said "paused").
# The next session's first call, for issues 9 and 10: what the seventeenth session changed,
# checked and measured (~8 min; the device's limit is 10 a call).
#  - the new tests (queued timing, the workspace pool) and the backward suite, whose pre-pass
#    now zeroes dQ's accumulator (4b.10), with memcheck on its varlen/variant subset;
#  - the backward beside the peers (queued, the new default) and flashtile alone --isolated
#    (the old timing), so that the timing change and 4b.10 read apart from each other;
#  (call2.sh: the forward's cuda_sm90 sweep at 4k/16k queued and --isolated, issue 9.)
# Binaries, built here for sm_90a from main and carried (carry [".devbin/s17", ".device"]):
#   cmake -S . -B build-h -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
#     -DFLASHTILE_BUILD_BENCHMARKS=OFF
#   ninja -C build-h flashtile_cli flashtile_cuda_tests flashtile_cuda_backward_tests
#   for f in tools/flashtile tests/flashtile_cuda_tests tests/flashtile_cuda_backward_tests; do
#     strip -o /tmp/$(basename $f) build-h/$f; xz -6 -c /tmp/$(basename $f) > .devbin/s17/$(basename $f).xz; done
#   bash scripts/stage-device-deps.sh   # .device/deps (CLI11/Highway runtime libraries)
# Base for the backward's A/B: the same three binaries of main at 1cf3c4e (before 4b.10) in
# .devbin/s16 (a git worktree built the same way), so that both kernels run in this call.
# carry: [".devbin/s17", ".devbin/s16", ".device"] (62.7 MB of the 64 MiB); run as `bash bench/results/h200_session17/call1.sh`.
set -u
source bench/results/h200_session17/setup.sh s17c1 s17 s16
N=/tmp/s17; O=/tmp/s16

timeout 60 $N/flashtile_cuda_tests --gtest_filter='CudaTiming.*:CudaWorkspacePool.*' > $L/new_tests.log 2>&1
note "new tests rc=$? $(grep -hE '^\[  (PASSED|FAILED) |FAILED  \]' $L/new_tests.log | tr '\n' ' ')"
FLASHTILE_SMALL_GRID=1 timeout 170 $N/flashtile_cuda_backward_tests > $L/backward_suite.log 2>&1
note "backward suite rc=$? $(grep -hE '^\[  (PASSED|FAILED) |FAILED  \]' $L/backward_suite.log | tr '\n' ' ')"
SUB="BackendsAndDtypes/CudaBackwardGrid.VarlenMatchesOracle/*:BackendsAndDtypes/CudaBackwardGrid.VariantsMatchOracle/cuda_sm90_bfloat16"
FLASHTILE_SMALL_GRID=1 timeout 90 compute-sanitizer --tool memcheck --error-exitcode 1 \
  $N/flashtile_cuda_backward_tests --gtest_filter="$SUB" > $L/memcheck_backward.log 2>&1
note "memcheck backward rc=$? $(grep -hE 'ERROR SUMMARY' $L/memcheck_backward.log | tail -1)"
pack

BW="--sweep --pass bwd --dtype bf16 --sweep-head-dims 64,128 --sweep-seqlens 4096,16384 --sweep-causal 0,1 --repeats 10 --warmup 2 --backends cuda_sm90,cuda_mma"
for r in 1 2; do  # interleaved: new queued, new isolated, old isolated (the old default)
  timeout 90 $N/flashtile bench $BW > $L/bwd_new_queued_$r.log 2>&1; note "bwd new queued $r rc=$?"
  timeout 90 $N/flashtile bench $BW --isolated > $L/bwd_new_isolated_$r.log 2>&1; note "bwd new isolated $r rc=$?"
  [ -x $O/flashtile ] && { timeout 90 $O/flashtile bench $BW > $L/bwd_old_$r.log 2>&1; note "bwd old $r rc=$?"; }
done
pack
timeout 150 python3 bench/peers.py --cli $N/flashtile --pass bwd --dtype bf16 --head-dims 64,128 \
  --seqlens 4096,16384 --peers flash,cudnn --backends cuda_sm90,cuda_mma --cli-repeats 10 \
  --cli-warmup 2 --write-each-row --out $L/peers_bwd > $L/peers_bwd.log 2>&1
note "peers bwd rc=$?"
pack
