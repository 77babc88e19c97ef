"""Shared helpers for the Python tests: random BSHD cases and the float64 numpy oracle."""

import numpy as np
import pytest


def random_case(rng, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype=np.float32):
    """q, k, v in BSHD, values in [-1, 1) like the C++ tests' cases."""
    def make(seqlen, heads):
        return rng.uniform(-1.0, 1.0, (batch, seqlen, heads, head_dim)).astype(dtype)
    return make(seqlen_q, heads_q), make(seqlen_k, heads_kv), make(seqlen_k, heads_kv)


def reference_attention(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0,
                        alibi_slopes=None, sinks=None):
    """Standard attention in float64 with every variant: (out (B, Sq, Hq, D), lse (B, Hq, Sq)).

    Written from docs/VARIANTS.md, independently of the library: GQA (query head h reads kv
    head h // (Hq / Hkv)); query i sees key j when j - (i + Sk - Sq) lies in [-left, right]
    (-1 unbounded, causal: right = 0); S = scale·q·k, then softcap c·tanh(S/c), then ALiBi
    -slope·|i + Sk - Sq - j|; a sink logit joins every row's denominator and the LSE with no
    value; a row that sees no key and has no sink gives out 0 and lse -inf.
    """
    q, k, v = (np.asarray(x).astype(np.float64) for x in (q, k, v))
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
    k = np.repeat(k, heads_q // heads_kv, axis=2)
    v = np.repeat(v, heads_q // heads_kv, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale                     # (B, H, Sq, Sk)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    rel = np.arange(seqlen_k)[None, :] - (np.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q)
    if alibi_slopes is not None:
        slopes = np.broadcast_to(np.asarray(alibi_slopes, np.float64), (batch, heads_q))
        s = s - slopes[:, :, None, None] * np.abs(rel)
    left, right = window
    if causal:
        right = 0
    visible = np.ones(rel.shape, dtype=bool)                            # (Sq, Sk)
    if left >= 0:
        visible &= rel >= -left
    if right >= 0:
        visible &= rel <= right
    s = np.where(visible, s, -np.inf)
    sink = np.full((batch, heads_q, seqlen_q, 1), -np.inf)
    if sinks is not None:
        sink[:] = np.asarray(sinks, np.float64)[None, :, None, None]
    m = np.maximum(s.max(axis=-1, keepdims=True, initial=-np.inf), sink)
    seen = np.isfinite(m)
    m0 = np.where(seen, m, 0.0)
    p = np.exp(s - m0)
    l = p.sum(axis=-1, keepdims=True) + np.exp(sink - m0)
    out = np.einsum("bhqk,bkhd->bqhd", np.where(seen, p / np.where(seen, l, 1.0), 0.0), v)
    lse = np.where(seen, m0 + np.log(np.where(seen, l, 1.0)), -np.inf)[..., 0]
    return out, lse


def reference_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k=None,
                               alibi_slopes=None, **options):
    """reference_attention per sequence of a packed batch: (out (Tq, Hq, D), lse (Hq, Tq)).

    Sequence b: queries [cu_q[b], cu_q[b+1]), keys [cu_k[b], cu_k[b] + used) with used
    seqused_k[b] or its full length; ALiBi slopes of shape (batch, heads) give row b.
    """
    q, k, v = (np.asarray(x) for x in (q, k, v))
    cu_q, cu_k = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
    out = np.zeros(q.shape, dtype=np.float64)
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    for b in range(len(cu_q) - 1):
        q0, q1 = cu_q[b], cu_q[b + 1]
        k0 = cu_k[b]
        k1 = cu_k[b + 1] if seqused_k is None else k0 + np.asarray(seqused_k)[b]
        if q1 == q0:
            continue
        slopes = alibi_slopes
        if slopes is not None and np.ndim(slopes) == 2:
            slopes = np.asarray(slopes)[b]
        if k1 == k0:  # no key: only a sink can give the row a finite lse (out stays 0)
            if options.get("sinks") is not None:
                lse[:, q0:q1] = np.asarray(options["sinks"], np.float64)[:, None]
            continue
        o, l = reference_attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1],
                                   alibi_slopes=slopes, **options)
        out[q0:q1], lse[:, q0:q1] = o[0], l[0]
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
