"""End-to-end checks of `flashtile run` on .npy files: results against a float64 numpy
reference, and every bad input refused with a clear message and no output written."""
import os
import subprocess
import sys
import tempfile

import numpy as np

FLASHTILE = sys.argv[1]


def reference(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0, alibi=None, sinks=None):
    """float64 attention of one dense batch, written from docs/VARIANTS.md: query i sees key j
    when j - (i + sk - sq) lies in [-left, right] (-1 unbounded, causal: right 0); S = scale*q.k,
    then c*tanh(S/c), then - slope*|i + sk - sq - j|; a sink joins every denominator."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    b, sq, h, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    k = np.repeat(k, h // hkv, axis=2)
    v = np.repeat(v, h // hkv, axis=2)
    s = np.einsum("bshd,bthd->bhst", q, k) * (scale if scale else 1 / np.sqrt(d))
    if softcap:
        s = softcap * np.tanh(s / softcap)
    rel = np.arange(sk)[None, :] - (np.arange(sq)[:, None] + sk - sq)  # j - (i + sk - sq)
    if alibi is not None:
        slopes = np.broadcast_to(np.asarray(alibi, np.float64), (b, h))
        s = s - slopes[:, :, None, None] * np.abs(rel)
    left, right = window
    if causal:
        right = 0
    hidden = np.zeros((sq, sk), bool)
    if left >= 0:
        hidden |= rel < -left
    if right >= 0:
        hidden |= rel > right
    s[:, :, hidden] = -np.inf
    sink = np.full((1, h, 1, 1), -np.inf) if sinks is None else \
        np.asarray(sinks, np.float64)[None, :, None, None] * np.ones((1, 1, sq, 1))
    m = np.maximum(s.max(-1, keepdims=True, initial=-np.inf), sink)  # sk may be 0
    m_safe = np.where(np.isfinite(m), m, 0)
    p = np.exp(s - m_safe)
    l = p.sum(-1, keepdims=True) + np.exp(sink - m_safe)
    lse = np.where(l[..., 0] > 0, np.log(np.maximum(l[..., 0], 1e-300)) + m_safe[..., 0], -np.inf)
    p = np.divide(p, l, out=np.zeros_like(p), where=l > 0)
    return np.einsum("bhst,bthd->bshd", p, v), lse


def reference_varlen(q, k, v, cu_q, cu_k, seqused=None, alibi=None, **kw):
    """The same over a packed batch, sequence by sequence: out (total_q, h, d), lse (h, total_q)."""
    out = np.zeros(q.shape)
    lse = np.zeros((q.shape[1], q.shape[0]))
    for b in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b] + (
            seqused[b] if seqused is not None else cu_k[b + 1] - cu_k[b]))
        if cu_q[b + 1] == cu_q[b]:
            continue
        slopes = None if alibi is None else (alibi[b] if alibi.ndim == 2 else alibi)
        o, l = reference(q[None, qs], k[None, ks], v[None, ks], alibi=slopes, **kw)
        out[qs], lse[:, qs] = o[0], l[0]
    return out, lse


def close(out, lse, ref, ref_lse, tol=1e-5):
    """fp32 rule: normwise relative error of out, LSE within tol*max(1, |lse|), -inf exact."""
    err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-300)
    fin = np.isfinite(ref_lse)
    lse_ok = np.array_equal(np.isinf(lse), np.isinf(ref_lse)) and (
        not fin.any() or np.abs(lse[fin] - ref_lse[fin]).max() <= tol * max(1, np.abs(ref_lse[fin]).max()))
    return err <= tol and lse_ok and np.isfinite(out).all()


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

    # Variants, each checked against the numpy reference, through auto and through the oracle
    # backend (cpu_reference), with the LSE.
    slopes_h = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
    slopes_bh = rng.uniform(0.01, 0.5, (2, 4)).astype(np.float32)
    sinks = np.array([0.3, -1.0, 2.0, 0.0], np.float32)
    np.save("slopes_h.npy", slopes_h)
    np.save("slopes_bh.npy", slopes_bh)
    np.save("sinks.npy", sinks)
    variants = [
        (["--window", "3,-1"], dict(window=(3, -1))),
        (["--window", "-1,1"], dict(window=(-1, 1))),
        (["--window", "2,1", "--causal"], dict(window=(2, 1), causal=True)),
        (["--window", "0,0"], dict(window=(0, 0))),  # the diagonal only; rows past sk see nothing
        (["--softcap", "0.5"], dict(softcap=0.5)),
        (["--alibi", "slopes_h.npy"], dict(alibi=slopes_h)),
        (["--alibi", "slopes_bh.npy", "--causal"], dict(alibi=slopes_bh, causal=True)),
        (["--sinks", "sinks.npy"], dict(sinks=sinks)),
        (["--sinks", "sinks.npy", "--window", "0,0"], dict(sinks=sinks, window=(0, 0))),
        (["--window", "4,2", "--softcap", "1.5", "--alibi", "slopes_bh.npy", "--sinks", "sinks.npy",
          "--scale", "0.4"], dict(window=(4, 2), softcap=1.5, alibi=slopes_bh, sinks=sinks, scale=0.4)),
    ]
    for flags, kw in variants:
        kw = dict(kw)
        causal = kw.pop("causal", False)
        ref, ref_lse = reference(q, k, v, causal, **kw)
        for backend in ("auto", "cpu_reference"):
            r = run("--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "ov.npy", "--lse",
                    "lv.npy", "--device", "cpu", "--backend", backend, *flags)
            ok = r.returncode == 0 and close(np.load("ov.npy"), np.load("lv.npy"), ref, ref_lse)
            expect(ok, f"run {' '.join(flags)} --backend {backend} matches numpy: {r.stderr.strip()}")
    _, lse_diag = reference(q, k, v, False, window=(0, 0))
    expect(np.isinf(lse_diag).any(), "  (the diagonal-only window leaves rows that see nothing)")

    # A packed varlen batch: empty and length-1 sequences, seqused_k, with a window, ALiBi per
    # sequence and sinks; LSE (heads, total_q).
    cu_q = np.array([0, 4, 4, 5, 12], np.int32)
    cu_k = np.array([0, 6, 9, 9, 17], np.int32)
    seqused = np.array([5, 0, 0, 8], np.int32)
    qp = rng.standard_normal((12, 4, 16)).astype(np.float32)
    kp = rng.standard_normal((17, 2, 16)).astype(np.float32)
    vp = rng.standard_normal((17, 2, 16)).astype(np.float32)
    slopes_seq = rng.uniform(0.01, 0.5, (4, 4)).astype(np.float32)
    for name, x in (("qp", qp), ("kp", kp), ("vp", vp), ("cu_q", cu_q), ("cu_k", cu_k),
                    ("seqused", seqused), ("slopes_seq", slopes_seq)):
        np.save(name + ".npy", x)
    packed = ("--q", "qp.npy", "--k", "kp.npy", "--v", "vp.npy", "--cu-seqlens-q", "cu_q.npy",
              "--cu-seqlens-k", "cu_k.npy")
    for flags, kw in [
        ([], {}),
        (["--causal"], dict(causal=True)),
        (["--seqused-k", "seqused.npy", "--window", "2,1", "--alibi", "slopes_seq.npy", "--sinks",
          "sinks.npy"], dict(seqused=seqused, window=(2, 1), alibi=slopes_seq, sinks=sinks)),
        (["--seqused-k", "seqused.npy", "--causal", "--softcap", "0.7"],
         dict(seqused=seqused, causal=True, softcap=0.7)),
    ]:
        ref, ref_lse = reference_varlen(qp, kp, vp, cu_q, cu_k, **kw)
        r = run(*packed, "--out", "op.npy", "--lse", "lp.npy", "--device", "cpu", *flags)
        ok = r.returncode == 0
        if ok:
            out, lse = np.load("op.npy"), np.load("lp.npy")
            ok = out.shape == qp.shape and lse.shape == (4, 12) and close(out, lse, ref, ref_lse)
        expect(ok, f"run varlen {' '.join(flags)} matches numpy: {r.stderr.strip()}")

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
    np.save("slopes_f64.npy", slopes_h.astype(np.float64))
    np.save("slopes_short.npy", slopes_h[:3])
    np.save("slopes_3d.npy", slopes_bh[None])
    np.save("sinks_2d.npy", slopes_bh)
    np.save("cu_q64.npy", cu_q.astype(np.int64))
    np.save("cu_k_short.npy", cu_k[:3])
    np.save("cu_q_float.npy", cu_q.astype(np.float32))
    np.save("cu_q_down.npy", np.array([0, 4, 3, 5, 12], np.int32))
    np.save("cu_q_end.npy", np.array([0, 4, 4, 5, 11], np.int32))
    np.save("seqused_long.npy", np.array([7, 0, 0, 8], np.int32))
    qkv = ("--q", "q.npy", "--k", "k.npy", "--v", "v.npy")
    bad_cases += [
        (qkv + ("--window", "5"), "--window must be L,R"),
        (qkv + ("--window", "a,b"), "--window must be L,R"),
        (qkv + ("--window", "1,-2"), "--window must be L,R"),
        (qkv + ("--softcap", "-1"), "--softcap must be a positive finite number"),
        (qkv + ("--softcap", ""), "--softcap must be a positive finite number"),
        (qkv + ("--alibi", "missing.npy"), "--alibi missing.npy: cannot open"),
        (qkv + ("--alibi", "slopes_f64.npy"), "--alibi slopes_f64.npy: dtype '<f8' is not supported"),
        (qkv + ("--alibi", "slopes_short.npy"), "--alibi slopes_short.npy must be float32 (4,) or (2, 4)"),
        (qkv + ("--alibi", "slopes_3d.npy"), "got float32 (1, 2, 4)"),
        (qkv + ("--alibi", "cu_q.npy"), "--alibi cu_q.npy must be float32"),
        (qkv + ("--sinks", "sinks_2d.npy"), "--sinks sinks_2d.npy must be float32 (4,)"),
        (qkv + ("--cu-seqlens-q", "cu_q.npy"), "--cu-seqlens-q and --cu-seqlens-k go together"),
        (qkv + ("--seqused-k", "seqused.npy"), "--seqused-k needs --cu-seqlens-q"),
        (qkv + ("--cu-seqlens-q", "cu_q.npy", "--cu-seqlens-k", "cu_k.npy"), "must have 3 dimensions"),
        (packed[:6] + ("--cu-seqlens-q", "cu_q64.npy", "--cu-seqlens-k", "cu_k.npy"),
         "'<i8' is not supported"),
        (packed[:6] + ("--cu-seqlens-q", "cu_q_float.npy", "--cu-seqlens-k", "cu_k.npy"),
         "--cu-seqlens-q cu_q_float.npy must be int32"),
        (packed[:6] + ("--cu-seqlens-q", "cu_q.npy", "--cu-seqlens-k", "cu_k_short.npy"),
         "--cu-seqlens-k cu_k_short.npy must be int32 (5,)"),
        (packed[:6] + ("--cu-seqlens-q", "cu_q_down.npy", "--cu-seqlens-k", "cu_k.npy"),
         "cu_seqlens_q must be non-decreasing"),
        (packed[:6] + ("--cu-seqlens-q", "cu_q_end.npy", "--cu-seqlens-k", "cu_k.npy"),
         "cu_seqlens_q[4] must equal the packed rows of q"),
        (packed + ("--seqused-k", "seqused_long.npy"), "seqused_k[0] must lie in [0, 6]"),
        (packed + ("--alibi", "slopes_bh.npy"), "--alibi slopes_bh.npy must be float32 (4,) or (4, 4)"),
    ]

    for args, message in bad_cases:
        r = run(*args, "--out", "existing.npy", "--lse", "existing_lse.npy")
        expect(r.returncode != 0 and message in r.stderr,
               f"refused {' '.join(args)}: {r.stderr.strip()}")
        expect(open("existing.npy", "rb").read() == before and not os.path.exists("existing_lse.npy"),
               "  ... and nothing was written")
    expect(not [f for f in os.listdir(".") if "tmp" in f], "no temporary files left behind")

print(f"{failures} failed")
sys.exit(1 if failures else 0)
