#!/usr/bin/env python3
"""flashtile.attention against torch SDPA, both called from Python on the same CUDA tensors.

Grid (FlashAttention's benchmark convention): 16k tokens per batch (batch = 16384 /
seqlen), hidden 2048 (heads = 2048 / head_dim). FLOPs = 4 * batch * seqlen^2 * heads *
head_dim, halved when causal. Each point: warm-up, then the median of CUDA-event timings.
Both sides read the same memory: flashtile the BSHD tensors, SDPA their BHSD views (the
layout SDPA's fused kernels expect from a model), so neither pays for a copy.

    python3 bench/python_vs_sdpa.py --dtype float32 --png python_vs_sdpa.png --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

import flashtile
from torch_timing import attention_flops as flops
from torch_timing import cuda_event_median_ms as median_ms


def run(args):
    dtype = getattr(torch, args.dtype)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 on both sides
    rows = []
    for head_dim in args.head_dims:
        for causal in args.causal:
            for seqlen in args.seqlens:
                batch, heads = max(1, args.tokens // seqlen), args.hidden // head_dim
                shape = (batch, seqlen, heads, head_dim)
                q, k, v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # BHSD views
                row = dict(dtype=args.dtype, head_dim=head_dim, causal=causal, seqlen=seqlen,
                           batch=batch, heads=heads)
                work = flops(batch, seqlen, heads, head_dim, causal)
                try:
                    row["flashtile_backend"] = flashtile.plan(q, k, v, causal=causal)
                except ValueError as error:
                    row["flashtile_error"] = str(error)
                sdpa = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)  # noqa: E731
                row["sdpa_ms"] = median_ms(sdpa, args.warmup, args.repeats)
                row["sdpa_tflops"] = work / row["sdpa_ms"] / 1e9
                if "flashtile_backend" in row:
                    ours = lambda: flashtile.attention(q, k, v, causal=causal)  # noqa: E731
                    row["flashtile_ms"] = median_ms(ours, args.warmup, args.repeats)
                    row["flashtile_tflops"] = work / row["flashtile_ms"] / 1e9
                    row["ratio_vs_sdpa"] = row["sdpa_ms"] / row["flashtile_ms"]
                    diff = (ours().float() - sdpa().transpose(1, 2).float()).abs().max().item()
                    row["max_abs_diff"] = diff
                rows.append(row)
                print(format_row(row), flush=True)
                del q, k, v, qt, kt, vt
    return rows


def format_row(row):
    head = (f"{row['dtype']:>8} d={row['head_dim']:<3} causal={int(row['causal'])} "
            f"S={row['seqlen']:<5} B={row['batch']:<3} H={row['heads']:<3} "
            f"sdpa {row['sdpa_ms']:8.3f} ms {row['sdpa_tflops']:6.1f} TF/s")
    if "flashtile_ms" not in row:
        return head + f" | flashtile: {row.get('flashtile_error', '?')}"
    return head + (f" | flashtile[{row['flashtile_backend']}] {row['flashtile_ms']:8.3f} ms "
                   f"{row['flashtile_tflops']:6.1f} TF/s ({row['ratio_vs_sdpa']:.2f}x SDPA) "
                   f"max|diff| {row['max_abs_diff']:.2e}")


def plot(rows, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    causal_values = sorted({r["causal"] for r in rows})
    fig, axes = plt.subplots(1, len(causal_values), figsize=(6 * len(causal_values), 4.5),
                             squeeze=False, sharey=True)
    for ax, causal in zip(axes[0], causal_values):
        for i, head_dim in enumerate(sorted({r["head_dim"] for r in rows})):
            color = f"C{i}"  # one colour per head_dim: solid flashtile, dashed SDPA
            sel = [r for r in rows if r["causal"] == causal and r["head_dim"] == head_dim]
            seqlens = [r["seqlen"] for r in sel]
            ax.plot(seqlens, [r["sdpa_tflops"] for r in sel], "s--", color=color,
                    label=f"torch SDPA, d={head_dim}")
            ours = [r for r in sel if "flashtile_tflops" in r]
            if ours:
                ax.plot([r["seqlen"] for r in ours], [r["flashtile_tflops"] for r in ours],
                        "o-", color=color,
                        label=f"flashtile [{ours[0]['flashtile_backend']}], d={head_dim}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("seqlen (batch x seqlen = 16k tokens, hidden 2048)")
        ax.set_title(f"{'causal' if causal else 'non-causal'}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("TFLOP/s")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--causal", type=int, nargs="+", default=[0, 1], choices=[0, 1])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--png", help="plot TFLOP/s against seqlen here")
    parser.add_argument("--from-json", help="only re-plot the rows of an earlier --json")
    args = parser.parse_args(argv)
    args.causal = [bool(c) for c in args.causal]
    if args.from_json:
        with open(args.from_json) as f:
            recorded = json.load(f)
        plot(recorded["rows"], args.png or "python_vs_sdpa.png",
             f"flashtile vs torch SDPA, {recorded['rows'][0]['dtype']}, {recorded['device']}")
        return
    if not torch.cuda.is_available():
        sys.exit("python_vs_sdpa.py needs a CUDA device")
    device = torch.cuda.get_device_name()
    print(f"{device}, torch {torch.__version__}, flashtile {flashtile.__version__}", flush=True)
    rows = run(args)
    meta = dict(device=device, torch=torch.__version__, flashtile=flashtile.__version__,
                command=" ".join(["python3", "bench/python_vs_sdpa.py"] + (argv or sys.argv[1:])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta, rows=rows), f, indent=1)
    if args.png:
        plot(rows, args.png, f"flashtile vs torch SDPA, {args.dtype}, {device}")


if __name__ == "__main__":
    main()
