"""Shared helpers for the Python tests: random BSHD cases and the float64 numpy oracle."""

import numpy as np
import pytest


def random_case(rng, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype=np.float32):
    """q, k, v in BSHD, values in [-1, 1) like the C++ tests' cases."""
    def make(seqlen, heads):
        return rng.uniform(-1.0, 1.0, (batch, seqlen, heads, head_dim)).astype(dtype)
    return make(seqlen_q, heads_q), make(seqlen_k, heads_kv), make(seqlen_k, heads_kv)


def reference_attention(q, k, v, causal=False, scale=None):
    """Standard attention in float64: (out (B, Sq, Hq, D), lse (B, Hq, Sq)).

    GQA: query head h reads kv head h // (Hq / Hkv). Causal aligned bottom-right; a row that
    sees no key gives out 0 and lse -inf.
    """
    q, k, v = (np.asarray(x).astype(np.float64) for x in (q, k, v))
    _, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
    k = np.repeat(k, heads_q // heads_kv, axis=2)
    v = np.repeat(v, heads_q // heads_kv, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale                     # (B, H, Sq, Sk)
    if causal:
        i = np.arange(seqlen_q)[:, None]
        j = np.arange(seqlen_k)[None, :]
        s = np.where(j <= i + seqlen_k - seqlen_q, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    seen = np.isfinite(m)
    p = np.exp(s - np.where(seen, m, 0.0))
    l = p.sum(axis=-1, keepdims=True)
    out = np.einsum("bhqk,bkhd->bqhd", np.where(seen, p / np.where(seen, l, 1.0), 0.0), v)
    lse = np.where(seen, m + np.log(np.where(seen, l, 1.0)), -np.inf)[..., 0]
    return out, lse


def max_rel_error(out, ref):
    """max|out - ref| / max|ref| over finite entries, as flashtile's verify_forward."""
    out = np.asarray(out).astype(np.float64)
    ref = np.asarray(ref).astype(np.float64)
    finite = np.isfinite(ref)
    assert np.array_equal(np.isneginf(out), np.isneginf(ref)), "-inf entries differ"
    diff = np.abs(out[finite] - ref[finite]).max(initial=0.0)
    scale = np.abs(ref[finite]).max(initial=0.0)
    return diff / scale if scale > 0 else diff


@pytest.fixture
def rng():
    return np.random.default_rng(20261201)
