#!/usr/bin/env python3
"""Rows of this directory's device call, from the logs (the M sweep and peers.py were cut by
their time limits before writing JSON; `flashtile bench` prints each point as it ends).
Writes call1_rows.csv: variant, head_dim, causal, seqlen, ms, tflops; FA2/cuDNN from peers."""
import csv, re, os
here = os.path.dirname(os.path.abspath(__file__))
rows = []
def cli_points(path, variant):
    text = open(path).read()
    for m in re.finditer(r"\[\d+/\d+\] cuda_mma b(\d+) sq(\d+) sk\d+ hq\d+ hkv\d+ d(\d+)( causal)? bfloat16\n\s+([\d.]+) ms, ([\d.]+) TFLOP/s", text):
        b, sq, d, causal, ms = int(m.group(1)), int(m.group(2)), int(m.group(3)), bool(m.group(4)), float(m.group(5))
        # TFLOP/s from the time (the log prints 3 digits): 2.5 x the forward's 4·b·h·s²·d,
        # half of it causal; the heads are the field grid's hidden 2048 / d.
        flops = 2.5 * 4 * b * (2048 // d) * sq * sq * d / (2 if causal else 1)
        rows.append(dict(impl=variant, head_dim=d, causal=causal, seqlen=sq, ms=ms,
                         tflops=round(flops / (ms * 1e-3) / 1e12, 1)))
for v in "MPQR":
    cli_points(os.path.join(here, f"call1_sweep_{v}_log.txt"), v)
peers = open(os.path.join(here, "call1_peers_log.txt")).read()
cli_points(os.path.join(here, "call1_peers_log.txt"), "I")
for m in re.finditer(r"^(flash|cudnn)\s+bf16 d=(\d+)\s+(full|causal)\s+s=(\d+)\s+([\d.]+) ms\s+([\d.]+) TFLOP/s", peers, re.M):
    rows.append(dict(impl=m.group(1), head_dim=int(m.group(2)), causal=m.group(3) == "causal",
                     seqlen=int(m.group(4)), ms=float(m.group(5)), tflops=float(m.group(6))))
with open(os.path.join(here, "call1_rows.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=["impl", "head_dim", "causal", "seqlen", "ms", "tflops"])
    w.writeheader(); w.writerows(rows)
get = {(r["impl"], r["head_dim"], r["causal"], r["seqlen"]): r["tflops"] for r in rows}
keys = sorted({(r["head_dim"], r["causal"], r["seqlen"]) for r in rows})
fmt = lambda x: f"{x:6.1f}" if x else "     -"
print("| d | causal | seqlen | M | P | Q | R | I | FA2 | cuDNN | I/M | I/FA2 | I/cuDNN |")
for k in keys:
    vals = [get.get((i,) + k) for i in ["M", "P", "Q", "R", "I", "flash", "cudnn"]]
    M, I, fa, cd = vals[0], vals[4], vals[5], vals[6]
    r = lambda a, b: f"{a / b:.2f}" if a and b else "-"
    print(f"| {k[0]} | {'yes' if k[1] else 'no'} | {k[2]} | " + " | ".join(fmt(x).strip() for x in vals)
          + f" | {r(I, M)} | {r(I, fa)} | {r(I, cd)} |")
