#!/usr/bin/env python3
"""TFLOP/s against seqlen, one line per backend/peer, from bench/peers.py's peers.json.

One PNG per dtype, with a panel per (head_dim, causal).

  python3 bench/plot.py bench/results/peers.json --out bench/results
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("peers_json")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    with open(args.peers_json) as f:
        data = json.load(f)
    rows, env = data["rows"], data.get("env", {})
    os.makedirs(args.out, exist_ok=True)
    for dtype in sorted({r["dtype"] for r in rows}):
        sub = [r for r in rows if r["dtype"] == dtype]
        dims = sorted({r["head_dim"] for r in sub})
        fig, axes = plt.subplots(len(dims), 2, figsize=(11, 3.6 * len(dims)), squeeze=False,
                                 sharex=True)
        for i, d in enumerate(dims):
            for j, causal in enumerate([False, True]):
                ax = axes[i][j]
                for impl in sorted({r["impl"] for r in sub}):
                    pts = sorted((r["seqlen"], r["tflops"]) for r in sub
                                 if r["impl"] == impl and r["head_dim"] == d
                                 and r["causal"] == causal)
                    if pts:
                        style = "-o" if impl.startswith("flashtile") else "--."
                        ax.plot([x for x, _ in pts], [y for _, y in pts], style, label=impl)
                ax.set_xscale("log", base=2)
                ax.set_title(f"{dtype} d={d} {'causal' if causal else 'non-causal'}")
                ax.set_ylabel("TFLOP/s")
                ax.grid(True, alpha=0.3)
                if i == len(dims) - 1:
                    ax.set_xlabel("seqlen (16k tokens per batch)")
        axes[0][0].legend(fontsize=8)
        fig.suptitle(f"forward attention, {env.get('device', '')}, torch {env.get('torch', '')}")
        fig.tight_layout()
        path = os.path.join(args.out, f"peers_{dtype}.png")
        fig.savefig(path, dpi=110)
        print("wrote", path)


if __name__ == "__main__":
    main()
