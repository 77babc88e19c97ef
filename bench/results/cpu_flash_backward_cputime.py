#!/usr/bin/env python3
"""CPU time of cpu_flash's backward beside torch CPU SDPA's backward, in one process.

OMP_NUM_THREADS sets flashtile's threads; torch gets the same count. time.process_time of
each call (all threads' CPU time), median of REPEATS after one warm-up. BSHD, fp32, B=1 H=8.
Usage: OMP_NUM_THREADS=1 PYTHONPATH=<build>/python python3 bench/results/cpu_flash_backward_cputime.py [N:d:causal ...]
(<build> configured with -DFLASHTILE_BUILD_PYTHON=ON; WHICH=flash or torch times one side only;
WALL=1 times wall clock instead). The script behind cpu_flash_backward_devvm.txt sections 4-5.
"""
import os, sys, time, statistics
import torch
import flashtile

threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
torch.set_num_threads(threads)
repeats = int(os.environ.get("REPEATS", "3"))
which = os.environ.get("WHICH", "both")
clock = time.perf_counter if os.environ.get("WALL") else time.process_time
cases = sys.argv[1:] or ["2048:64:0", "2048:64:1", "2048:128:0", "2048:128:1"]
B, H = 1, int(os.environ.get("HEADS", "8"))
for case in cases:
    n, d, causal = case.split(":")
    n, d, causal = int(n), int(d), bool(int(causal))
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(B, n, H, d, generator=g) for _ in range(4))
    out, lse = flashtile.attention(q, k, v, causal=causal, return_lse=True)
    flops = 10 * B * H * n * n * d * (0.5 if causal else 1.0)  # 5 products x 2 n^2 d
    def t_flash():
        t0 = clock(); flashtile.attention_backward(do, q, k, v, out, lse, causal=causal); return clock() - t0
    qt, kt, vt = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    dot = do.transpose(1, 2).contiguous()
    def t_torch():
        o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        t0 = clock(); torch.autograd.grad(o, (qt, kt, vt), dot); return clock() - t0
    res = {}
    for name, fn in (("torch", t_torch), ("flash", t_flash)):
        if which not in ("both", name): continue
        fn()
        res[name] = statistics.median(fn() for _ in range(repeats)) * 1e3
    line = f"N={n} d={d:<3} causal={causal!s:<5} threads={threads}:"
    for name, ms in res.items():
        line += f" {name} {ms:7.1f} ms ({flops / ms / 1e6:6.1f} GF/s)"
    if len(res) == 2: line += f"  {res['torch'] / res['flash']:.2f}x"
    print(line, f"load {open('/proc/loadavg').read().split()[0]}", flush=True)
