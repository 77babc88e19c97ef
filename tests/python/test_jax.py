"""flashtile.jax: the XLA custom call under jit, eval_shape, vmap and grad, on the CPU (and
on CUDA where JAX has a GPU).

Forward results are checked against conftest's float64 reference (written from
docs/VARIANTS.md without the library); gradients against jax.grad of `jnp_attention` below, a
plain-jnp attention with every variant that shares nothing with flashtile.jax's backward.
"""

import functools
import re
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("jax.ffi", reason=f"jax {jax.__version__} has no jax.ffi")
import jax.numpy as jnp  # noqa: E402

import flashtile  # noqa: E402
import flashtile.jax as ftj  # noqa: E402  (must import when jax is installed: CI builds with it)
from conftest import (max_rel_error, random_case, reference_attention,  # noqa: E402
                      reference_attention_varlen)
from test_variants import VARIANTS, make_options, sink_logits, slopes  # noqa: E402

DTYPES = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}


def jnp_attention(q, k, v, *, causal=False, scale=None, window=(-1, -1), softcap=0.0,
                  alibi_slopes=None, sinks=None, compute_dtype=jnp.float32):
    """Standard attention in plain jnp, every variant, differentiable: (out, lse (B, H, Sq))."""
    q, k, v = (jnp.asarray(x).astype(compute_dtype) for x in (q, k, v))
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = head_dim ** -0.5 if scale is None else scale
    k = jnp.repeat(k, heads_q // heads_kv, axis=2)
    v = jnp.repeat(v, heads_q // heads_kv, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * scale                    # (B, H, Sq, Sk)
    if softcap:
        s = softcap * jnp.tanh(s / softcap)
    rel = jnp.arange(seqlen_k)[None, :] - (jnp.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q)
    if alibi_slopes is not None:
        per_batch = jnp.broadcast_to(jnp.asarray(alibi_slopes), (batch, heads_q))
        s = s - per_batch.astype(compute_dtype)[:, :, None, None] * jnp.abs(rel).astype(
            compute_dtype)
    left, right = window[0], 0 if causal else window[1]
    visible = jnp.ones(rel.shape, dtype=bool)
    if left >= 0:
        visible &= rel >= -left
    if right >= 0:
        visible &= rel <= right
    s = jnp.where(visible, s, -jnp.inf)
    if sinks is not None:  # one more logit per row, with value 0
        sink = jnp.broadcast_to(jnp.asarray(sinks).astype(compute_dtype)[None, :, None, None],
                                (batch, heads_q, seqlen_q, 1))
        s = jnp.concatenate([s, sink], axis=-1)
        v = jnp.concatenate([v, jnp.zeros((batch, 1, heads_q, head_dim), compute_dtype)], 1)
    m = jax.lax.stop_gradient(s.max(axis=-1, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    seen = l > 0
    out = jnp.einsum("bhqk,bkhd->bqhd", jnp.where(seen, p / jnp.where(seen, l, 1.0), 0.0), v)
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)[..., 0]
    return out, lse.astype(jnp.float32)


def to_jax(x, dtype=None):
    x = jnp.asarray(x)
    return x if dtype is None else x.astype(dtype)


def check_forward(out, lse, q, k, v, options, dtype):
    """fp32: relative error <= 1e-5 against the float64 reference; fp16/bf16: FlashAttention's
    rule, max|out - ref| <= 2 max|lowprec - ref| + 1e-5, lowprec = jnp_attention in dtype."""
    as64 = lambda x: np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)
    ref_out, ref_lse = reference_attention(as64(q), as64(k), as64(v), **options)
    assert out.dtype == dtype and lse.dtype == jnp.float32
    assert max_rel_error(lse, ref_lse) <= 1e-5
    if dtype == jnp.float32:
        assert max_rel_error(out, ref_out) <= 1e-5
        return
    low_out, _ = jax.jit(lambda q, k, v: jnp_attention(q, k, v, compute_dtype=dtype,
                                                       **options))(q, k, v)
    bound = 2 * np.abs(as64(low_out) - ref_out).max() + 1e-5
    assert np.abs(as64(out) - ref_out).max() <= bound


def jax_options(options):
    """make_options' numpy arrays as jax arrays (the scalar options stay static)."""
    return {name: to_jax(x) if isinstance(x, np.ndarray) else x for name, x in options.items()}


def split_static(options):
    arrays = {n: x for n, x in options.items() if n in ("alibi_slopes", "sinks")}
    static = {n: x for n, x in options.items() if n not in arrays}
    return arrays, static


# --- jit on the CPU against the oracle --------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES.keys())
@pytest.mark.parametrize("variant", ["full", "causal", *VARIANTS], ids=str)
def test_jit_matches_the_oracle(rng, variant, dtype):
    options = {"full": {}, "causal": {"causal": True}}.get(variant)
    if options is None:
        options = make_options(rng, 2, 4, VARIANTS[variant])
    q, k, v = (to_jax(x, DTYPES[dtype]) for x in random_case(rng, 2, 21, 35, 4, 2, 32))
    arrays, static = split_static(jax_options(options))
    fn = jax.jit(lambda q, k, v, a: ftj.attention(q, k, v, return_lse=True, **a, **static))
    out, lse = fn(q, k, v, arrays)
    assert out.shape == q.shape and lse.shape == (2, 4, 21)
    check_forward(out, lse, q, k, v, options, DTYPES[dtype])


@pytest.mark.parametrize("backend", ["cpu_reference", "cpu_flash", "cpu_standard"])
def test_named_cpu_backends(rng, backend):
    if not flashtile.backends()[backend].available:
        pytest.skip(f"{backend} unavailable: {flashtile.backends()[backend].reason}")
    q, k, v = (to_jax(x) for x in random_case(rng, 1, 30, 30, 2, 1, 16))
    out, lse = jax.jit(lambda q, k, v: ftj.attention(q, k, v, causal=True, return_lse=True,
                                                     backend=backend))(q, k, v)
    check_forward(out, lse, q, k, v, {"causal": True}, jnp.float32)


def test_varlen_jit_matches_the_oracle_for_new_cu_seqlens_without_retracing(rng):
    traces = []

    @jax.jit
    def fn(q, k, v, cu_q, cu_k, used, alibi, sinks):
        traces.append(1)
        return ftj.attention_varlen(q, k, v, cu_q, cu_k, seqused_k=used, causal=True,
                                    window=(6, 0), softcap=2.0, alibi_slopes=alibi,
                                    sinks=sinks, return_lse=True)

    total_q, total_k = 40, 52
    q = rng.uniform(-1, 1, (total_q, 4, 16)).astype(np.float32)
    k, v = (rng.uniform(-1, 1, (total_k, 2, 16)).astype(np.float32) for _ in range(2))
    alibi, sinks = slopes(rng, 3, 4), sink_logits(rng, 4)
    # Three sequences each, one of them empty; keys may stop short of total_k.
    layouts = [([0, 15, 15, 40], [0, 20, 25, 50], [18, 5, 25]),
               ([0, 1, 30, 40], [0, 10, 40, 52], [10, 30, 0])]
    for cu_q, cu_k, used in layouts:
        cu_q, cu_k, used = (np.array(x, np.int32) for x in (cu_q, cu_k, used))
        out, lse = fn(q, k, v, cu_q, cu_k, used, alibi, sinks)
        ref_out, ref_lse = reference_attention_varlen(
            q, k, v, cu_q, cu_k, seqused_k=used, alibi_slopes=alibi, sinks=sinks,
            causal=True, window=(6, 0), softcap=2.0)
        assert out.shape == q.shape and lse.shape == (4, total_q)
        assert max_rel_error(out, ref_out) <= 1e-5
        assert max_rel_error(lse, ref_lse) <= 1e-5
    assert len(traces) == 1


# --- abstract evaluation ------------------------------------------------------------------------

def test_eval_shape_runs_nothing():
    # ShapeDtypeStructs have no data: a kernel run would fail.
    spec = lambda *shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype)
    q, k = spec(3, 100, 8, 64), spec(3, 300, 2, 64)
    out = jax.eval_shape(lambda q, k, v: ftj.attention(q, k, v, causal=True), q, k, k)
    assert (out.shape, out.dtype) == ((3, 100, 8, 64), jnp.bfloat16)
    out, lse = jax.eval_shape(
        lambda q, k, v, s: ftj.attention(q, k, v, sinks=s, return_lse=True), q, k, k,
        spec(8, dtype=jnp.float32))
    assert (out.shape, lse.shape, lse.dtype) == ((3, 100, 8, 64), (3, 8, 100), jnp.float32)
    cu = spec(5, dtype=jnp.int32)
    out, lse = jax.eval_shape(
        lambda q, k, v, cu: ftj.attention_varlen(q, k, v, cu, cu, return_lse=True),
        spec(77, 8, 64), spec(77, 2, 64), spec(77, 2, 64), cu)
    assert (out.shape, lse.shape) == ((77, 8, 64), (8, 77))
    batched = jax.eval_shape(jax.vmap(ftj.attention, in_axes=(0, None, None)),
                             spec(5, 3, 100, 8, 64), k, k)
    assert batched.shape == (5, 3, 100, 8, 64)


# --- vmap ---------------------------------------------------------------------------------------

def ffi_calls(fn, *args):
    return str(jax.make_jaxpr(fn)(*args)).count("ffi_call")


def stacked(fn, *per_slice_args):
    return jnp.stack([fn(*args) for args in zip(*per_slice_args)])


def test_vmap_folds_a_batched_q_with_unbatched_k_v_into_one_call(rng):
    q = to_jax(rng.uniform(-1, 1, (3, 2, 17, 4, 16)).astype(np.float32))
    k, v = (to_jax(x) for x in random_case(rng, 2, 23, 23, 2, 2, 16)[1:])
    alibi = to_jax(slopes(rng, 2, 4))  # (batch, heads), unbatched: repeated per mapped slice
    fn = lambda q: ftj.attention(q, k, v, causal=True, alibi_slopes=alibi)
    batched = jax.jit(jax.vmap(fn))(q)
    assert ffi_calls(jax.vmap(fn), q) == 1
    np.testing.assert_array_equal(batched, stacked(fn, q))
    ref, _ = reference_attention(np.asarray(q[1]), np.asarray(k), np.asarray(v), causal=True,
                                 alibi_slopes=np.asarray(alibi))
    assert max_rel_error(batched[1], ref) <= 1e-5


def test_vmap_over_every_argument_and_a_non_leading_axis(rng):
    qs, ks, vs = (to_jax(np.stack(x)) for x in zip(*[random_case(rng, 2, 9, 14, 4, 2, 8)
                                                     for _ in range(3)]))
    alibi = to_jax(slopes(rng, 3, 4))  # (heads) per mapped slice
    fn = lambda q, k, v, a: ftj.attention(q, k, v, window=(3, 2), alibi_slopes=a,
                                          return_lse=True)
    out, lse = jax.vmap(fn)(qs, ks, vs, alibi)
    assert ffi_calls(jax.vmap(fn), qs, ks, vs, alibi) == 1
    for i in range(3):
        ref_out, ref_lse = reference_attention(*(np.asarray(x[i]) for x in (qs, ks, vs)),
                                               window=(3, 2), alibi_slopes=np.asarray(alibi[i]))
        assert max_rel_error(out[i], ref_out) <= 1e-5 and max_rel_error(lse[i], ref_lse) <= 1e-5
    # in_axes=2 maps over the sequence axis of (batch, seqlen, [mapped], heads, dim) arrays
    moved = jax.vmap(lambda q, k, v: fn(q, k, v, alibi[0])[0], in_axes=2, out_axes=2)(
        *(jnp.moveaxis(x, 0, 2) for x in (qs, ks, vs)))
    np.testing.assert_array_equal(jnp.moveaxis(moved, 2, 0),
                                  jax.vmap(lambda q, k, v: fn(q, k, v, alibi[0])[0])(qs, ks, vs))


def test_nested_vmap_folds_both_axes(rng):
    q = to_jax(rng.uniform(-1, 1, (2, 3, 1, 9, 2, 8)).astype(np.float32))
    k, v = (to_jax(x) for x in random_case(rng, 1, 12, 12, 2, 1, 8)[1:])
    fn = lambda q: ftj.attention(q, k, v, causal=True)
    nested = jax.vmap(jax.vmap(fn))
    assert ffi_calls(nested, q) == 1
    np.testing.assert_array_equal(nested(q), jnp.stack([stacked(fn, row) for row in q]))


def test_vmap_over_sinks_runs_the_slices_in_turn(rng):
    q, k, v = (to_jax(x) for x in random_case(rng, 2, 11, 11, 4, 2, 16))
    sinks = to_jax(np.stack([sink_logits(rng, 4) for _ in range(3)]))
    fn = lambda s: ftj.attention(q, k, v, causal=True, sinks=s)
    np.testing.assert_array_equal(jax.vmap(fn)(sinks), stacked(fn, sinks))


def test_vmap_varlen(rng):
    cu = jnp.array([0, 5, 5, 19], jnp.int32)
    qs = to_jax(rng.uniform(-1, 1, (2, 19, 4, 16)).astype(np.float32))
    k, v = (to_jax(rng.uniform(-1, 1, (19, 2, 16)).astype(np.float32)) for _ in range(2))
    fn = lambda q: ftj.attention_varlen(q, k, v, cu, cu, causal=True)
    batched = jax.vmap(fn)(qs)
    np.testing.assert_array_equal(batched, stacked(fn, qs))
    ref, _ = reference_attention_varlen(np.asarray(qs[1]), np.asarray(k), np.asarray(v),
                                        np.asarray(cu), np.asarray(cu), causal=True)
    assert max_rel_error(batched[1], ref) <= 1e-5


# --- grad ---------------------------------------------------------------------------------------
#
# Which backward runs: the kernels (flashtile::backward as the custom call
# flashtile_attention[_varlen]_backward) where the library serves the call (a gradient into
# lse too, as the call's dlse operand), else the interim jnp reference (differentiated ALiBi slopes,
# a platform without a backward backend). `backward_path` reads it from the lowered program.

GRAD_VARIANTS = {"full": {}, "causal": {"causal": True}, **VARIANTS}
# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim) per dtype, so that every variant
# meets GQA and MQA, seqlen_q < seqlen_k and seqlen_q > seqlen_k.
GRAD_SHAPES = {"float32": (2, 13, 19, 4, 2, 16), "float16": (1, 21, 9, 4, 1, 32),
               "bfloat16": (2, 17, 30, 4, 2, 64)}


def backward_path(fn, *args):
    """"kernels" when the program jax lowers for fn calls flashtile's backward, else
    "reference"; the kernels' program must hold no matrix product (no O(N²) step)."""
    return compiled_with_path(fn, *args)[1]


def out_and_lse_loss(attention, *, static, weights, lse_weights, **kw):
    """fn(q, k, v, arrays): Σ out·weights + Σ lse·lse_weights of one attention call, with
    return_lse among kw. LSE rows of -inf (no key, no sink) have no gradient: they are kept
    out of the loss."""
    def fn(q, k, v, a):
        out, lse = attention(q, k, v, **a, **static, **kw)
        return jnp.sum(out.astype(jnp.float32) * weights) + jnp.sum(
            jnp.where(jnp.isfinite(lse), lse, 0.0) * lse_weights)
    return fn


def compiled_with_path(fn, *args, hlo=False):
    """jax.jit(fn) compiled for args, its backward_path (and the lowered program's text)."""
    lowered = jax.jit(fn).lower(*args)
    text = lowered.as_text()
    path = "reference"
    if re.search(r"flashtile_attention(_varlen)?_backward", text):
        assert "dot_general" not in text
        path = "kernels"
    return (lowered.compile(), path) + ((text,) if hlo else ())


def normwise(got, want):
    got, want = (np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64) for x in (got, want))
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)


def as64(tree):
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), tree)


def oracle_grad(fn, argnums, args):
    """jax.grad of a plain-jnp loss in float64: the double oracle of these gradients."""
    with jax.enable_x64(True):
        return jax.device_get(jax.jit(jax.grad(fn, argnums))(*as64(args)))


def check_grads(names, got, oracle, lowprec, dtype, extra_bound=None):
    """issue 10's rule: fp32 normwise relative <= 1e-5 against the double oracle; fp16/bf16
    max|g - oracle| <= 2 max|g_lowprec - oracle| + 1e-4, g_lowprec the plain-jnp gradient in
    the input precision (plus extra_bound[name], dsinks' accumulation term, where given)."""
    for name, g, o, low in zip(names, got, oracle, lowprec):
        assert g.shape == o.shape, name
        if dtype == jnp.float32:
            assert normwise(g, o) <= 1e-5, (name, normwise(g, o))
            continue
        o = np.asarray(o, np.float64)
        err = np.abs(np.asarray(jnp.asarray(g).astype(jnp.float32), np.float64) - o).max()
        base = np.abs(np.asarray(jnp.asarray(low).astype(jnp.float32), np.float64) - o).max()
        bound = 2 * base + 1e-4 + (extra_bound or {}).get(name, 0.0)
        assert err <= bound, (name, err, bound)


def sinks_accumulation_bound(sinks, out, lse, dout, dtype, varlen=False):
    """docs/BACKWARD.md's extra dsinks term for 16-bit: 2·u·max_h Σ_rows P_sink·Σ_c|dO·O|
    (a 16-bit backward takes D = dO·out from the rounded out; the rows' errors add up)."""
    u = 2.0 ** -11 if dtype == jnp.float16 else 2.0 ** -8
    out, dout, lse = (np.asarray(x, np.float64) for x in (out, dout, lse))
    row_sum = np.abs(dout * out).sum(-1)                          # (B, S, H) or (T, H)
    if varlen:
        p_sink = np.exp(np.asarray(sinks, np.float64)[:, None] - lse)   # (H, T)
        return 2 * u * (p_sink * row_sum.T).sum(-1).max()
    p_sink = np.exp(np.asarray(sinks, np.float64)[None, :, None] - lse)  # (B, H, S)
    return 2 * u * (p_sink * np.swapaxes(row_sum, 1, 2)).sum((0, 2)).max()


@pytest.mark.parametrize("dtype", DTYPES.keys())
@pytest.mark.parametrize("variant", GRAD_VARIANTS, ids=str)
def test_kernel_grad_matches_the_double_oracle(rng, variant, dtype):
    dtype = DTYPES[dtype]
    batch, _, _, heads, _, _ = shape = GRAD_SHAPES[jnp.dtype(dtype).name]
    options = make_options(rng, batch, heads, GRAD_VARIANTS[variant])
    arrays, static = split_static(jax_options(options))
    alibi, sinks = arrays.get("alibi_slopes"), arrays.get("sinks")
    q, k, v = (to_jax(x, dtype) for x in random_case(rng, *shape))
    # The cotangent of out, representable in the dtype: every gradient sees the same dout.
    weights = to_jax(rng.uniform(-1, 1, q.shape).astype(np.float32), dtype).astype(jnp.float32)

    def loss(attention, **kw):  # differentiated in q, k, v (and sinks); the slopes are data
        return lambda q, k, v, sinks: jnp.sum(attention(
            q, k, v, alibi_slopes=alibi, sinks=sinks, **static, **kw).astype(
                jnp.float32) * weights)

    plain = lambda **kw: lambda *a, **o: jnp_attention(*a, **o, **kw)[0]
    argnums = (0, 1, 2, 3) if sinks is not None else (0, 1, 2)
    args = (q, k, v, sinks)
    compiled, path = compiled_with_path(jax.grad(loss(ftj.attention), argnums), *args)
    assert path == "kernels"
    got = compiled(*args)
    oracle = oracle_grad(loss(plain(compute_dtype=jnp.float64)), argnums, args)
    lowprec = got if dtype == jnp.float32 else jax.jit(jax.grad(
        loss(plain(compute_dtype=dtype)), argnums))(*args)
    assert all(g.dtype == x.dtype for g, x in zip(got, args))
    extra = None
    if sinks is not None and dtype != jnp.float32:
        with jax.enable_x64(True):
            out64, lse64 = jax.jit(lambda *a: jnp_attention(
                *a, alibi_slopes=alibi, sinks=sinks, compute_dtype=jnp.float64, **static))(
                    *as64((q, k, v)))
        extra = {"dsinks": sinks_accumulation_bound(sinks, out64, lse64, weights, dtype)}
    check_grads(["dq", "dk", "dv", "dsinks"], got, oracle, lowprec, dtype, extra)
    if dtype == jnp.float32:  # the interim reference, given the same out and lse, agrees
        opts = ftj._options("test", static.get("causal", False), static.get("scale"),
                            static.get("window", (-1, -1)), static.get("softcap", 0.0), "auto",
                            False, False)
        def reference(q, k, v, alibi, sinks):
            out, lse = ftj._forward_dense(opts, True, q, k, v, alibi, sinks)
            return ftj._reference_backward(opts, q, k, v, alibi, sinks, out, lse,
                                           weights.astype(dtype), jnp.zeros_like(lse))

        reference = jax.jit(reference)(q, k, v, alibi, sinks)
        for g, r in zip(got, reference[:3] + reference[4:]):
            assert normwise(g, r) <= 1e-5


def test_deterministic_grads_are_bitwise_equal(rng):
    q, k, v = (to_jax(x) for x in random_case(rng, 2, 33, 40, 4, 2, 32))
    sinks = to_jax(sink_logits(rng, 4))
    grads = lambda deterministic: jax.jit(jax.grad(lambda q, k, v, s: jnp.sum(ftj.attention(
        q, k, v, causal=True, sinks=s, deterministic=deterministic) ** 2),
        (0, 1, 2, 3)))(q, k, v, sinks)
    first = grads(True)
    for again in (grads(True), grads(False)):  # both CPU backends are deterministic always
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="deterministic must be True or False"):
        ftj.attention(q, k, v, deterministic=1)


LSE_GRAD_CASES = [(variant, "float32") for variant in GRAD_VARIANTS] + [
    (variant, "bfloat16") for variant in ("causal", "sinks", "everything")]


@pytest.mark.parametrize("variant, dtype", LSE_GRAD_CASES, ids=str)
def test_grad_through_lse_and_slopes_matches_the_double_oracle(rng, variant, dtype):
    # A gradient into the returned lse too: the kernels, which take it as their dlse operand
    # (Options::dlse); differentiated ALiBi slopes: the reference.
    dtype = DTYPES[dtype]
    options = make_options(rng, 2, 4, GRAD_VARIANTS[variant])
    arrays, static = split_static(jax_options(options))
    q, k, v = (to_jax(x, dtype) for x in random_case(rng, 2, 13, 19, 4, 2, 16))
    weights = to_jax(rng.uniform(-1, 1, q.shape).astype(np.float32), dtype).astype(jnp.float32)
    lse_weights = to_jax(rng.uniform(-1, 1, (2, 4, 13)).astype(np.float32))

    loss = functools.partial(out_and_lse_loss, static=static, weights=weights,
                             lse_weights=lse_weights)

    argnums = (0, 1, 2, 3)
    compiled, path = compiled_with_path(jax.grad(loss(ftj.attention, return_lse=True), argnums),
                                        q, k, v, arrays)
    assert path == ("reference" if "alibi_slopes" in arrays else "kernels")
    ours = compiled(q, k, v, arrays)
    oracle = oracle_grad(loss(jnp_attention, compute_dtype=jnp.float64), argnums,
                         (q, k, v, arrays))
    lowprec = ours if dtype == jnp.float32 else jax.jit(jax.grad(
        loss(jnp_attention, compute_dtype=dtype), argnums))(q, k, v, arrays)
    names = sorted(arrays)
    assert set(ours[3]) == set(arrays)
    flat = lambda grads: [*grads[:3], *(grads[3][n] for n in names)]
    extra = None
    if "sinks" in arrays and dtype != jnp.float32:
        with jax.enable_x64(True):
            out64, lse64 = jax.jit(lambda *a: jnp_attention(
                *a, **arrays, compute_dtype=jnp.float64, **static))(*as64((q, k, v)))
        extra = {"sinks": sinks_accumulation_bound(arrays["sinks"], out64, lse64, weights,
                                                    dtype)}
    check_grads(["dq", "dk", "dv", *names], flat(ours), flat(oracle), flat(lowprec), dtype,
                extra)


def assert_grads_close(got, want, tolerance=2e-4):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert max_rel_error(g, w) <= tolerance, (max_rel_error(g, w))


def test_alibi_slopes_get_their_gradient_only_when_differentiated(rng):
    q, k, v = (to_jax(x) for x in random_case(rng, 2, 11, 11, 2, 2, 16))
    alibi = to_jax(slopes(rng, 2, 2))
    loss = lambda attention: lambda q, a: jnp.sum(attention(q, k, v, causal=True,
                                                            alibi_slopes=a)[0] ** 2)
    ours = lambda *a, **kw: (ftj.attention(*a, **kw), None)
    # Not differentiated: the kernels run, and the slopes' cotangent is never formed.
    assert backward_path(jax.grad(loss(ours), 0), q, alibi) == "kernels"
    # Differentiated: the reference runs and gives their exact gradient.
    both = jax.grad(loss(ours), (0, 1))
    assert backward_path(both, q, alibi) == "reference"
    want = jax.jit(jax.grad(loss(jnp_attention), (0, 1)))(q, alibi)
    assert_grads_close(jax.jit(both)(q, alibi), want)
    assert_grads_close([jax.jit(jax.grad(loss(ours), 0))(q, alibi)], want[:1])


def _pretend_no_backward(monkeypatch):
    """Makes the library's answer 'no backend serves the backward' (as on CUDA today)."""
    class NoBackward:
        def __getattr__(self, name):
            return getattr(ftj._ffi, name)

        def backward_refusal(self, *args):
            return "unsupported", "flashtile::backward: pretend: no backend has a backward pass"

    ftj._backward_backend.cache_clear()
    ftj._log_reference.cache_clear()
    monkeypatch.setattr(ftj, "_ffi", NoBackward())


def test_without_a_backward_backend_the_reference_runs_and_says_why(rng, monkeypatch,
                                                                     caplog):
    q, k, v = (to_jax(x) for x in random_case(rng, 1, 12, 15, 4, 2, 16))
    sinks = to_jax(sink_logits(rng, 4))
    loss = lambda q, k, v, s: jnp.sum(ftj.attention(q, k, v, window=(4, 2), sinks=s) ** 2)
    argnums = (0, 1, 2, 3)
    kernels = jax.jit(jax.grad(loss, argnums))(q, k, v, sinks)
    _pretend_no_backward(monkeypatch)
    try:
        with caplog.at_level("WARNING", logger="flashtile.jax"):
            assert backward_path(jax.grad(loss, argnums), q, k, v, sinks) == "reference"
            reference = jax.jit(jax.grad(loss, argnums))(q, k, v, sinks)
        assert "pretend: no backend has a backward pass" in caplog.text
        assert "on cpu" in caplog.text
        for a, b in zip(kernels, reference):
            assert normwise(a, b) <= 1e-5
    finally:
        monkeypatch.undo()
        ftj._backward_backend.cache_clear()
        ftj._log_reference.cache_clear()


def test_the_backward_backend_is_the_libraries_answer(caplog):
    opts = lambda backend: ftj._options("test", True, None, (-1, -1), 0.0, backend, False, False)
    ask = lambda platform, backend: ftj._backward_backend(
        platform, opts(backend), "float32", (1, 8, 2, 16), (1, 8, 2, 16), (), False)
    assert ask("cpu", "auto") == "auto"
    assert ask("cpu", "cpu_reference") == "cpu_reference"
    assert ask("cpu", "cpu_standard") == "auto"  # it has no backward pass: the library's pick
    kind, why = ftj._ffi.backward_refusal("cuda", "bfloat16", (1, 8, 2, 64), (1, 8, 2, 64), [],
                                          False, True, None, -1, -1, 0.0, "auto", False)
    with caplog.at_level("WARNING", logger="flashtile.jax"):
        ftj._backward_backend.cache_clear()  # a cached answer would log nothing
        ftj._log_reference.cache_clear()
        cuda = ftj._backward_backend("cuda", opts("auto"), "bfloat16", (1, 8, 2, 64),
                                     (1, 8, 2, 64), (), False)
    if kind == "unsupported":  # this build or this machine has no CUDA backward
        assert cuda is None and why in caplog.text
    else:
        assert cuda == "auto" and kind == ""


def test_vmap_of_grad_folds_into_one_backward_call(rng):
    qs = to_jax(rng.uniform(-1, 1, (3, 1, 10, 2, 8)).astype(np.float32))
    k, v = (to_jax(x) for x in random_case(rng, 1, 12, 12, 2, 2, 8)[1:])
    alibi = to_jax(slopes(rng, 2))
    ours = jax.grad(lambda q: jnp.sum(ftj.attention(q, k, v, window=(4, 1),
                                                    alibi_slopes=alibi) ** 2))
    want = jax.grad(lambda q: jnp.sum(jnp_attention(q, k, v, window=(4, 1),
                                                    alibi_slopes=alibi)[0] ** 2))
    assert ffi_calls(jax.vmap(ours), qs) == 2  # the forward and the backward, each folded
    assert backward_path(jax.vmap(ours), qs) == "kernels"
    assert_grads_close([jax.jit(jax.vmap(ours))(qs)], [jax.jit(jax.vmap(want))(qs)])


def test_vmap_of_grad_through_lse_folds_dlse_with_the_batch(rng):
    # The lse's cotangent (batch, heads, seqlen_q) leads with the batch as q does: it folds
    # into the one backward call with the tensors.
    qs = to_jax(rng.uniform(-1, 1, (3, 2, 10, 2, 8)).astype(np.float32))
    k, v = (to_jax(x) for x in random_case(rng, 2, 12, 12, 2, 2, 8)[1:])
    lse_weights = to_jax(rng.uniform(-1, 1, (3, 2, 2, 10)).astype(np.float32))

    def loss(attention, **kw):
        def fn(q, w):
            out, lse = attention(q, k, v, causal=True, softcap=2.0, **kw)
            return jnp.sum(out ** 2) + jnp.sum(lse * w)
        return jax.grad(fn)

    ours = loss(ftj.attention, return_lse=True)
    assert ffi_calls(jax.vmap(ours), qs, lse_weights) == 2  # forward and backward, folded
    assert backward_path(jax.vmap(ours), qs, lse_weights) == "kernels"
    assert_grads_close([jax.jit(jax.vmap(ours))(qs, lse_weights)],
                       [jax.jit(jax.vmap(loss(jnp_attention)))(qs, lse_weights)])


def test_vmap_of_grad_with_sinks_runs_the_slices_in_turn(rng):
    # dsinks sums over the batch, so the mapped axis cannot fold into it.
    qs, ks, vs = (to_jax(np.stack(x)) for x in zip(*[random_case(rng, 2, 9, 14, 4, 2, 8)
                                                     for _ in range(3)]))
    sinks = to_jax(sink_logits(rng, 4))
    grad = lambda attention: jax.grad(lambda q, k, v, s: jnp.sum(
        attention(q, k, v, causal=True, sinks=s) ** 2), (0, 1, 2, 3))
    batched = jax.jit(jax.vmap(grad(ftj.attention), in_axes=(0, 0, 0, None)))(qs, ks, vs,
                                                                              sinks)
    want_fn = jax.jit(grad(lambda *a, **kw: jnp_attention(*a, **kw)[0]))
    for i in range(3):
        want = want_fn(qs[i], ks[i], vs[i], sinks)
        assert_grads_close([x[i] for x in batched], want)


VARLEN_CU_Q, VARLEN_CU_K = [0, 7, 12, 12, 20], [0, 9, 12, 20, 30]
VARLEN_USED = [9, 0, 4, 10]  # sequence 1 uses no key (its lse is the sink); 2 has no query


def varlen_case(rng, dtype):
    q = to_jax(rng.uniform(-1, 1, (20, 4, 16)).astype(np.float32), dtype)
    k, v = (to_jax(rng.uniform(-1, 1, (30, 2, 16)).astype(np.float32), dtype) for _ in range(2))
    return q, k, v, to_jax(slopes(rng, 4, 4)), to_jax(sink_logits(rng, 4))


def per_sequence(attention, q, k, v, alibi, sinks, **static):
    """(out (T, H, D) fp32, lse (H, T)) of the packed batch, one plain attention per sequence
    (a row seeing no key: out 0, lse the sink's logit)."""
    rows, lses = [], []
    for b in range(4):
        q0, q1, k0, used = VARLEN_CU_Q[b], VARLEN_CU_Q[b + 1], VARLEN_CU_K[b], VARLEN_USED[b]
        if q1 == q0:
            continue
        if used == 0:
            rows.append(jnp.zeros((q1 - q0,) + q.shape[1:], jnp.float32))
            lses.append(jnp.broadcast_to(sinks[:, None], (q.shape[1], q1 - q0)))
            continue
        out, lse = attention(q[None, q0:q1], k[None, k0:k0 + used], v[None, k0:k0 + used],
                             alibi_slopes=alibi[b], sinks=sinks, **static)
        rows.append(out[0].astype(jnp.float32))
        lses.append(lse[0])
    return jnp.concatenate(rows), jnp.concatenate(lses, axis=1)


@pytest.mark.parametrize("with_lse", [False, True], ids=["out", "out_and_lse"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_varlen_kernel_grad_matches_the_double_oracle_per_sequence(rng, dtype, with_lse):
    dtype = DTYPES[dtype]
    q, k, v, alibi, sinks = varlen_case(rng, dtype)
    cu_q, cu_k, used = (jnp.array(x, jnp.int32) for x in (VARLEN_CU_Q, VARLEN_CU_K, VARLEN_USED))
    static = dict(causal=True, window=(5, 0), softcap=1.5)
    weights = to_jax(rng.uniform(-1, 1, q.shape).astype(np.float32), dtype).astype(jnp.float32)
    lse_weights = to_jax(rng.uniform(-1, 1, (4, 20)).astype(np.float32))
    # Without lse in the loss its cotangent is a symbolic zero: the kernels' plain call.
    loss = lambda out, lse: jnp.sum(out.astype(jnp.float32) * weights) + (
        jnp.sum(lse * lse_weights) if with_lse else 0.0)
    packed = lambda q, k, v, s: loss(*ftj.attention_varlen(
        q, k, v, cu_q, cu_k, seqused_k=used, alibi_slopes=alibi, sinks=s, return_lse=True,
        **static))
    plain = lambda compute: lambda q, k, v, s: loss(*per_sequence(
        lambda *a, **kw: jnp_attention(*a, **kw, compute_dtype=compute), q, k, v, alibi, s,
        **static))
    argnums, args = (0, 1, 2, 3), (q, k, v, sinks)
    compiled, path, hlo = compiled_with_path(jax.grad(packed, argnums), *args, hlo=True)
    assert path == "kernels"
    # The gradient into lse is the backward call's dlse operand: the head dim stays 16.
    assert "x17x" not in hlo
    assert bool(re.search(r"has_dlse = true", hlo)) == with_lse
    got = compiled(*args)
    oracle = oracle_grad(plain(jnp.float64), argnums, args)
    lowprec = got if dtype == jnp.float32 else jax.jit(jax.grad(plain(dtype), argnums))(*args)
    extra = None
    if dtype != jnp.float32:
        _, lse = ftj.attention_varlen(*(x.astype(jnp.float32) for x in (q, k, v)), cu_q, cu_k,
                                      seqused_k=used, alibi_slopes=alibi, sinks=sinks,
                                      return_lse=True, **static)
        out64 = jax.jit(lambda q, k, v: per_sequence(jnp_attention, q, k, v, alibi, sinks,
                                                     **static)[0])(
            *(x.astype(jnp.float32) for x in (q, k, v)))
        extra = {"dsinks": sinks_accumulation_bound(sinks, out64, lse, weights, dtype, True)}
    check_grads(["dq", "dk", "dv", "dsinks"], got, oracle, lowprec, dtype, extra)
    # Key rows no sequence uses (sequence 1's three, sequence 2's last four) get 0.
    for grad in got[1:3]:
        assert not np.any(np.asarray(grad[9:12])) and not np.any(np.asarray(grad[16:20]))


def test_vmap_of_varlen_grad(rng):
    q, k, v, alibi, sinks = varlen_case(rng, jnp.float32)
    qs = jnp.stack([q, q * 0.5])
    cu_q, cu_k, used = (jnp.array(x, jnp.int32) for x in (VARLEN_CU_Q, VARLEN_CU_K, VARLEN_USED))
    grad = jax.grad(lambda q: jnp.sum(ftj.attention_varlen(
        q, k, v, cu_q, cu_k, seqused_k=used, causal=True, sinks=sinks) ** 2))
    assert backward_path(jax.vmap(grad), qs) == "kernels"
    batched = jax.jit(jax.vmap(grad))(qs)
    for i in range(2):
        np.testing.assert_array_equal(batched[i], jax.jit(grad)(qs[i]))


def test_varlen_reference_grad_with_lse_matches_plain_jnp_per_sequence(rng):
    cu_q, cu_k = np.array(VARLEN_CU_Q, np.int32), np.array(VARLEN_CU_K, np.int32)
    used = np.array(VARLEN_USED, np.int32)
    q, k, v, alibi, sinks = varlen_case(rng, jnp.float32)
    static = dict(causal=True, window=(5, 0), softcap=1.5)
    weights = to_jax(rng.uniform(-1, 1, q.shape).astype(np.float32))
    lse_weights = to_jax(rng.uniform(-1, 1, (4, 20)).astype(np.float32))

    def packed_loss(q, k, v, alibi, sinks):
        out, lse = ftj.attention_varlen(q, k, v, cu_q, cu_k, seqused_k=used, alibi_slopes=alibi,
                                        sinks=sinks, return_lse=True, **static)
        return jnp.sum(out * weights) + jnp.sum(lse * lse_weights)

    def per_sequence_loss(q, k, v, alibi, sinks):
        total = 0.0
        for b in range(4):
            q0, q1, k0 = cu_q[b], cu_q[b + 1], cu_k[b]
            if q1 == q0:
                continue
            if used[b] == 0:  # no key: out is 0 and the lse is the sink's logit
                total = total + jnp.sum(sinks[:, None] * lse_weights[:, q0:q1])
                continue
            out, lse = jnp_attention(q[None, q0:q1], k[None, k0:k0 + used[b]],
                                     v[None, k0:k0 + used[b]], alibi_slopes=alibi[b],
                                     sinks=sinks, **static)
            total = total + jnp.sum(out[0] * weights[q0:q1]) + jnp.sum(
                lse[0] * lse_weights[:, q0:q1])
        return total

    argnums = (0, 1, 2, 3, 4)
    assert backward_path(jax.grad(packed_loss, argnums), q, k, v, alibi, sinks) == "reference"
    ours = jax.jit(jax.grad(packed_loss, argnums))(q, k, v, alibi, sinks)
    want = jax.jit(jax.grad(per_sequence_loss, argnums))(q, k, v, alibi, sinks)
    assert_grads_close(ours, want)


def test_backward_errors_carry_the_library_message(rng):
    q, k, v = (to_jax(x) for x in random_case(rng, 1, 8, 8, 2, 2, 16))
    opts = ftj._options("test", False, None, (-1, -1), 0.0, "auto", False, False)
    out, lse = ftj._forward_dense(opts, True, q, k, v, None, None)
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"INVALID_ARGUMENT: flashtile::backward: dout\.shape\[1\] must "
                             r"equal q\.shape\[1\] \(expected 8, got 4\)"):
        jax.block_until_ready(ftj._kernel_backward(opts, q, k, v, None, None, out, lse,
                                                   q[:, :4]))
    cu = jnp.array([0, 8], jnp.int32)
    packed = [x[0] for x in (q, k, v)]
    out, lse = ftj._forward_varlen(opts, True, *packed, cu, cu, None, None, None)
    with pytest.raises(jax.errors.JaxRuntimeError,  # the caller's 3-D dimensions
                       match=r"flashtile::backward_varlen: dout\.shape\[2\] must equal "
                             r"q\.shape\[2\] \(expected 16, got 8\)"):
        jax.block_until_ready(ftj._kernel_backward_varlen(
            opts, *packed, cu, cu, None, None, None, out, lse, packed[0][..., :8]))


# --- errors -------------------------------------------------------------------------------------

def test_a_bad_shape_under_jit_raises_the_library_message(rng):
    q, k, v = (to_jax(x) for x in random_case(rng, 1, 8, 8, 2, 2, 16))
    fn = jax.jit(lambda q, k, v: ftj.attention(q, k, v))
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"INVALID_ARGUMENT: .*k\.shape\[3\] must equal q head_dim "
                             r"\(expected 16, got 8\)"):
        jax.block_until_ready(fn(q, k[..., :8], v))
    with pytest.raises(jax.errors.JaxRuntimeError, match="heads"):
        jax.block_until_ready(fn(q[:, :, :1], k, v))  # 1 query head, 2 kv heads


def test_varlen_errors_name_the_packed_dimensions(rng):
    q = to_jax(rng.uniform(-1, 1, (8, 2, 16)).astype(np.float32))
    cu = jnp.array([0, 8], jnp.int32)
    # The library's 4-D view of a packed tensor has a batch of one in front: the message
    # names the caller's 3-D dimensions, as flashtile.attention_varlen's does.
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"k\.shape\[2\] must equal q head_dim \(expected 16, got 8\)"):
        jax.block_until_ready(ftj.attention_varlen(q, q[..., :8], q[..., :8], cu, cu))
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r": cu_seqlens_k\[1\] must not exceed the packed rows of k "
                             r"\(k\.shape\[0\] = 8\), got 9"):
        jax.block_until_ready(ftj.attention_varlen(q, q, q, cu, jnp.array([0, 9], jnp.int32)))


def test_bad_values_raise_the_library_message(rng):
    q, k, v = (to_jax(x) for x in random_case(rng, 1, 8, 8, 2, 2, 16))
    with pytest.raises(jax.errors.JaxRuntimeError, match="backend must be one of auto, "):
        jax.block_until_ready(ftj.attention(q, k, v, backend="fastest"))
    with pytest.raises(jax.errors.JaxRuntimeError, match="softcap"):
        jax.block_until_ready(jax.jit(lambda q: ftj.attention(q, k, v, softcap=-1.0))(q))
    with pytest.raises(jax.errors.JaxRuntimeError, match="sinks"):
        jax.block_until_ready(ftj.attention(q, k, v, sinks=jnp.zeros(3, jnp.float32)))
    cu = jnp.array([0, 5, 7], jnp.int32)  # ends at 7, total_q is 8
    with pytest.raises(jax.errors.JaxRuntimeError, match="cu_seqlens_q"):
        jax.block_until_ready(jax.jit(lambda q, cu: ftj.attention_varlen(q, q, q, cu, cu))(
            q[0], cu))


def test_tracing_errors_name_the_argument(rng):
    q, k, v = (to_jax(x) for x in random_case(rng, 1, 8, 8, 2, 2, 16))
    with pytest.raises(ValueError, match=r"flashtile.jax.attention: k must be 4-D"):
        ftj.attention(q, k[0], v)
    with pytest.raises(TypeError, match=r"q.dtype must be float32, float16 or bfloat16, "
                                        r"got int32"):
        ftj.attention(q.astype(jnp.int32), k, v)
    with pytest.raises(TypeError, match=r"v.dtype must match q.dtype"):
        ftj.attention(q, k, v.astype(jnp.float16))
    with pytest.raises(TypeError, match=r"sinks.dtype must be float32, got int32"):
        ftj.attention(q, k, v, sinks=jnp.zeros(2, jnp.int32))
    cu = jnp.array([0.0, 8.0])
    with pytest.raises(TypeError, match=r"attention_varlen: cu_seqlens_q.dtype must be int32, "
                                        r"got float32"):
        ftj.attention_varlen(q[0], k[0], v[0], cu, cu)
    with pytest.raises(TypeError, match="causal must be True or False"):
        ftj.attention(q, k, v, causal="yes")
    with pytest.raises(ValueError, match="window must be a pair"):
        ftj.attention(q, k, v, window=3)
    with pytest.raises(TypeError, match="softcap is a static option, but got a traced value"):
        jax.jit(ftj.attention)(q, k, v, softcap=1.0)
    np.testing.assert_array_equal(  # the same call with softcap static
        jax.jit(ftj.attention, static_argnames="softcap")(q, k, v, softcap=1.0),
        ftj.attention(q, k, v, softcap=1.0))


def test_importing_flashtile_does_not_import_jax():
    code = ("import sys, flashtile; assert 'jax' not in sys.modules; "
            "flashtile.jax.attention; assert 'jax' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- CUDA ---------------------------------------------------------------------------------------

def _gpu():
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus or not flashtile.backends()["cuda_mma"].available:
        pytest.skip("needs a JAX GPU and flashtile's CUDA backends")
    return gpus[0]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_jit_vmap_grad(rng, dtype):
    gpu = _gpu()
    options = make_options(rng, 2, 4, VARIANTS["everything"])
    arrays, static = split_static(jax_options(options))
    arrays = jax.device_put(arrays, gpu)
    q, k, v = (jax.device_put(to_jax(x, DTYPES[dtype]), gpu)
               for x in random_case(rng, 2, 70, 130, 4, 2, 64))
    fn = jax.jit(lambda q, k, v, a: ftj.attention(q, k, v, return_lse=True, **a, **static))
    out, lse = fn(q, k, v, arrays)
    assert out.devices() == {gpu}
    check_forward(jax.device_get(out), jax.device_get(lse), *jax.device_get((q, k, v)),
                  options, DTYPES[dtype])
    # Work queued before and after on XLA's stream sees the custom call's result in order.
    chained = jax.jit(lambda q, k, v, a: fn(q * 2.0, k, v, a)[0] + 1.0)(q, k, v, arrays)
    again, _ = fn((q * 2.0).astype(q.dtype), k, v, arrays)
    np.testing.assert_array_equal(jax.device_get(chained), jax.device_get(again + 1.0))
    batched = jax.vmap(lambda q: fn(q, k, v, arrays)[0])(jnp.stack([q, q]))
    np.testing.assert_array_equal(jax.device_get(batched[1]), jax.device_get(out))
    grads = jax.grad(lambda q: jnp.sum(fn(q, k, v, arrays)[0].astype(jnp.float32)))(q)
    assert grads.shape == q.shape and bool(jnp.all(jnp.isfinite(grads)))


def test_cuda_float32_causal_and_varlen(rng):
    gpu = _gpu()
    q, k, v = (jax.device_put(to_jax(x), gpu) for x in random_case(rng, 2, 50, 50, 4, 4, 32))
    out, lse = jax.jit(lambda q, k, v: ftj.attention(q, k, v, causal=True, return_lse=True))(
        q, k, v)
    check_forward(jax.device_get(out), jax.device_get(lse), *jax.device_get((q, k, v)),
                  {"causal": True}, jnp.float32)
    cu = jax.device_put(jnp.array([0, 30, 30, 50], jnp.int32), gpu)
    packed = [x[0].astype(jnp.bfloat16) for x in (q, k, v)]
    out = jax.jit(lambda q, k, v, cu: ftj.attention_varlen(q, k, v, cu, cu, causal=True))(
        *packed, cu)
    ref, _ = reference_attention_varlen(*(np.asarray(jax.device_get(x).astype(jnp.float32))
                                          for x in packed), np.asarray(cu), np.asarray(cu),
                                        causal=True)
    assert max_rel_error(jax.device_get(out).astype(np.float32), ref) <= 2e-2


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("variant", ["causal", "everything"])
def test_cuda_grad_matches_the_double_oracle(rng, variant, dtype):
    # The kernels where the library has a CUDA backward for the call, else the reference
    # (it says which); the gradients meet issue 10's rule either way.
    gpu = _gpu()
    dtype = DTYPES[dtype]
    options = make_options(rng, 2, 4, GRAD_VARIANTS[variant])
    arrays, static = split_static(jax_options(options))
    alibi, sinks = arrays.get("alibi_slopes"), arrays.get("sinks")
    q, k, v = (to_jax(x, dtype) for x in random_case(rng, 2, 70, 130, 4, 2, 64))
    weights = to_jax(rng.uniform(-1, 1, q.shape).astype(np.float32), dtype).astype(jnp.float32)

    def loss(attention, **kw):
        return lambda q, k, v, sinks: jnp.sum(attention(
            q, k, v, alibi_slopes=alibi, sinks=sinks, **static, **kw).astype(
                jnp.float32) * weights)

    plain = lambda **kw: lambda *a, **o: jnp_attention(*a, **o, **kw)[0]
    argnums = (0, 1, 2, 3) if sinks is not None else (0, 1, 2)
    args = (q, k, v, sinks)
    on_gpu = jax.device_put(args, gpu)
    opts = ftj._options("test", static.get("causal", False), static.get("scale"),
                        static.get("window", (-1, -1)), static.get("softcap", 0.0), "auto",
                        False, False)
    served = ftj._backward_backend("cuda", opts, jnp.dtype(dtype).name, q.shape, k.shape,
                                   () if alibi is None else alibi.shape, sinks is not None)
    compiled, path = compiled_with_path(jax.grad(loss(ftj.attention), argnums), *on_gpu)
    assert path == ("reference" if served is None else "kernels")
    got = jax.device_get(compiled(*on_gpu))
    oracle = oracle_grad(loss(plain(compute_dtype=jnp.float64)), argnums, args)
    lowprec = jax.jit(jax.grad(loss(plain(compute_dtype=dtype)), argnums))(*args)
    extra = None
    if sinks is not None:
        with jax.enable_x64(True):
            out64, lse64 = jax.jit(lambda *a: jnp_attention(
                *a, alibi_slopes=alibi, sinks=sinks, compute_dtype=jnp.float64, **static))(
                    *as64((q, k, v)))
        extra = {"dsinks": sinks_accumulation_bound(sinks, out64, lse64, weights, dtype)}
    check_grads(["dq", "dk", "dv", "dsinks"], got, oracle, lowprec, dtype, extra)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_grad_through_lse_at_head_dim_128_takes_the_kernels(rng, dtype):
    # A gradient into the lse at head_dim 128: the backward call's dlse operand, so cuda_mma
    # serves it (the old one-head-dim-wider route asked it for 129 and fell back).
    gpu = _gpu()
    dtype = DTYPES[dtype]
    options = make_options(rng, 2, 4, GRAD_VARIANTS["everything"])
    arrays, static = split_static(jax_options(options))
    arrays.pop("alibi_slopes", None)  # differentiated slopes would take the reference
    q, k, v = (to_jax(x, dtype) for x in random_case(rng, 2, 70, 130, 4, 2, 128))
    weights = to_jax(rng.uniform(-1, 1, q.shape).astype(np.float32), dtype).astype(jnp.float32)
    lse_weights = to_jax(rng.uniform(-1, 1, (2, 4, 70)).astype(np.float32))

    loss = functools.partial(out_and_lse_loss, static=static, weights=weights,
                             lse_weights=lse_weights)

    argnums, args = (0, 1, 2, 3), (q, k, v, arrays)
    on_gpu = jax.device_put(args, gpu)
    compiled, path = compiled_with_path(jax.grad(loss(ftj.attention, return_lse=True), argnums),
                                        *on_gpu)
    assert path == "kernels"
    got = jax.device_get(compiled(*on_gpu))
    oracle = oracle_grad(loss(jnp_attention, compute_dtype=jnp.float64), argnums, args)
    lowprec = jax.jit(jax.grad(loss(jnp_attention, compute_dtype=dtype), argnums))(*args)
    names = sorted(arrays)
    flat = lambda grads: [*grads[:3], *(grads[3][n] for n in names)]
    extra = None
    if "sinks" in arrays:
        with jax.enable_x64(True):
            out64, lse64 = jax.jit(lambda *a: jnp_attention(
                *a, **arrays, compute_dtype=jnp.float64, **static))(*as64((q, k, v)))
        extra = {"sinks": sinks_accumulation_bound(arrays["sinks"], out64, lse64, weights,
                                                    dtype)}
    check_grads(["dq", "dk", "dv", *names], flat(got), flat(oracle), flat(lowprec), dtype, extra)
