#!/usr/bin/env python3
"""flashtile beside PyTorch SDPA's kernels on the field's forward grid, in one run.

Grid (../shared/ANCHORS.md): 16k tokens (batch = 16384 / seqlen), hidden 2048
(heads = 2048 / head_dim), seqlen 512..16k, head_dim 64/128/256, causal and not,
bf16 and fp16, or fp32 (--dtype f32: TF32 matmul is switched off in torch, so the peers
compute in fp32; only EFFICIENT_ATTENTION and MATH take fp32). FLOPs = 4·b·s²·h·d, halved
when causal.

Peers: torch.nn.functional.scaled_dot_product_attention restricted with
torch.nn.attention.sdpa_kernel to FLASH_ATTENTION (FlashAttention-2), CUDNN_ATTENTION and
EFFICIENT_ATTENTION, each timed with triton.testing.do_bench (median, after its warm-up),
or CUDA events when Triton is missing. Inputs are BSHD in memory, as flashtile's are.

flashtile: the CLI's `flashtile bench --sweep ... --output F.json` (every row checked
against the oracle on sampled rows before it is timed). Prints the ratio table and writes
peers.csv / peers.json to --out (peers_bwd.* / peers_fwdbwd.* for the other passes).

--pass bwd times the backward alone: the peers' torch.autograd.grad of one SDPA output
(retain_graph, so the forward runs once, outside the timing) and `flashtile bench --pass
bwd`; FLOPs 2.5x the forward's, as FlashAttention counts them. --pass fwdbwd times the
forward and the backward together (3.5x).

  python3 bench/peers.py --cli build/tools/flashtile --out bench/results
  python3 bench/peers.py --pass bwd --head-dims 64,128 --dtype bf16 --seqlens 1024,4096,16384
  python3 bench/peers.py --batch-heads 1,1 --seqlens 1024,4096 --backends cuda_mma,cuda_sm90
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_timing import attention_flops as flops
from torch_timing import cuda_event_median_ms

TOKENS, HIDDEN = 16384, 2048
PEERS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,  # unfused matmul-softmax-matmul (opt-in: --peers ...,math)
}
DEFAULT_PEERS = ["flash", "cudnn", "efficient"]
TORCH_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
JSON_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "bf16": "bf16", "f16": "f16",
               "f32": "f32"}
# FLOPs of each pass in units of the forward's (FlashAttention's convention).
PASS_FLOPS = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}


def median_ms(fn, warmup_ms, rep_ms):
    try:
        import triton.testing

        return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    except ImportError:
        return cuda_event_median_ms(fn)


def peer_timing():
    """How median_ms times the peers, in the words of `flashtile bench`'s timing field: do_bench
    queues its calls; without triton each call is synchronised (cuda_event_median_ms)."""
    try:
        import triton.testing  # noqa: F401

        return "queued"
    except ImportError:
        return "isolated"


def run_peers(args, on_row=lambda rows: None):
    rows = []
    for dtype in args.dtype:
        for d in args.head_dims:
            for causal in args.causal:
                for s in args.seqlens:
                    b, h = args.batch_heads or (TOKENS // s, HIDDEN // d)
                    gen = torch.Generator(device="cuda").manual_seed(0)

                    def make():
                        # BSHD storage, viewed as SDPA's (b, h, s, d).
                        x = torch.rand(b, s, h, d, device="cuda", dtype=TORCH_DTYPES[dtype],
                                       generator=gen) * 2 - 1
                        return x.transpose(1, 2)

                    q, k, v = make(), make(), make()
                    if args.pass_ != "fwd":
                        q, k, v = (x.requires_grad_() for x in (q, k, v))
                        dout = make()
                    for name in args.peers:
                        with sdpa_kernel([PEERS[name]]):
                            sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            try:
                                if args.pass_ == "fwd":
                                    fn = sdpa
                                elif args.pass_ == "bwd":
                                    out = sdpa()
                                    fn = lambda: torch.autograd.grad(out, (q, k, v), dout,
                                                                     retain_graph=True)
                                else:
                                    fn = lambda: torch.autograd.grad(sdpa(), (q, k, v), dout)
                                ms = median_ms(fn, args.warmup_ms, args.rep_ms)
                            except RuntimeError as e:  # backend refuses the shape
                                print(f"  {name} refused {dtype} d={d} s={s}: {str(e)[:80]}",
                                      file=sys.stderr)
                                continue
                            finally:
                                out = None
                        tf = (PASS_FLOPS[args.pass_] * flops(b, s, h, d, causal)
                              / (ms * 1e-3) / 1e12)
                        rows.append(dict(impl=name, dtype=dtype, head_dim=d, causal=causal,
                                         seqlen=s, batch=b, heads=h, ms=ms, tflops=tf,
                                         timing=peer_timing()))
                        print(f"{name:10s} {dtype:4s} d={d:<3d} {'causal' if causal else 'full':6s} "
                              f"s={s:<6d} {ms:8.3f} ms {tf:7.1f} TFLOP/s", file=sys.stderr,
                              flush=True)
                        on_row(rows)
                    del q, k, v
                    dout = None
                    torch.cuda.empty_cache()
    return rows


def run_flashtile(args, on_row=lambda rows: None):
    rows = []
    # One sweep per dtype, or with --write-each-row one CLI call per grid point, so that a run
    # cut short keeps every point it finished.
    if args.write_each_row or args.batch_heads:
        sweeps = [(dtype, [d], [c], [s]) for dtype in args.dtype for d in args.head_dims
                  for c in args.causal for s in args.seqlens]
    else:
        sweeps = [(dtype, args.head_dims, args.causal, args.seqlens) for dtype in args.dtype]
    for dtype, head_dims, causals, seqlens in sweeps:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "flashtile.json")
            cmd = [args.cli, "bench", "--dtype", dtype, "--backends", ",".join(args.backends),
                   "--pass", args.pass_, "--output", out]
            if args.batch_heads:  # one point: (batch, heads) as given
                cmd += ["--batch", str(args.batch_heads[0]), "--heads", str(args.batch_heads[1]),
                        "--seqlen", str(seqlens[0]), "--head-dim", str(head_dims[0])]
                cmd += ["--causal"] if causals[0] else []
            else:
                cmd += ["--sweep", "--sweep-head-dims", ",".join(map(str, head_dims)),
                        "--sweep-seqlens", ",".join(map(str, seqlens)),
                        "--sweep-causal", ",".join("1" if c else "0" for c in causals)]
            if args.cli_repeats:  # fewer timed calls where a device call is short of time
                cmd += ["--repeats", str(args.cli_repeats), "--warmup", str(args.cli_warmup)]
            if args.cli_isolated:
                cmd += ["--isolated"]
            print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True)
            with open(out) as f:
                for r in json.load(f):
                    s, d = r["seqlen_q"], r["head_dim"]
                    if s not in args.seqlens or d not in args.head_dims:
                        continue
                    rows.append(dict(impl="flashtile:" + r["backend"],
                                     dtype=JSON_DTYPES.get(r["dtype"], r["dtype"]), head_dim=d,
                                     causal=bool(r["causal"]), seqlen=s, batch=r["batch"],
                                     heads=r["heads"], ms=r["ms"], tflops=r["tflops"],
                                     max_abs_err=r.get("max_abs_err"),
                                     timing=r.get("timing", "isolated")))
        on_row(rows)
    return rows


def ratio_table(rows, ours):
    """One row per grid point: every flashtile backend in `ours` and the peers, TFLOP/s, and
    each backend's ratio to FlashAttention-2 and cuDNN."""
    index = {(r["impl"], r["dtype"], r["head_dim"], r["causal"], r["seqlen"]): r for r in rows}
    keys = sorted({(r["dtype"], r["head_dim"], r["causal"], r["seqlen"]) for r in rows})
    names = [o.split(":", 1)[1] for o in ours]
    fmt = lambda x, w, p=1: f"{x:{w}.{p}f}" if x is not None else " " * (w - 1) + "-"
    lines = [f"{'dtype':5s} {'d':>3s} {'causal':6s} {'seqlen':>6s} | "
             + " ".join(f"{n:>9s}" for n in names)
             + f" {'flash':>7s} {'cudnn':>7s} {'effic':>7s} | "
             + " ".join(f"{n[-4:] + '/fa':>7s} {n[-4:] + '/cd':>7s} {n[-4:] + '/ef':>7s}"
                        for n in names) + "   (TFLOP/s)"]
    table = []
    for key in keys:
        get = lambda impl: index.get((impl,) + key, {}).get("tflops")
        fa, cd, ef = get("flash"), get("cudnn"), get("efficient")
        row = dict(dtype=key[0], head_dim=key[1], causal=key[2], seqlen=key[3], flash=fa,
                   cudnn=cd, efficient=ef)
        ratios = []
        for impl, name in zip(ours, names):
            ft = get(impl)
            row[name] = ft
            row[name + "_vs_flash"] = ft / fa if ft and fa else None
            row[name + "_vs_cudnn"] = ft / cd if ft and cd else None
            row[name + "_vs_efficient"] = ft / ef if ft and ef else None
            ratios += [row[name + "_vs_flash"], row[name + "_vs_cudnn"], row[name + "_vs_efficient"]]
        table.append(row)
        lines.append(f"{key[0]:5s} {key[1]:3d} {'yes' if key[2] else 'no':6s} {key[3]:6d} | "
                     + " ".join(fmt(row[n], 9) for n in names)
                     + f" {fmt(fa, 7)} {fmt(cd, 7)} {fmt(ef, 7)} | "
                     + " ".join(fmt(r, 7, 2) for r in ratios))
    return "\n".join(lines), table


def main():
    ints = lambda s: [int(x) for x in s.split(",")]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dtype", type=lambda s: s.split(","), default=["bf16", "f16"])
    p.add_argument("--head-dims", type=ints, default=[64, 128, 256])
    p.add_argument("--seqlens", type=ints, default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--causal", type=lambda s: [bool(int(x)) for x in s.split(",")],
                   default=[False, True])
    p.add_argument("--peers", type=lambda s: s.split(","), default=DEFAULT_PEERS)
    p.add_argument("--backends", type=lambda s: s.split(","), default=["cuda_mma"],
                   help="flashtile backends to time beside the peers, comma-separated")
    p.add_argument("--cli", default="build/tools/flashtile",
                   help="path of the flashtile CLI (uses `bench --sweep`)")
    p.add_argument("--warmup-ms", type=float, default=25)
    p.add_argument("--rep-ms", type=float, default=75)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--pass", dest="pass_", choices=list(PASS_FLOPS), default="fwd",
                   help="fwd (default), bwd (the backward alone) or fwdbwd")
    p.add_argument("--tag", default="", help="suffix of the output files (peers<tag>.json/.csv)")
    p.add_argument("--cli-repeats", type=int, default=0,
                   help="timed calls per point for the CLI (default: the CLI's own, 20)")
    p.add_argument("--cli-warmup", type=int, default=1,
                   help="untimed calls per point for the CLI, with --cli-repeats")
    p.add_argument("--cli-isolated", action="store_true",
                   help="time flashtile's calls each from an idle GPU (bench --isolated), as "
                        "the CLI did before the seventeenth session; by default they are queued "
                        "back to back, as do_bench times the peers")
    p.add_argument("--batch-heads", type=ints, default=None,
                   help="B,H: every point at batch B and H query heads instead of the field's "
                        "16k tokens and hidden 2048 (e.g. 1,1: one head, too few tiles to fill "
                        "the GPU: the split-KV cases)")
    p.add_argument("--write-each-row", action="store_true",
                   help="rewrite the output files after every row (the CLI then runs one call "
                        "per grid point), so that a run cut short keeps what it measured")
    args = p.parse_args()
    if args.batch_heads and (len(args.batch_heads) != 2 or min(args.batch_heads) < 1):
        p.error("--batch-heads takes two positive integers, B,H")

    os.makedirs(args.out, exist_ok=True)
    # fp32 means fp32: no TF32 in torch's matmuls (the MATH peer) or convolutions.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    env = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__,
               cuda=torch.version.cuda)
    print(f"device {env['device']}, torch {env['torch']}, CUDA {env['cuda']}", file=sys.stderr)
    stem = ("peers" if args.pass_ == "fwd" else "peers_" + args.pass_) + args.tag
    ours = ["flashtile:" + b for b in args.backends]

    def write_outputs(rows):
        text, table = ratio_table(rows, ours)
        with open(os.path.join(args.out, stem + ".json"), "w") as f:
            json.dump({"env": env, "pass": args.pass_, "rows": rows, "ratios": table}, f, indent=1)
        with open(os.path.join(args.out, stem + ".csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(table[0].keys()))
            w.writeheader()
            w.writerows(table)
        return text

    on_row = write_outputs if args.write_each_row else (lambda rows: None)
    peer_rows = run_peers(args, on_row)
    rows = peer_rows + run_flashtile(args, lambda ft_rows: on_row(peer_rows + ft_rows))
    text = write_outputs(rows)
    if "f32" in args.dtype:
        # fp32: every implementation's own row (the ratio table has no column for MATH).
        with open(os.path.join(args.out, stem + "_rows.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["impl", "dtype", "head_dim", "causal", "seqlen",
                                              "batch", "heads", "ms", "tflops", "max_abs_err",
                                              "timing"])
            w.writeheader()
            w.writerows(rows)
        print(f"torch.backends.cuda.matmul.allow_tf32 = {torch.backends.cuda.matmul.allow_tf32}, "
              f"float32 matmul precision {torch.get_float32_matmul_precision()!r}")
    print(text)


if __name__ == "__main__":
    main()
