"""flashtile.jax: the XLA custom call under jit, eval_shape, vmap and grad, on the CPU (and
on CUDA where JAX has a GPU).

Forward results are checked against conftest's float64 reference (written from
docs/VARIANTS.md without the library); gradients against jax.grad of `jnp_attention` below, a
plain-jnp attention with every variant that shares nothing with flashtile.jax's backward.
"""

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

GRAD_VARIANTS = {"full": {}, "causal": {"causal": True}, **VARIANTS}


def assert_grads_close(got, want, tolerance=2e-4):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert max_rel_error(g, w) <= tolerance, (max_rel_error(g, w))


@pytest.mark.parametrize("variant", GRAD_VARIANTS, ids=str)
def test_grad_matches_plain_jnp(rng, variant):
    options = make_options(rng, 2, 4, GRAD_VARIANTS[variant])
    arrays, static = split_static(jax_options(options))
    q, k, v = (to_jax(x) for x in random_case(rng, 2, 13, 19, 4, 2, 16))
    weights = to_jax(rng.uniform(-1, 1, q.shape).astype(np.float32))
    lse_weights = to_jax(rng.uniform(-1, 1, (2, 4, 13)).astype(np.float32))

    def loss(attention):
        def fn(q, k, v, a):
            out, lse = attention(q, k, v, **a, **static)
            # lse rows of -inf (no key, no sink) have no gradient: keep them out of the loss.
            return jnp.sum(out * weights) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)
                                                    * lse_weights)
        return fn

    ours = jax.jit(jax.grad(loss(lambda *a, **kw: ftj.attention(*a, return_lse=True, **kw)),
                            argnums=(0, 1, 2, 3)))(q, k, v, arrays)
    want = jax.jit(jax.grad(loss(jnp_attention), argnums=(0, 1, 2, 3)))(q, k, v, arrays)
    assert_grads_close(ours[:3], want[:3])
    assert set(ours[3]) == set(arrays)
    assert_grads_close([ours[3][n] for n in sorted(arrays)], [want[3][n] for n in sorted(arrays)])


def test_grad_without_lse_and_in_half_precision(rng):
    q, k, v = (to_jax(x, jnp.bfloat16) for x in random_case(rng, 1, 16, 16, 2, 1, 32))
    loss = lambda attention: lambda q, k, v: jnp.sum(
        attention(q, k, v, causal=True).astype(jnp.float32) ** 2)
    ours = jax.jit(jax.grad(loss(ftj.attention), argnums=(0, 1, 2)))(q, k, v)
    want = jax.jit(jax.grad(loss(lambda *a, **kw: jnp_attention(*a, **kw)[0].astype(
        jnp.bfloat16)), argnums=(0, 1, 2)))(q, k, v)
    assert_grads_close(ours, want, tolerance=3e-2)  # bf16 gradients: 8-bit mantissas


def test_vmap_of_grad(rng):
    qs = to_jax(rng.uniform(-1, 1, (3, 1, 10, 2, 8)).astype(np.float32))
    k, v = (to_jax(x) for x in random_case(rng, 1, 12, 12, 2, 2, 8)[1:])
    ours = jax.grad(lambda q: jnp.sum(ftj.attention(q, k, v, window=(4, 1)) ** 2))
    want = jax.grad(lambda q: jnp.sum(jnp_attention(q, k, v, window=(4, 1))[0] ** 2))
    assert_grads_close([jax.jit(jax.vmap(ours))(qs)], [jax.jit(jax.vmap(want))(qs)])


def test_varlen_grad_matches_plain_jnp_per_sequence(rng):
    # Sequence 1: 5 queries and no key used (the lse is the sink); sequence 2: no query.
    cu_q, cu_k = np.array([0, 7, 12, 12, 20], np.int32), np.array([0, 9, 12, 20, 30], np.int32)
    used = np.array([9, 0, 4, 10], np.int32)
    q = to_jax(rng.uniform(-1, 1, (20, 4, 16)).astype(np.float32))
    k, v = (to_jax(rng.uniform(-1, 1, (30, 2, 16)).astype(np.float32)) for _ in range(2))
    alibi, sinks = to_jax(slopes(rng, 4, 4)), to_jax(sink_logits(rng, 4))
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
    ours = jax.jit(jax.grad(packed_loss, argnums))(q, k, v, alibi, sinks)
    want = jax.jit(jax.grad(per_sequence_loss, argnums))(q, k, v, alibi, sinks)
    assert_grads_close(ours, want)


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
