"""The variants (window, softcap, ALiBi, sinks) and varlen through the Python API, on numpy.

Every result is checked against conftest's float64 reference, written from
docs/VARIANTS.md without the library, and against the library's own oracle
(backend="cpu_reference"). Outputs given by the caller are NaN-poisoned first.
"""

import numpy as np
import pytest

import flashtile
from conftest import (max_rel_error, random_case, reference_attention,
                      reference_attention_varlen)

CPU_BACKENDS = [name for name, b in flashtile.backends().items() if b.device == "cpu"]


def slopes(rng, *shape):
    return rng.uniform(0.05, 0.5, shape).astype(np.float32)


def sink_logits(rng, heads):
    return rng.uniform(-1.0, 2.0, heads).astype(np.float32)


def check(out, lse, ref_out, ref_lse):
    assert max_rel_error(out, ref_out) <= 1e-5
    assert max_rel_error(lse, ref_lse) <= 1e-5


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim): seqlen_q < seqlen_k, >, ==, GQA.
SHAPES = [(2, 17, 40, 4, 2, 32), (1, 33, 20, 3, 1, 24), (2, 29, 29, 2, 2, 16)]

VARIANTS = {
    "window": dict(window=(5, 3)),
    "window_left": dict(window=(7, -1)),
    "window_right": dict(window=(-1, 2)),
    "causal_window": dict(causal=True, window=(6, 0)),
    "softcap": dict(softcap=0.9),
    "alibi": dict(alibi_slopes="heads"),
    "alibi_per_batch": dict(alibi_slopes="batch_heads"),
    "sinks": dict(sinks=True),
    "everything": dict(causal=True, window=(9, 0), softcap=1.5, alibi_slopes="batch_heads",
                       sinks=True, scale=0.3),
}


def make_options(rng, batch, heads, variant):
    options = dict(variant)
    if options.get("alibi_slopes") == "heads":
        options["alibi_slopes"] = slopes(rng, heads)
    elif options.get("alibi_slopes") == "batch_heads":
        options["alibi_slopes"] = slopes(rng, batch, heads)
    if options.get("sinks"):
        options["sinks"] = sink_logits(rng, heads)
    return options


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_variant_matches_reference(rng, shape, variant):
    q, k, v = random_case(rng, *shape)
    options = make_options(rng, shape[0], shape[3], variant)
    ref_out, ref_lse = reference_attention(q, k, v, **options)
    out = np.full(q.shape, np.nan, dtype=np.float32)
    result, lse = flashtile.attention(q, k, v, out=out, return_lse=True, **options)
    assert result is out and lse.shape == (shape[0], shape[3], shape[1])
    check(out, lse, ref_out, ref_lse)
    oracle_out, oracle_lse = flashtile.attention(q, k, v, return_lse=True,
                                                 backend="cpu_reference", **options)
    check(oracle_out, oracle_lse, ref_out, ref_lse)
    assert flashtile.plan(q, k, v, **options) in CPU_BACKENDS


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_variants_in_half_precision(rng, dtype):
    if dtype == "bfloat16":
        np_dtype = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
        eps = 2.0 ** -7
    else:
        np_dtype, eps = np.dtype(np.float16), 2.0 ** -10
    q, k, v = random_case(rng, 2, 21, 35, 4, 2, 32, dtype=np_dtype)
    options = make_options(rng, 2, 4, VARIANTS["everything"])
    out, lse = flashtile.attention(q, k, v, return_lse=True, **options)
    assert out.dtype == np_dtype
    ref_out, ref_lse = reference_attention(q, k, v, **options)
    # The CPU backends compute in fp32 or wider and round once on output.
    assert max_rel_error(out, ref_out) <= 4 * eps
    assert max_rel_error(lse, ref_lse) <= 1e-5


def test_window_zero_sees_the_diagonal_key_only(rng):
    # window (0, 0): query i sees key i + Sk - Sq alone, so its output is that value row.
    q, k, v = random_case(rng, 1, 6, 9, 2, 2, 8)
    out = flashtile.attention(q, k, v, window=(0, 0))
    np.testing.assert_allclose(out, v[:, 3:], rtol=1e-6)


def test_causal_overrides_window_right(rng):
    q, k, v = random_case(rng, 1, 12, 12, 2, 1, 16)
    expected = flashtile.attention(q, k, v, window=(4, 0))
    np.testing.assert_array_equal(flashtile.attention(q, k, v, causal=True, window=(4, 7)),
                                  expected)
    np.testing.assert_array_equal(flashtile.attention(q, k, v, causal=True, window=(4, -5)),
                                  expected)


def test_sink_alone_gives_zero_output_and_the_sink_as_lse(rng):
    # Causal with 5 queries and 3 keys: queries 0 and 1 see no key; with a sink, their
    # denominator is e^sink alone, so out = 0 and lse = sink exactly.
    q, k, v = random_case(rng, 1, 5, 3, 2, 2, 16)
    sinks = np.array([0.25, -1.5], dtype=np.float32)
    out, lse = flashtile.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    assert np.all(out[:, :2] == 0.0)
    np.testing.assert_array_equal(lse[0, :, :2], np.repeat(sinks[:, None], 2, axis=1))
    check(out, lse, *reference_attention(q, k, v, causal=True, sinks=sinks))
    # Without the sink, the same rows are empty: 0 and -inf.
    out, lse = flashtile.attention(q, k, v, causal=True, return_lse=True)
    assert np.all(out[:, :2] == 0.0) and np.all(np.isneginf(lse[:, :, :2]))


def test_sinks_lower_every_weight(rng):
    # A sink of logit s scales row i's output by 1 / (1 + e^(s - lse_i)).
    q, k, v = random_case(rng, 2, 7, 11, 4, 2, 16)
    sinks = sink_logits(rng, 4)
    plain, plain_lse = flashtile.attention(q, k, v, return_lse=True)
    sunk, sunk_lse = flashtile.attention(q, k, v, sinks=sinks, return_lse=True)
    factor = 1.0 / (1.0 + np.exp(sinks[None, :, None] - plain_lse))          # (B, H, Sq)
    np.testing.assert_allclose(sunk, plain * factor.transpose(0, 2, 1)[..., None], rtol=2e-5,
                               atol=1e-6)
    np.testing.assert_allclose(sunk_lse, np.logaddexp(plain_lse, sinks[None, :, None]),
                               rtol=1e-5)


def test_strided_parameters_are_read_in_place(rng):
    q, k, v = random_case(rng, 2, 9, 13, 4, 2, 16)
    wide = slopes(rng, 2, 8)
    alibi = wide[:, ::2]                    # strides (8, 2)
    sinks = sink_logits(rng, 12)[::3]       # stride 3
    assert not alibi.flags.c_contiguous
    out = flashtile.attention(q, k, v, alibi_slopes=alibi, sinks=sinks)
    ref_out, _ = reference_attention(q, k, v, alibi_slopes=alibi, sinks=sinks)
    assert max_rel_error(out, ref_out) <= 1e-5


# --- refusals: a clear message naming the argument, nothing written ------------------------

def _refused(rng, error, match, **options):
    q, k, v = random_case(rng, 2, 8, 8, 4, 2, 16)
    out = np.full(q.shape, np.nan, dtype=np.float32)
    with pytest.raises(error, match=match):
        flashtile.attention(q, k, v, out=out, **options)
    assert np.all(np.isnan(out))
    with pytest.raises(error, match=match):
        flashtile.plan(q, k, v, **options)


@pytest.mark.parametrize("options,error,match", [
    (dict(alibi_slopes=np.ones(3, np.float32)), ValueError,
     r"alibi_slopes must be shaped \(heads_q\) or \(batch, heads_q\) = \(4,\) or \(2, 4\), "
     r"got \(3,\)"),
    (dict(alibi_slopes=np.ones((1, 4), np.float32)), ValueError,
     r"alibi_slopes must be shaped .* got \(1, 4\)"),
    (dict(alibi_slopes=np.ones((2, 4, 1), np.float32)), ValueError,
     r"alibi_slopes must be shaped .* got 3-D"),
    (dict(alibi_slopes=np.ones(4)), TypeError, r"alibi_slopes\.dtype must be float32, got float64"),
    (dict(alibi_slopes=[0.1] * 4), TypeError, r"alibi_slopes must be a numpy array or a DLPack"),
    (dict(sinks=np.ones((2, 4), np.float32)), ValueError,
     r"sinks must be shaped \(heads_q\) = \(4,\), got \(2, 4\)"),
    (dict(sinks=np.ones(4, np.float16)), TypeError, r"sinks\.dtype must be float32, got float16"),
    (dict(window=(-2, 0)), ValueError, r"window\.left must be -1 \(unbounded\) or >= 0, got -2"),
    (dict(window=(3, -7)), ValueError, r"window\.right must be -1 \(unbounded\) or >= 0, got -7"),
    (dict(window=3), ValueError, r"window must be a pair \(left, right\)"),
    (dict(window=(1, 2, 3)), ValueError, r"window must be a pair \(left, right\)"),
    (dict(window=(1.5, 0)), TypeError, r"window must hold integers"),
    (dict(softcap=-1.0), ValueError, r"softcap must be 0 \(off\) or a positive finite number"),
    (dict(softcap=float("nan")), ValueError, r"softcap must be 0 \(off\) or a positive finite"),
    (dict(window=(3, 0), backend="cpu_standard"), ValueError,
     r"cpu_standard is a journey step .* got window \(3, 0\)"),
])
def test_variant_refusals(rng, options, error, match):
    _refused(rng, error, match, **options)


# --- varlen ---------------------------------------------------------------------------------

def packed_case(rng, lens_q, lens_k, heads_q=4, heads_kv=2, head_dim=16, spare_k=0,
                dtype=np.float32):
    """Packed q (Tq, Hq, D), k, v (Tk + spare_k, Hkv, D) and int32 cu_seqlens."""
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    def make(rows, heads):
        return rng.uniform(-1.0, 1.0, (rows, heads, head_dim)).astype(dtype)
    total_k = int(cu_k[-1]) + spare_k
    return make(int(cu_q[-1]), heads_q), make(total_k, heads_kv), make(total_k, heads_kv), cu_q, cu_k


# Empty sequences (no queries, no keys, neither), length-1 sequences, seqlen_q != seqlen_k.
LENS = ([3, 0, 1, 17, 4, 1, 0, 9], [5, 2, 0, 13, 4, 1, 0, 20])


@pytest.mark.parametrize("variant", [{}, dict(causal=True)] + list(VARIANTS.values()),
                         ids=["full", "causal"] + list(VARIANTS.keys()))
def test_varlen_matches_reference(rng, variant):
    q, k, v, cu_q, cu_k = packed_case(rng, *LENS)
    options = make_options(rng, len(LENS[0]), 4, variant)
    ref_out, ref_lse = reference_attention_varlen(q, k, v, cu_q, cu_k, **options)
    out = np.full(q.shape, np.nan, dtype=np.float32)
    result, lse = flashtile.attention_varlen(q, k, v, cu_q, cu_k, out=out, return_lse=True,
                                             **options)
    assert result is out and lse.shape == (4, q.shape[0]) and lse.dtype == np.float32
    check(out, lse, ref_out, ref_lse)
    oracle = flashtile.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True,
                                        backend="cpu_reference", **options)
    check(*oracle, ref_out, ref_lse)
    assert flashtile.plan_varlen(q, k, v, cu_q, cu_k, **options) in CPU_BACKENDS


def test_varlen_equals_one_dense_call_per_sequence(rng):
    # Masks, ALiBi distances and sinks align per sequence: the packed result of each
    # sequence is the dense result of that sequence alone.
    lens_q, lens_k = [6, 1, 11], [9, 4, 11]
    q, k, v, cu_q, cu_k = packed_case(rng, lens_q, lens_k)
    alibi, sinks = slopes(rng, 3, 4), sink_logits(rng, 4)
    options = dict(causal=True, window=(5, 0), softcap=2.0, sinks=sinks)
    out, lse = flashtile.attention_varlen(q, k, v, cu_q, cu_k, alibi_slopes=alibi,
                                          return_lse=True, **options)
    for b in range(3):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        dense, dense_lse = flashtile.attention(q[None, qs], k[None, ks], v[None, ks],
                                               alibi_slopes=alibi[b], return_lse=True,
                                               **options)
        np.testing.assert_allclose(out[qs], dense[0], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(lse[:, qs], dense_lse[0], rtol=1e-6)


def test_varlen_seqused_k_and_spare_keys(rng):
    # k has 7 spare rows at its end; seqused_k keeps a prefix of each sequence's keys.
    q, k, v, cu_q, cu_k = packed_case(rng, [4, 5, 2], [8, 6, 3], spare_k=7)
    seqused_k = np.array([3, 6, 0], dtype=np.int32)
    for options in (dict(), dict(causal=True), dict(sinks=sink_logits(rng, 4))):
        out, lse = flashtile.attention_varlen(q, k, v, cu_q, cu_k, seqused_k=seqused_k,
                                              return_lse=True, **options)
        check(out, lse, *reference_attention_varlen(q, k, v, cu_q, cu_k, seqused_k=seqused_k,
                                                    **options))
    assert np.all(out[9:] == 0.0)   # sequence 2 uses no key and has no sink here


def test_varlen_max_seqlen_and_half_precision(rng):
    q, k, v, cu_q, cu_k = packed_case(rng, [7, 1, 12], [3, 9, 12], dtype=np.float16)
    out = flashtile.attention_varlen(q, k, v, cu_q, cu_k, 12, 12, causal=True)
    assert out.dtype == np.float16
    ref_out, _ = reference_attention_varlen(q, k, v, cu_q, cu_k, causal=True)
    assert max_rel_error(out, ref_out) <= 4 * 2.0 ** -10


def test_varlen_strided_views(rng):
    # q every other row of a larger packed array; out a window of a poisoned buffer.
    q, k, v, cu_q, cu_k = packed_case(rng, [10, 6], [10, 6])
    wide_q = np.repeat(q, 2, axis=0)[::2]
    buffer = np.full((16, 6, 24), np.nan, dtype=np.float32)
    out = buffer[:, 1:5, 4:20]
    flashtile.attention_varlen(wide_q, k, v, cu_q, cu_k, causal=True, out=out)
    ref_out, _ = reference_attention_varlen(q, k, v, cu_q, cu_k, causal=True)
    assert max_rel_error(out, ref_out) <= 1e-5
    buffer[:, 1:5, 4:20] = 0
    assert np.isnan(buffer).sum() == buffer.size - out.size


def _varlen_refused(rng, error, match, **changes):
    q, k, v, cu_q, cu_k = packed_case(rng, [3, 5], [4, 6])
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    args.update(changes)
    out = np.full(args["q"].shape, np.nan, dtype=np.float32)
    with pytest.raises(error, match=match):
        flashtile.attention_varlen(**args, out=out)
    assert np.all(np.isnan(out))


@pytest.mark.parametrize("changes,error,match", [
    (dict(cu_seqlens_q=np.array([0, 6, 8], np.int32)), ValueError, None),  # fine: the control
    (dict(cu_seqlens_q=np.array([0, 5, 3], np.int32)), ValueError,
     r"cu_seqlens_q must be non-decreasing, but cu_seqlens_q\[2\] = 3 < cu_seqlens_q\[1\] = 5"),
    (dict(cu_seqlens_k=np.array([0, 7, 6], np.int32)), ValueError,
     r"cu_seqlens_k must be non-decreasing"),
    (dict(cu_seqlens_q=np.array([1, 3, 8], np.int32)), ValueError,
     r"cu_seqlens_q\[0\] must be 0, got 1"),
    (dict(cu_seqlens_q=np.array([0, 3, 7], np.int32)), ValueError,
     r"cu_seqlens_q\[2\] must equal the packed rows of q \(q.shape\[0\] = 8\), got 7"),
    (dict(cu_seqlens_k=np.array([0, 4, 11], np.int32)), ValueError,
     r"cu_seqlens_k\[2\] must not exceed the packed rows of k \(k.shape\[0\] = 10\), got 11"),
    (dict(cu_seqlens_k=np.array([-1, 4, 10], np.int32)), ValueError,
     r"cu_seqlens_k\[0\] must be >= 0, got -1"),
    (dict(cu_seqlens_q=np.array([0, 3, 8])), TypeError,
     r"cu_seqlens_q\.dtype must be int32, got int64"),
    (dict(cu_seqlens_k=np.array([0, 4, 10], np.uint32)), TypeError,
     r"cu_seqlens_k\.dtype must be int32, got uint32"),
    (dict(cu_seqlens_q=np.array([[0, 3, 8]], np.int32)), ValueError,
     r"cu_seqlens_q must be 1-D with batch \+ 1 >= 2 entries"),
    (dict(cu_seqlens_q=np.array([0], np.int32)), ValueError,
     r"cu_seqlens_q must be 1-D with batch \+ 1 >= 2 entries"),
    (dict(cu_seqlens_k=np.array([0, 4, 6, 10], np.int32)), ValueError,
     r"cu_seqlens_k must have batch \+ 1 \(as cu_seqlens_q\) = 3 entries, got 4"),
    (dict(cu_seqlens_q=np.array([0, 0, 3, 3, 8], np.int32)[::2]), ValueError,
     r"cu_seqlens_q must be contiguous"),
    (dict(cu_seqlens_q=[0, 3, 8]), TypeError, r"cu_seqlens_q must be a numpy array or a DLPack"),
    (dict(seqused_k=np.array([4, 7], np.int32)), ValueError,
     r"seqused_k\[1\] must lie in \[0, 6\] \(the keys of sequence 1\), got 7"),
    (dict(seqused_k=np.array([4], np.int32)), ValueError, r"seqused_k must have batch"),
    (dict(max_seqlen_q=4), ValueError,
     r"max_seqlen_q \(4\) is smaller than the longest sequence \(5\)"),
    (dict(max_seqlen_k=5), ValueError,
     r"max_seqlen_k \(5\) is smaller than the longest sequence \(6\)"),
    (dict(max_seqlen_k=5.0), TypeError, r"max_seqlen_k must be an integer or None"),
    (dict(alibi_slopes=np.ones((3, 4), np.float32)), ValueError,
     r"alibi_slopes must be shaped \(heads_q\) or \(batch, heads_q\) = \(4,\) or \(2, 4\)"),
    (dict(window=(-3, 0)), ValueError, r"window\.left must be -1"),
])
def test_varlen_refusals(rng, changes, error, match):
    if match is None:  # the unchanged call runs: the refusals below are about their change
        q, k, v, cu_q, cu_k = packed_case(rng, [3, 5], [4, 6])
        flashtile.attention_varlen(q, k, v, cu_q, cu_k)
        return
    _varlen_refused(rng, error, match, **changes)


def test_varlen_shape_messages_name_the_packed_dimensions(rng):
    q, k, v, cu_q, cu_k = packed_case(rng, [3, 5], [4, 6])
    with pytest.raises(ValueError, match=r"k\.shape\[2\] must equal q head_dim \(expected 16, got 8\)"):
        flashtile.attention_varlen(q, k[..., :8], v, cu_q, cu_k)
    with pytest.raises(ValueError, match=r"v\.shape\[0\] must equal k seqlen \(expected 10, got 9\)"):
        flashtile.attention_varlen(q, k, v[:9], cu_q, cu_k)
    with pytest.raises(ValueError, match=r"q\.strides\[2\] \(head_dim stride\) must be 1, got 2"):
        flashtile.attention_varlen(q[..., ::2], k[..., ::2], v[..., ::2], cu_q, cu_k)
    with pytest.raises(ValueError, match=r"q must be 3-D \(total_tokens, heads, head_dim\), got 4-D"):
        flashtile.attention_varlen(q[None], k, v, cu_q, cu_k)
    with pytest.raises(ValueError, match=r"out\.shape\[1\] must equal the q dimension"):
        flashtile.attention_varlen(q, k, v, cu_q, cu_k, out=np.empty((8, 3, 16), np.float32))
