#!/usr/bin/env python3
"""A/B table of bwd4b's call: ab_{M1,N1,N2,M2}.json (flashtile bench --sweep --pass bwd) in DIR.
Prints, per point, ms and TFLOP/s of each run and N's time change over M (negative = faster)."""
import json, os, sys
d = sys.argv[1] if len(sys.argv) > 1 else "."
runs = {}
for tag in ["M1", "N1", "N2", "M2"]:
    p = os.path.join(d, f"ab_{tag}.json")
    if os.path.exists(p):
        try:
            runs[tag] = {(r["head_dim"], r["causal"], r["seqlen_q"]): r for r in json.load(open(p))}
        except Exception as e:  # a cut run
            print(f"# {p}: {e}")
keys = sorted({k for r in runs.values() for k in r}, key=lambda k: (k[0], k[1], k[2]))
def cell(tag, k):
    r = runs.get(tag, {}).get(k)
    return (f"{r['ms']:.4f} ({r['tflops']:.1f})", r["ms"]) if r else ("-", None)
def pct(a, b):  # N over M in time: (N - M) / M
    return f"{100 * (a - b) / b:+.1f}%" if a and b else "-"
print("| d | causal | seqlen | M1 ms (TFLOP/s) | N1 | N2 | M2 | N1 vs M1 (time) | N2 vs M2 (time) | M2 vs M1 | N2 vs N1 |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for k in keys:
    c = {t: cell(t, k) for t in ["M1", "N1", "N2", "M2"]}
    print(f"| {k[0]} | {'yes' if k[1] else 'no'} | {k[2]} | " + " | ".join(c[t][0] for t in ["M1", "N1", "N2", "M2"]) +
          f" | {pct(c['N1'][1], c['M1'][1])} | {pct(c['N2'][1], c['M2'][1])} | {pct(c['M2'][1], c['M1'][1])} | {pct(c['N2'][1], c['N1'][1])} |")
