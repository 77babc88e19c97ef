"""Structured cases for cuda_tf32x3's wgmma path through `flashtile run`, beside the mma.sync
kernel (FLASHTILE_TF32X3_PATH=mma) and a float64 numpy reference. Chosen so that a layout
error shows by its pattern in the saved outputs, not only as a large error:
  v_identity: sk = d and V = I, so O = P: a wrong key order in Vᵀ or in P's A fragment
              permutes O's columns;
  kv_identity: K = V = I as well, so O = softmax(scale·Q) row by row: S's operands alone;
  random: q, k, v ~ N(0, 1), sq != sk, causal and not.
Run with FLASHTILE_TF32X3_SPLITS=1 (one head: the backend would split the keys otherwise,
which the wgmma path leaves to the mma.sync kernel).
Usage: python3 bench/tf32x3_sm90_probe.py FLASHTILE_CLI OUT_DIR
"""
import os
import subprocess
import sys

import numpy as np


def reference(q, k, v, causal):
    # (B, S, H, D) float64, one head per query head (no GQA here)
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        i = np.arange(sq)[:, None] + (sk - sq)
        j = np.arange(sk)[None, :]
        s = np.where(j <= i, s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


def main():
    cli, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(7)
    cases = []
    for d in (64, 128):
        eye = np.eye(d, dtype=np.float32)[None, :, None, :]  # (1, d keys, 1 head, d)
        q = rng.standard_normal((1, 64, 1, d)).astype(np.float32)
        k = rng.standard_normal((1, d, 1, d)).astype(np.float32)
        cases.append((f"v_identity_d{d}", q, k, eye.copy(), False))
        cases.append((f"kv_identity_d{d}", q * 4, eye.copy(), eye.copy(), False))
        for causal in (False, True):
            q = rng.standard_normal((1, 200, 2, d)).astype(np.float32)
            k = rng.standard_normal((1, 333, 2, d)).astype(np.float32)
            v = rng.standard_normal((1, 333, 2, d)).astype(np.float32)
            cases.append((f"random_d{d}_{'causal' if causal else 'full'}", q, k, v, causal))
    for name, q, k, v, causal in cases:
        paths = {}
        for arg, a in (("q", q), ("k", k), ("v", v)):
            paths[arg] = os.path.join(out_dir, f"{name}_{arg}.npy")
            np.save(paths[arg], a)
        ref = reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), causal)
        np.save(os.path.join(out_dir, f"{name}_ref.npy"), ref)
        line = [name]
        for kernel in ("auto", "mma"):
            out = os.path.join(out_dir, f"{name}_out_{kernel}.npy")
            env = dict(os.environ, FLASHTILE_TF32X3_PATH=kernel)
            cmd = [cli, "run", "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--out", out,
                   "--backend", "cuda_tf32x3"] + (["--causal"] if causal else [])
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                line.append(f"{kernel}: rc {r.returncode} {r.stderr.strip()[:200]}")
                continue
            o = np.load(out).astype(np.float64)
            err = np.linalg.norm(o - ref) / np.linalg.norm(ref)
            line.append(f"{kernel}: normwise {err:.3g} max|diff| {np.abs(o - ref).max():.3g}")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
