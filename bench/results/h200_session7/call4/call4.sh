#!/usr/bin/env bash
# Session 7, call 4: the fp32 peers line on main's default (cuda_tf32x3 d=128 ping-pong). Call 3's
# CLI ran together by default: a stale object (sm90_hdim64.cu.o, lost from ninja's deps log)
# kept the old inline default, which the linker took; this CLI is rebuilt with it.
set -u
L=$OUT/c4; mkdir -p $L bin
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
xz -dc .devbin/b7h/flashtile.xz > bin/flashtile; chmod +x bin/flashtile
PYTHONUNBUFFERED=1 timeout 80 python3 bench/peers.py --cli bin/flashtile --dtype f32 --backends cuda_tf32x3 --peers efficient --head-dims 64,128 --seqlens 1024,4096,16384 --cli-repeats 5 --cli-warmup 1 --write-each-row --out $L/peers_f32 > $L/peers_f32.log 2>&1
echo "peers rc=$?"; tail -14 $L/peers_f32.log
tar czf $OUT/c4.tgz -C $OUT c4
