#!/usr/bin/env python3
"""flashtile's cpu_flash against PyTorch's CPU SDPA, fp32, side by side on one machine.

For each thread count and causal setting, this script times
  - torch.nn.functional.scaled_dot_product_attention on CPU tensors (B, H, N, d), fp32, in
    this process (torch.set_num_threads), median of --repeats calls after --warmup calls;
  - flashtile's cpu_flash on the same shape (BSHD), through the built `flashtile bench
    --json` CLI (its median), or, when no CLI is built, through the Google Benchmark binary
    bench/micro's flashtile_micro_bench (median of --repeats repetitions);
one after the other, never at the same time, and prints GFLOP/s and the ratio
cpu_flash / torch. FLOPs = 4·B·H·N²·d, halved when causal.

--pass bwd times the backward instead: torch's SDPA backward (torch.autograd.grad of its
output, the forward excluded) against `flashtile bench --pass bwd` (cpu_flash's backward
from its own forward's out and lse), FLOPs 2.5x the forward's.

    python3 bench/cpu_vs_torch.py --build build --threads 1,16 --output cpu_vs_torch.json
    python3 bench/cpu_vs_torch.py --build build --threads 1 --pass bwd
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time


def flops(b, h, n, d, causal, pass_="fwd"):
    return 4.0 * b * h * n * n * d * (0.5 if causal else 1.0) * (2.5 if pass_ == "bwd" else 1.0)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def time_torch(args, threads, causal):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    shape = (args.batch, args.heads, args.seqlen, args.head_dim)
    q, k, v = (torch.rand(shape, generator=gen) * 2 - 1 for _ in range(3))
    times = []
    if args.pass_ == "bwd":
        leaves = [x.requires_grad_() for x in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        dout = torch.rand(shape, generator=gen) * 2 - 1
        for i in range(args.warmup + args.repeats):
            t0 = time.perf_counter()
            torch.autograd.grad(out, leaves, dout, retain_graph=True)
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3
    with torch.no_grad():
        for _ in range(args.warmup):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def time_flashtile_cli(cli, args, threads, causal):
    cmd = [cli, "bench", "--backends", "cpu_flash", "--batch", str(args.batch),
           "--heads", str(args.heads), "--seqlen", str(args.seqlen),
           "--head-dim", str(args.head_dim), "--dtype", "f32", "--warmup", str(args.warmup),
           "--repeats", str(args.repeats), "--threads", str(threads), "--json",
           "--pass", args.pass_]
    if causal:
        cmd.append("--causal")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = [r for r in json.loads(out) if r["backend"] == "cpu_flash"]
    if not rows:
        sys.exit(f"flashtile bench printed no cpu_flash row: {out}")
    return rows[0]["ms"]


def time_flashtile_micro(binary, args, threads, causal):
    if args.pass_ != "fwd":
        sys.exit("the micro-benchmark path times the forward only; build the flashtile CLI")
    if args.batch != 1:
        sys.exit("the micro-benchmark path runs batch 1 only; build the flashtile CLI")
    case = f"{args.seqlen},{args.head_dim},{int(causal)},{threads},{args.heads}"
    cmd = [binary, f"--forward_case={case}", "--benchmark_format=json",
           f"--benchmark_repetitions={args.repeats}", "--benchmark_report_aggregates_only=true"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    for row in out["benchmarks"]:
        if row.get("aggregate_name") == "median":
            scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[row["time_unit"]]
            return row["real_time"] * scale
    sys.exit(f"no median in the micro-benchmark output: {out}")


def find_flashtile(build):
    for rel in ("tools/flashtile", "tools/flashtile/flashtile", "flashtile"):
        path = os.path.join(build, rel)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return ("cli", path)
    path = os.path.join(build, "bench/micro/flashtile_micro_bench")
    if os.path.isfile(path):
        return ("micro", path)
    sys.exit(f"neither the flashtile CLI nor flashtile_micro_bench is built under {build}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build", help="flashtile build directory")
    parser.add_argument("--flashtile", help="path to the flashtile CLI (overrides --build)")
    parser.add_argument("--threads", default=f"1,{os.cpu_count()}",
                        help="comma-separated thread counts (default: 1 and all cores)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--causal", default="0,1", help="causal settings to run (default 0,1)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--output", help="also write the rows to this JSON file")
    parser.add_argument("--pass", dest="pass_", choices=["fwd", "bwd"], default="fwd",
                        help="time the forward (default) or the backward")
    args = parser.parse_args()

    import torch

    kind, path = ("cli", args.flashtile) if args.flashtile else find_flashtile(args.build)
    timer = time_flashtile_cli if kind == "cli" else time_flashtile_micro
    threads_list = [int(t) for t in args.threads.split(",")]
    causal_list = [bool(int(c)) for c in args.causal.split(",")]

    print(f"# {cpu_model()}, {os.cpu_count()} CPUs; torch {torch.__version__}; "
          f"flashtile via {kind}: {path}")
    print(f"# {args.pass_}: B={args.batch} H={args.heads} N={args.seqlen} d={args.head_dim} fp32; "
          f"median of {args.repeats} after {args.warmup} warm-up calls")
    header = (f"{'threads':>7} {'causal':>6} {'torch ms':>10} {'torch GF/s':>10} "
              f"{'flash ms':>10} {'flash GF/s':>10} {'flash/torch':>11}")
    print(header)
    rows = []
    for threads in threads_list:
        for causal in causal_list:
            f = flops(args.batch, args.heads, args.seqlen, args.head_dim, causal, args.pass_)
            torch_ms = time_torch(args, threads, causal)
            flash_ms = timer(path, args, threads, causal)
            row = {"pass": args.pass_, "threads": threads, "causal": causal, "batch": args.batch,
                   "heads": args.heads, "seqlen": args.seqlen, "head_dim": args.head_dim,
                   "torch_ms": torch_ms, "torch_gflops": f / torch_ms / 1e6,
                   "cpu_flash_ms": flash_ms, "cpu_flash_gflops": f / flash_ms / 1e6,
                   "ratio": torch_ms / flash_ms}
            rows.append(row)
            print(f"{threads:>7} {str(causal):>6} {torch_ms:>10.2f} {row['torch_gflops']:>10.1f} "
                  f"{flash_ms:>10.2f} {row['cpu_flash_gflops']:>10.1f} {row['ratio']:>10.2f}x",
                  flush=True)
    if args.output:
        with open(args.output, "w") as out:
            json.dump({"cpu": cpu_model(), "cpus": os.cpu_count(), "torch": torch.__version__,
                       "flashtile": kind, "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
