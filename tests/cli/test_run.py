"""End-to-end checks of `flashtile run` on .npy files: results against a float64 numpy
reference, and every bad input refused with a clear message and no output written."""
import os
import subprocess
import sys
import tempfile

import numpy as np

FLASHTILE = sys.argv[1]


def reference(q, k, v, causal, scale=None):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    b, sq, h, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    k = np.repeat(k, h // hkv, axis=2)
    v = np.repeat(v, h // hkv, axis=2)
    s = np.einsum("bshd,bthd->bhst", q, k) * (scale if scale else 1 / np.sqrt(d))
    if causal:
        s[:, :, np.arange(sk)[None, :] > np.arange(sq)[:, None] + sk - sq] = -np.inf
    m = s.max(-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0)
    p = np.exp(s - m_safe)
    l = p.sum(-1, keepdims=True)
    lse = np.where(l[..., 0] > 0, np.log(np.maximum(l[..., 0], 1e-300)) + m_safe[..., 0], -np.inf)
    p = np.divide(p, l, out=np.zeros_like(p), where=l > 0)
    return np.einsum("bhst,bthd->bshd", p, v), lse


def run(*args):
    return subprocess.run([FLASHTILE, "run", *args], capture_output=True, text=True)


failures = 0


def expect(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what)
    else:
        print("ok:", what)


with tempfile.TemporaryDirectory() as tmp:
    os.chdir(tmp)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 9, 4, 32)).astype(np.float32)
    k = rng.standard_normal((2, 5, 2, 32)).astype(np.float32)
    v = rng.standard_normal((2, 5, 2, 32)).astype(np.float32)
    for name, x in (("q", q), ("k", k), ("v", v)):
        np.save(name + ".npy", x)
        np.save(name + "16.npy", x.astype(np.float16))

    r = run("--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy", "--lse", "l.npy",
            "--causal", "--device", "cpu")
    expect(r.returncode == 0, "fp32 causal GQA run succeeds: " + r.stderr.strip())
    ref, ref_lse = reference(q, k, v, causal=True)
    out, lse = np.load("o.npy"), np.load("l.npy")
    expect(out.shape == q.shape and out.dtype == np.float32, "output shape and dtype")
    expect(np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max(), "fp32 output matches reference")
    expect(np.array_equal(np.isinf(lse), np.isinf(ref_lse)), "fully masked rows have -inf LSE")
    expect(np.all(out[:, :4] == 0), "fully masked rows output 0 (seqlen_q > seqlen_k, causal)")
    fin = np.isfinite(ref_lse)
    expect(np.abs(lse[fin] - ref_lse[fin]).max() <= 1e-5 * max(1, np.abs(ref_lse[fin]).max()),
           "LSE matches reference")

    r = run("--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "s.npy", "--scale", "0.3",
            "--device", "cpu")
    ref_s, _ = reference(q, k, v, causal=False, scale=0.3)
    expect(r.returncode == 0 and np.abs(np.load("s.npy") - ref_s).max() < 1e-5, "--scale honoured")

    r = run("--q", "q16.npy", "--k", "k16.npy", "--v", "v16.npy", "--out", "o16.npy", "--device", "cpu")
    expect(r.returncode == 0 and np.load("o16.npy").dtype == np.float16, "fp16 round trip")

    # Bad inputs: each must fail with a message and leave the existing output untouched.
    np.save("existing.npy", np.full((1,), 7.0, np.float32))
    before = open("existing.npy", "rb").read()
    np.save("f64.npy", q.astype(np.float64))
    np.save("rank3.npy", q[0])
    np.save("fortran.npy", np.asfortranarray(q))
    open("trunc.npy", "wb").write(open("q.npy", "rb").read()[:300])
    open("garbage.npy", "wb").write(b"not a numpy file at all")
    np.save("k_wrong_d.npy", k[..., :16])
    bad_cases = [
        (("--q", "missing.npy", "--k", "k.npy", "--v", "v.npy"), "cannot open"),
        (("--q", "trunc.npy", "--k", "k.npy", "--v", "v.npy"), "truncated"),
        (("--q", "garbage.npy", "--k", "k.npy", "--v", "v.npy"), "bad magic"),
        (("--q", "f64.npy", "--k", "k.npy", "--v", "v.npy"), "'<f8' is not supported"),
        (("--q", "rank3.npy", "--k", "k.npy", "--v", "v.npy"), "must have 4 dimensions"),
        (("--q", "fortran.npy", "--k", "k.npy", "--v", "v.npy"), "Fortran"),
        (("--q", "q.npy", "--k", "k16.npy", "--v", "v.npy"), "k.dtype must match q.dtype"),
        (("--q", "q.npy", "--k", "k_wrong_d.npy", "--v", "v.npy"), "k.shape[3] must equal q head_dim"),
        (("--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--backend", "nope"), "unknown backend"),
    ]
    for args, message in bad_cases:
        r = run(*args, "--out", "existing.npy", "--lse", "existing_lse.npy")
        expect(r.returncode != 0 and message in r.stderr,
               f"refused {args[1]} {' '.join(args[6:])}: {r.stderr.strip()}")
        expect(open("existing.npy", "rb").read() == before and not os.path.exists("existing_lse.npy"),
               "  ... and nothing was written")
    expect(not [f for f in os.listdir(".") if "tmp" in f], "no temporary files left behind")

print(f"{failures} failed")
sys.exit(1 if failures else 0)
