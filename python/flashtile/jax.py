"""flashtile.jax: flashtile's attention as an XLA custom call, for jax.jit, vmap and grad.

    import jax, flashtile.jax as ftj
    out = jax.jit(ftj.attention, static_argnames="causal")(q, k, v, causal=True)  # BSHD

The forward runs flashtile's kernels through XLA's FFI (python/src/jax_ffi.cpp): on the CPU
in XLA's thread, on CUDA on the stream XLA hands the custom call. Shapes come from the
arguments alone, so jax.eval_shape and tracing never run a kernel; the library validates
the call when it runs, and its errors surface as JAX runtime errors carrying its message.

- vmap: a batching rule folds the mapped axis into the batch dimension (one kernel call);
  an unbatched q, k or v is broadcast first. Mapped sinks, and attention_varlen, run the
  mapped calls one after another (jax.lax.map).
- grad: jax.custom_vjp, whose backward is flashtile::backward (backward_varlen) as another
  custom call, from the saved out and LSE: dq, dk, dv, and dsinks with sinks. Which backward
  runs is decided while tracing, per platform ("which backward runs" below): the kernels
  where the library serves the call, else the interim reference _reference_backward (plain
  jnp, O(seqlen_q * seqlen_k) memory per head), with a warning on the "flashtile.jax" logger.
  A gradient into the returned lse goes to the backward call as its dlse operand
  (Options::dlse); the reference gives differentiated ALiBi slopes their gradient.
"""

from __future__ import annotations

import functools
import logging
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero
import numpy as np

from . import _flashtile

try:
    import jax.ffi
except ImportError:
    raise ImportError(f"flashtile.jax needs a jax with the jax.ffi module (jax.ffi.ffi_call); "
                      f"this is jax {jax.__version__}: python3 -m pip install -U jax") from None

_ffi = getattr(_flashtile, "jax_ffi", None)
if _ffi is None:
    raise ImportError(
        "flashtile.jax: this flashtile was built without JAX support (jax was not importable "
        "when it was built, so XLA's FFI headers were missing, or FLASHTILE_JAX=OFF). "
        "Install jax, then rebuild: "
        "python3 -m pip install jax && python3 -m pip install --force-reinstall --no-deps . "
        "(or -Ccmake.define.FLASHTILE_JAX=ON to make a missing jax a build error)")

__all__ = ["attention", "attention_varlen"]

_DTYPES = (jnp.float32, jnp.float16, jnp.bfloat16)


def _register_targets() -> None:
    for platform, targets in _ffi.registrations().items():
        for name, capsule in targets.items():
            jax.ffi.register_ffi_target(name, capsule, platform=platform)


_register_targets()


class _Options(NamedTuple):
    """The static (hashable) part of one call."""
    causal: bool
    scale: Optional[float]
    window: tuple  # (left, right), -1 unbounded
    softcap: float
    backend: str
    return_lse: bool
    deterministic: bool = False  # the backward's Options::deterministic
    # varlen only
    max_seqlen_q: Optional[int] = None
    max_seqlen_k: Optional[int] = None


def _options(api: str, causal, scale, window, softcap, backend, return_lse, deterministic,
             max_seqlen_q=None, max_seqlen_k=None) -> _Options:
    static = dict(causal=causal, scale=scale, window=window, softcap=softcap, backend=backend,
                  return_lse=return_lse, deterministic=deterministic,
                  max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    for name, value in static.items():
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(value)):
            raise TypeError(f"{api}: {name} is a static option, but got a traced value: under "
                            f"jax.jit pass it through static_argnames (or a closure)")
    for name, flag in (("causal", causal), ("return_lse", return_lse),
                       ("deterministic", deterministic)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{api}: {name} must be True or False (a static argument under "
                            f"jit), got {flag!r}")
    try:
        left, right = window
        left, right = int(left), int(right)
    except (TypeError, ValueError):
        raise ValueError(f"{api}: window must be a pair of integers (left, right), -1 for an "
                         f"unbounded side, got {window!r}") from None
    if not isinstance(backend, str):
        raise TypeError(f"{api}: backend must be a string, got {backend!r}")
    optional_int = lambda x: None if x is None else int(x)
    return _Options(bool(causal), None if scale is None else float(scale), (left, right),
                    0.0 if softcap is None else float(softcap), backend, bool(return_lse),
                    bool(deterministic), optional_int(max_seqlen_q), optional_int(max_seqlen_k))


def _check_tensors(api: str, ndim: int, layout: str, **tensors) -> None:
    """What tracing needs (rank, dtype); the library checks everything else when it runs."""
    dtype = tensors["q"].dtype
    for name, x in tensors.items():
        if x.ndim != ndim:
            raise ValueError(f"{api}: {name} must be {layout}, got {x.ndim}-D")
        if x.dtype not in _DTYPES:
            raise TypeError(f"{api}: {name}.dtype must be float32, float16 or bfloat16, "
                            f"got {x.dtype}")
        if x.dtype != dtype:
            raise TypeError(f"{api}: {name}.dtype must match q.dtype ({dtype}), got {x.dtype}")


def _check_small(api: str, dtype, **arrays) -> None:
    """ALiBi slopes and sinks (float32), cu_seqlens and seqused_k (int32), when given."""
    for name, x in arrays.items():
        if x is not None and x.dtype != dtype:
            raise TypeError(f"{api}: {name}.dtype must be {np.dtype(dtype).name}, got {x.dtype}")


# --- the custom call ---------------------------------------------------------------------------

def _ffi_attrs(opts: _Options, has_alibi: bool, has_sinks: bool, has_seqused_k: bool,
               has_dlse: bool = False) -> dict:
    """The attributes python/src/jax_ffi.cpp decodes (CallAttrs), with their exact types."""
    return dict(causal=np.bool_(opts.causal), has_scale=np.bool_(opts.scale is not None),
                scale=np.float32(0.0 if opts.scale is None else opts.scale),
                window_left=np.int64(opts.window[0]), window_right=np.int64(opts.window[1]),
                softcap=np.float32(opts.softcap), has_alibi_slopes=np.bool_(has_alibi),
                has_sinks=np.bool_(has_sinks), has_seqused_k=np.bool_(has_seqused_k),
                max_seqlen_q=np.int64(-1 if opts.max_seqlen_q is None else opts.max_seqlen_q),
                max_seqlen_k=np.int64(-1 if opts.max_seqlen_k is None else opts.max_seqlen_k),
                backend=opts.backend, deterministic=np.bool_(opts.deterministic),
                has_dlse=np.bool_(has_dlse))


def _call_dense(opts: _Options, with_lse: bool, q, k, v, alibi_slopes, sinks):
    """out, or (out, lse (batch, heads_q, seqlen_q) fp32): one custom call."""
    batch, seqlen_q, heads_q, _ = q.shape
    results = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
    if with_lse:
        results.append(jax.ShapeDtypeStruct((batch, heads_q, seqlen_q), jnp.float32))
    extras = [x for x in (alibi_slopes, sinks) if x is not None]
    call = jax.ffi.ffi_call("flashtile_attention", results)
    outs = call(q, k, v, *extras, **_ffi_attrs(opts, alibi_slopes is not None,
                                               sinks is not None, False))
    return tuple(outs) if with_lse else outs[0]


def _gradient_results(q, k, v, sinks) -> list:
    """What a backward call returns: dq, dk, dv like q, k, v; dsinks fp32 (heads_q) with sinks."""
    results = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)]
    if sinks is not None:
        results.append(jax.ShapeDtypeStruct(sinks.shape, jnp.float32))
    return results


def _call_dense_backward(opts: _Options, q, k, v, out, dout, lse, dlse, alibi_slopes, sinks):
    """(dq, dk, dv), or (dq, dk, dv, dsinks): flashtile::backward as one custom call; dlse
    (the lse's cotangent, fp32 like lse) or None."""
    saved = [x for x in (lse, dlse) if x is not None]
    extras = [x for x in (alibi_slopes, sinks) if x is not None]
    call = jax.ffi.ffi_call("flashtile_attention_backward", _gradient_results(q, k, v, sinks))
    return tuple(call(q, k, v, out, dout, *saved, *extras,
                      **_ffi_attrs(opts, alibi_slopes is not None, sinks is not None, False,
                                   dlse is not None)))


def _fold(x, axis_size: int, batched: bool):
    """(V, B, ...) -> (V*B, ...); an unbatched (B, ...) is broadcast to V copies first."""
    if not batched:
        x = jnp.broadcast_to(x, (axis_size,) + x.shape)
    return x.reshape((-1,) + x.shape[2:])


def _unfold(x, axis_size: int):
    return x.reshape((axis_size, -1) + x.shape[1:])


def _map_slices(kernel, axis_size: int, in_batched, args):
    """A vmap rule's fallback: the mapped calls one after another (jax.lax.map), unbatched
    arguments broadcast along the mapped axis. Returns (outputs, their batched flags)."""
    mapped = [x if batched else jnp.broadcast_to(x, (axis_size,) + x.shape)
              for x, batched in zip(args, in_batched)]
    out = jax.lax.map(lambda xs: kernel(*xs), mapped)
    return out, jax.tree.map(lambda _: True, out)


def _dense_custom_vmap(call, tensors: int, has_alibi: bool, has_sinks: bool,
                       map_with_sinks: bool):
    """call(*arrays) with a batching rule. Its first `tensors` arguments (q, k, v, ...) and
    every result lead with the batch dimension, into which the rule folds the mapped axis
    (one call); then come the ALiBi slopes and the sinks when given. Sinks are per head, with
    no batch dimension: mapped sinks, or any sinks when `map_with_sinks` (the backward's
    dsinks sums over the batch), run the mapped calls one after another instead."""

    def split(extras):
        extras = list(extras)
        alibi = extras.pop(0) if has_alibi else None
        sinks = extras.pop(0) if has_sinks else None
        return alibi, sinks

    @jax.custom_batching.custom_vmap
    def kernel(*args):
        return call(*args[:tensors], *split(args[tensors:]))

    @kernel.def_vmap
    def rule(axis_size, in_batched, *args):
        arrays, arrays_b = args[:tensors], in_batched[:tensors]
        alibi, sinks = split(args[tensors:])
        alibi_b, sinks_b = split(in_batched[tensors:])
        if sinks_b or (has_sinks and map_with_sinks):
            return _map_slices(kernel, axis_size, in_batched, args)
        batch = arrays[0].shape[1] if arrays_b[0] else arrays[0].shape[0]
        if alibi is not None and (alibi_b or alibi.ndim == 2):
            # (V, H) or (V, B, H) or unbatched (B, H) -> (V*B, H): one row per folded batch.
            per_batch = alibi if alibi_b else jnp.broadcast_to(alibi, (axis_size,) + alibi.shape)
            if per_batch.ndim == 2:
                per_batch = jnp.broadcast_to(per_batch[:, None], (axis_size, batch)
                                             + per_batch.shape[1:])
            alibi = per_batch.reshape((-1,) + per_batch.shape[2:])
        # Through `kernel` again, so that an enclosing vmap folds its own axis in turn.
        out = kernel(*[_fold(x, axis_size, b) for x, b in zip(arrays, arrays_b)],
                     *[x for x in (alibi, sinks) if x is not None])
        out = jax.tree.map(lambda x: _unfold(x, axis_size), out)
        return out, jax.tree.map(lambda _: True, out)

    return kernel


@functools.lru_cache(maxsize=None)
def _dense_kernel(opts: _Options, with_lse: bool, has_alibi: bool, has_sinks: bool):
    """The forward custom call as a function of arrays only, with its batching rule."""
    return _dense_custom_vmap(functools.partial(_call_dense, opts, with_lse), 3, has_alibi,
                              has_sinks, map_with_sinks=False)


@functools.lru_cache(maxsize=None)
def _dense_backward_kernel(opts: _Options, has_alibi: bool, has_sinks: bool, has_dlse: bool):
    """The backward custom call as a function of (q, k, v, out, dout, lse, [dlse], [slopes],
    [sinks]); dlse (batch, heads_q, seqlen_q) leads with the batch as the tensors do."""
    if has_dlse:
        call = functools.partial(_call_dense_backward, opts)
    else:
        def call(q, k, v, out, dout, lse, alibi_slopes, sinks):
            return _call_dense_backward(opts, q, k, v, out, dout, lse, None, alibi_slopes, sinks)
    return _dense_custom_vmap(call, 7 if has_dlse else 6, has_alibi, has_sinks,
                              map_with_sinks=True)


def _forward_dense(opts: _Options, with_lse: bool, q, k, v, alibi_slopes, sinks):
    kernel = _dense_kernel(opts, with_lse, alibi_slopes is not None, sinks is not None)
    return kernel(q, k, v, *[x for x in (alibi_slopes, sinks) if x is not None])


def _kernel_backward(opts: _Options, q, k, v, alibi_slopes, sinks, out, lse, dout, dlse=None):
    """flashtile::backward's (dq, dk, dv), and dsinks when sinks are given."""
    kernel = _dense_backward_kernel(opts, alibi_slopes is not None, sinks is not None,
                                    dlse is not None)
    return kernel(q, k, v, out, dout, lse,
                  *[x for x in (dlse, alibi_slopes, sinks) if x is not None])


def _call_varlen(opts: _Options, with_lse: bool, q, k, v, cu_seqlens_q, cu_seqlens_k,
                 seqused_k, alibi_slopes, sinks):
    """out, or (out, lse (heads_q, total_q) fp32), of a packed batch: one custom call."""
    total_q, heads_q, _ = q.shape
    results = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
    if with_lse:
        results.append(jax.ShapeDtypeStruct((heads_q, total_q), jnp.float32))
    extras = [x for x in (seqused_k, alibi_slopes, sinks) if x is not None]
    call = jax.ffi.ffi_call("flashtile_attention_varlen", results)
    outs = call(q, k, v, cu_seqlens_q, cu_seqlens_k, *extras,
                **_ffi_attrs(opts, alibi_slopes is not None, sinks is not None,
                             seqused_k is not None))
    return tuple(outs) if with_lse else outs[0]


def _call_varlen_backward(opts: _Options, q, k, v, out, dout, lse, dlse, cu_seqlens_q,
                          cu_seqlens_k, seqused_k, alibi_slopes, sinks):
    """(dq, dk, dv[, dsinks]) of a packed batch: flashtile::backward_varlen as one call;
    dlse (heads_q, total_q) or None."""
    saved = [x for x in (lse, dlse) if x is not None]
    extras = [x for x in (seqused_k, alibi_slopes, sinks) if x is not None]
    call = jax.ffi.ffi_call("flashtile_attention_varlen_backward",
                            _gradient_results(q, k, v, sinks))
    return tuple(call(q, k, v, out, dout, *saved, cu_seqlens_q, cu_seqlens_k, *extras,
                      **_ffi_attrs(opts, alibi_slopes is not None, sinks is not None,
                                   seqused_k is not None, dlse is not None)))


def _varlen_custom_vmap(call, fixed: int, given: tuple):
    """call(*arrays) with a batching rule that runs the mapped calls one after another: a
    packed batch has no free dimension to fold the mapped axis into. `fixed` arguments come
    first; `given` says which of (seqused_k, alibi_slopes, sinks) follow them (the others are
    None for `call`)."""

    def unpack(extras):
        extras = list(extras)
        return [extras.pop(0) if present else None for present in given]

    @jax.custom_batching.custom_vmap
    def kernel(*args):
        return call(*args[:fixed], *unpack(args[fixed:]))

    @kernel.def_vmap
    def rule(axis_size, in_batched, *args):
        return _map_slices(kernel, axis_size, in_batched, args)

    return kernel


@functools.lru_cache(maxsize=None)
def _varlen_kernel(opts: _Options, with_lse: bool, given: tuple):
    """The varlen forward custom call as a function of arrays only, with its batching rule."""
    return _varlen_custom_vmap(functools.partial(_call_varlen, opts, with_lse), 5, given)


@functools.lru_cache(maxsize=None)
def _varlen_backward_kernel(opts: _Options, given: tuple, has_dlse: bool):
    """The varlen backward custom call, as _varlen_kernel: (q, k, v, out, dout, lse, [dlse],
    cu_seqlens_q, cu_seqlens_k, ...)."""
    if has_dlse:
        call = functools.partial(_call_varlen_backward, opts)
    else:
        def call(q, k, v, out, dout, lse, *rest):
            return _call_varlen_backward(opts, q, k, v, out, dout, lse, None, *rest)
    return _varlen_custom_vmap(call, 9 if has_dlse else 8, given)


def _forward_varlen(opts: _Options, with_lse: bool, q, k, v, cu_seqlens_q, cu_seqlens_k,
                    seqused_k, alibi_slopes, sinks):
    optional = (seqused_k, alibi_slopes, sinks)
    kernel = _varlen_kernel(opts, with_lse, tuple(x is not None for x in optional))
    return kernel(q, k, v, cu_seqlens_q, cu_seqlens_k, *[x for x in optional if x is not None])


def _kernel_backward_varlen(opts: _Options, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                            alibi_slopes, sinks, out, lse, dout, dlse=None):
    """flashtile::backward_varlen's (dq, dk, dv), and dsinks when sinks are given."""
    optional = (seqused_k, alibi_slopes, sinks)
    kernel = _varlen_backward_kernel(opts, tuple(x is not None for x in optional),
                                     dlse is not None)
    return kernel(q, k, v, out, dout, lse, *([] if dlse is None else [dlse]), cu_seqlens_q,
                  cu_seqlens_k, *[x for x in optional if x is not None])


# --- the reference backward --------------------------------------------------------------------

def _visible(rel, left: int, right: int):
    """Key j is visible to query i when rel = j - (i + seqlen_k - seqlen_q) lies in
    [-left, right] per sequence (-1: unbounded); causal has already set right = 0."""
    visible = jnp.ones(rel.shape, dtype=bool)
    if left >= 0:
        visible &= rel >= -left
    if right >= 0:
        visible &= rel <= right
    return visible


def _scores_backward(opts: _Options, Q, K, V, O, dO, lse, dlse, visible, distance, slope,
                     sink):
    """Gradients of attention with every variant, recomputed from the forward's lse.

    Q, O, dO (G, H, Sq, D) fp32; K, V (G, H, Sk, D) with the kv heads expanded; lse, dlse
    (G, H, Sq); visible, distance broadcastable to (G, H, Sq, Sk); slope broadcastable to
    (G, H, 1, 1) or None; sink (1, H, 1, 1) or None. Returns dQ, dK, dV (expanded heads),
    dS·(-distance) summed over keys (G, H, Sq) or None, and the sink gradient (H,) or None.
    """
    scale = opts.scale if opts.scale is not None else Q.shape[-1] ** -0.5
    S_raw = jnp.einsum("ghqd,ghkd->ghqk", Q, K) * scale                  # (G, H, Sq, Sk)
    if opts.softcap:
        capped = jnp.tanh(S_raw / opts.softcap)
        S = opts.softcap * capped
    else:
        S = S_raw
    if slope is not None:
        S = S - slope * distance
    m = lse[..., None]                                                   # (G, H, Sq, 1)
    empty = jnp.isneginf(m)  # a row that saw no key and no sink: P = 0
    P = jnp.where(visible & ~empty, jnp.exp(S - jnp.where(empty, 0.0, m)), 0.0)
    dV = jnp.einsum("ghqk,ghqd->ghkd", P, dO)                            # (G, H, Sk, D)
    dP = jnp.einsum("ghqd,ghkd->ghqk", dO, V)                            # (G, H, Sq, Sk)
    D = jnp.sum(dO * O, axis=-1, keepdims=True)                          # (G, H, Sq, 1)
    g = dlse[..., None]                                                  # (G, H, Sq, 1)
    dS = P * (dP - D + g)                                                # (G, H, Sq, Sk)
    alibi_term = -jnp.sum(dS * distance, axis=-1) if slope is not None else None
    dsink = None
    if sink is not None:
        # A sink is a key of logit s with value 0: dS_sink = P_sink * (0 - D + dlse).
        P_sink = jnp.where(empty, 0.0, jnp.exp(sink - jnp.where(empty, 0.0, m)))
        dsink = jnp.sum(P_sink * (g - D), axis=(0, 2, 3))                # (H,)
    if opts.softcap:
        dS = dS * (1.0 - capped * capped)
    dQ = jnp.einsum("ghqk,ghkd->ghqd", dS, K) * scale                    # (G, H, Sq, D)
    dK = jnp.einsum("ghqk,ghqd->ghkd", dS, Q) * scale                    # (G, H, Sk, D)
    return dQ, dK, dV, alibi_term, dsink


def _expand_kv(x, group: int):
    return jnp.repeat(x, group, axis=1)


def _sum_kv_groups(grad, heads_kv: int):
    """(G, Hq, S, D) -> (G, Hkv, S, D): GQA sums the gradients of a kv head's query heads."""
    g, _, s, d = grad.shape
    return grad.reshape(g, heads_kv, -1, s, d).sum(2)


def _window(opts: _Options) -> tuple:
    left, right = opts.window
    return left, 0 if opts.causal else right


def _reference_backward(opts: _Options, q, k, v, alibi_slopes, sinks, out, lse, dout, dlse):
    """The reference backward of attention (plain jnp, O(Sq*Sk) per head): dq, dk, dv (dtypes
    of q, k, v), dalibi_slopes and dsinks (None when not given). It runs where the kernels
    cannot ("which backward runs" below)."""
    _, seqlen_q, heads_q, _ = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    f32 = jnp.float32
    bhsd = lambda x: jnp.swapaxes(x.astype(f32), 1, 2)                   # BSHD -> (B, H, S, D)
    i = jnp.arange(seqlen_q)[:, None]
    j = jnp.arange(seqlen_k)[None, :]
    rel = j - (i + seqlen_k - seqlen_q)                                  # (Sq, Sk)
    visible = _visible(rel, *_window(opts))[None, None]
    distance = jnp.abs(rel).astype(f32)[None, None]
    slope = None
    if alibi_slopes is not None:  # (Hq) or (B, Hq) -> broadcastable to (B, Hq, 1, 1)
        slope = alibi_slopes.astype(f32).reshape(-1 if alibi_slopes.ndim == 2 else 1,
                                                 heads_q, 1, 1)
    sink = sinks.astype(f32).reshape(1, heads_q, 1, 1) if sinks is not None else None
    dQ, dK, dV, alibi_term, dsink = _scores_backward(
        opts, bhsd(q), _expand_kv(bhsd(k), group), _expand_kv(bhsd(v), group), bhsd(out),
        bhsd(dout), lse, dlse.astype(f32), visible, distance, slope, sink)
    dslopes = None
    if alibi_term is not None:
        dslopes = alibi_term.sum(-1)                                     # (B, Hq)
        dslopes = (dslopes if alibi_slopes.ndim == 2 else dslopes.sum(0)).astype(
            alibi_slopes.dtype)
    dsinks = dsink.astype(sinks.dtype) if dsink is not None else None
    back = lambda grad, like: jnp.swapaxes(grad, 1, 2).astype(like.dtype)  # -> BSHD
    return (back(dQ, q), back(_sum_kv_groups(dK, heads_kv), k),
            back(_sum_kv_groups(dV, heads_kv), v), dslopes, dsinks)


def _varlen_geometry(opts: _Options, cu_seqlens_q, cu_seqlens_k, seqused_k, total_q: int,
                     total_k: int):
    """(visible, distance) of a packed batch, both (1, 1, total_q, total_k), and the sequence
    of every query row (total_q,): a block-diagonal mask, each block aligned to its own
    sequence's lengths, computed from the cu_seqlens arrays (traced, never read on the host)."""
    cu_q, cu_k = cu_seqlens_q.astype(jnp.int32), cu_seqlens_k.astype(jnp.int32)
    batch = cu_q.shape[0] - 1
    rows = jnp.arange(total_q)
    cols = jnp.arange(total_k)
    # Row r belongs to the sequence b with cu[b] <= r < cu[b+1] (empty sequences own none);
    # key rows past cu_k[batch] get b = batch, which no query row has.
    seq_q = jnp.searchsorted(cu_q[1:], rows, side="right")               # (Tq,)
    seq_k = jnp.searchsorted(cu_k[1:], cols, side="right")               # (Tk,)
    seq_k_clamped = jnp.minimum(seq_k, batch - 1)
    len_q = cu_q[1:] - cu_q[:-1]                                         # (batch,)
    len_k = seqused_k.astype(jnp.int32) if seqused_k is not None else cu_k[1:] - cu_k[:-1]
    i = rows - cu_q[seq_q]                                               # position in its sequence
    j = cols - cu_k[seq_k_clamped]
    key_used = (j >= 0) & (j < len_k[seq_k_clamped])                     # (Tk,)
    offset = (len_k - len_q)[seq_q]                                      # (Tq,)
    rel = j[None, :] - (i + offset)[:, None]                             # (Tq, Tk)
    visible = ((seq_q[:, None] == seq_k[None, :]) & key_used[None, :]
               & _visible(rel, *_window(opts)))
    return visible[None, None], jnp.abs(rel).astype(jnp.float32)[None, None], seq_q


def _reference_backward_varlen(opts: _Options, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                               alibi_slopes, sinks, out, lse, dout, dlse):
    """The interim backward of attention_varlen: the packed batch as one block-diagonal
    problem (plain jnp, O(total_q * total_k) per head). Returns dq, dk, dv, dalibi_slopes,
    dsinks; it runs where the kernels cannot."""
    total_q, heads_q, _ = q.shape
    total_k, heads_kv = k.shape[0], k.shape[1]
    group = heads_q // heads_kv
    f32 = jnp.float32
    hsd = lambda x: jnp.swapaxes(x.astype(f32), 0, 1)[None]              # (T, H, D) -> (1, H, T, D)
    visible, distance, seq_q = _varlen_geometry(opts, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                                total_q, total_k)
    slope = None
    if alibi_slopes is not None:  # (Hq) -> (1, Hq, 1, 1); (B, Hq) -> each row's sequence
        slopes = alibi_slopes.astype(f32)
        slope = (slopes[seq_q].T[None, :, :, None] if slopes.ndim == 2
                 else slopes.reshape(1, heads_q, 1, 1))
    sink = sinks.astype(f32).reshape(1, heads_q, 1, 1) if sinks is not None else None
    dQ, dK, dV, alibi_term, dsink = _scores_backward(
        opts, hsd(q), _expand_kv(hsd(k), group), _expand_kv(hsd(v), group), hsd(out),
        hsd(dout), lse[None], dlse.astype(f32)[None], visible, distance, slope, sink)
    dslopes = None
    if alibi_term is not None:
        per_row = alibi_term[0].T                                        # (Tq, Hq)
        if alibi_slopes.ndim == 2:
            dslopes = jnp.zeros(alibi_slopes.shape, f32).at[seq_q].add(per_row)
        else:
            dslopes = per_row.sum(0)
        dslopes = dslopes.astype(alibi_slopes.dtype)
    dsinks = dsink.astype(sinks.dtype) if dsink is not None else None
    back = lambda grad, like: jnp.swapaxes(grad[0], 0, 1).astype(like.dtype)  # -> (T, H, D)
    return (back(dQ, q), back(_sum_kv_groups(dK, heads_kv), k),
            back(_sum_kv_groups(dV, heads_kv), v), dslopes, dsinks)


# --- which backward runs ------------------------------------------------------------------------
#
# Decided when the vjp is traced, per platform (jax.lax.platform_dependent picks the branch of
# the platform the program is lowered for): flashtile's kernels (flashtile::backward) when
# the library says a backend serves the call, else the jnp reference with the reason logged.
# Asking the library, rather than naming the platforms that have kernels here, means a new
# backward backend (CUDA's) is used as soon as the library has it, with no change here.

_log = logging.getLogger("flashtile.jax")


@functools.lru_cache(maxsize=None)
def _jax_platforms() -> tuple:
    """The platforms flashtile serves on which this process's JAX has devices."""
    found = []
    for platform in ("cpu", "cuda"):
        try:
            jax.devices(platform)
            found.append(platform)
        except RuntimeError:
            pass
    return tuple(found)


@functools.lru_cache(maxsize=None)
def _log_reference(reason: str) -> None:
    """Says once per reason that a gradient runs the reference instead of the kernels."""
    _log.warning("flashtile.jax: this gradient runs the jnp reference backward "
                 "(O(seqlen_q * seqlen_k) memory per head) instead of flashtile's backward "
                 "kernels: %s", reason)


def _reference_reason(slopes_perturbed: bool) -> str:
    """Why the kernels cannot give this gradient whatever the platform ("" when they can)."""
    if slopes_perturbed:
        return "the ALiBi slopes are differentiated, and the kernels give them no gradient"
    return ""


@functools.lru_cache(maxsize=None)
def _backward_backend(platform: str, opts: _Options, dtype: str, q_shape: tuple,
                      k_shape: tuple, alibi_shape: tuple, has_sinks: bool) -> Optional[str]:
    """The backend flashtile::backward gets on `platform`: the forward's when it has a backward
    pass, else "auto"; None when the library says no backend serves the call (the reason is
    logged). A varlen call is asked as the dense call (1, total, heads, head_dim) of the same
    variant: cu_seqlens have no values at trace time."""
    refusals = []
    for backend in dict.fromkeys((opts.backend, "auto")):
        kind, why = _ffi.backward_refusal(platform, dtype, q_shape, k_shape, list(alibi_shape),
                                          has_sinks, opts.causal, opts.scale, opts.window[0],
                                          opts.window[1], opts.softcap, backend,
                                          opts.deterministic)
        if kind != "unsupported":  # served; or a wrong call, whose run raises the message
            return backend
        refusals.append(why)
    _log_reference(f"on {platform}, " + "; ".join(refusals))
    return None


def _choose_backward(opts: _Options, q, k, alibi_slopes, sinks, kernels, reference, why: str):
    """kernels(backend) or reference(), both () -> the same gradients, as decided above."""
    if why:
        _log_reference(why)
        return reference()

    def shape(x):  # a packed tensor: batch 1
        return x.shape if x.ndim == 4 else (1,) + x.shape

    alibi_shape = () if alibi_slopes is None else (
        alibi_slopes.shape if q.ndim == 4 or alibi_slopes.ndim == 1 else (1, q.shape[1]))
    key = (opts, jnp.dtype(q.dtype).name, shape(q), shape(k), alibi_shape, sinks is not None)

    def branch(platform):
        backend = _backward_backend(platform, *key)
        return reference if backend is None else functools.partial(kernels, backend)

    return jax.lax.platform_dependent(
        default=reference, **{p: branch(p) for p in _jax_platforms()})


def _lse_cotangent(dlse):
    """The lse's cotangent as the backward call takes it (float32, the lse's shape), or None
    when jax says it is zero: Options::dlse adds dlse_i·P_ij to each dS_ij (∂lse_i/∂s_ij = P_ij)."""
    return None if dlse is None else dlse.astype(jnp.float32)


def _values(*primals) -> tuple:
    """The arrays of the fwd rule's CustomVJPPrimal arguments (None stays None)."""
    return tuple(None if x is None else x.value for x in primals)


def _perturbed(primal) -> bool:
    """Whether jax differentiates this fwd rule argument (None never)."""
    return primal is not None and primal.perturbed


def _cotangents(opts: _Options, cotangent, out):
    """(dout, dlse or None) from the custom_vjp's symbolic-zero cotangents."""
    dout, dlse = cotangent if opts.return_lse else (cotangent, None)
    if isinstance(dout, SymbolicZero):
        dout = jnp.zeros(out.shape, out.dtype)
    return dout, None if dlse is None or isinstance(dlse, SymbolicZero) else dlse


# --- attention with its vjp ---------------------------------------------------------------------
#
# The vjp's gradients: dq, dk, dv, and dsinks with sinks, from the kernels wherever the
# library serves the backward, else from the reference. The ALiBi slopes: when they are
# differentiated (jax marks them perturbed), the reference runs and gives their exact gradient;
# otherwise their cotangent is None (zero), which nothing reads.

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(opts: _Options, q, k, v, alibi_slopes, sinks):
    return _forward_dense(opts, opts.return_lse, q, k, v, alibi_slopes, sinks)


def _attention_fwd(opts: _Options, q, k, v, alibi_slopes, sinks):
    slopes_perturbed = _perturbed(alibi_slopes)
    q, k, v, alibi_slopes, sinks = _values(q, k, v, alibi_slopes, sinks)
    out, lse = _forward_dense(opts, True, q, k, v, alibi_slopes, sinks)
    primal = (out, lse) if opts.return_lse else out
    return primal, (q, k, v, alibi_slopes, sinks, out, lse, slopes_perturbed)


def _attention_bwd(opts: _Options, residuals, cotangent):
    q, k, v, alibi_slopes, sinks, out, lse, slopes_perturbed = residuals
    dout, dlse = _cotangents(opts, cotangent, out)

    def reference():
        grads = _reference_backward(opts, q, k, v, alibi_slopes, sinks, out, lse, dout,
                                    jnp.zeros_like(lse) if dlse is None else dlse)
        return grads if slopes_perturbed else (*grads[:3], None, grads[4])

    def kernels(backend):
        dq, dk, dv, *dsinks = _kernel_backward(opts._replace(backend=backend), q, k, v,
                                               alibi_slopes, sinks, out, lse, dout,
                                               _lse_cotangent(dlse))
        return dq, dk, dv, None, dsinks[0] if dsinks else None

    return _choose_backward(opts, q, k, alibi_slopes, sinks, kernels, reference,
                            _reference_reason(slopes_perturbed))


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)


def attention(q, k, v, *, causal: bool = False, scale: float | None = None, window=(-1, -1),
              softcap: float = 0.0, alibi_slopes=None, sinks=None, return_lse: bool = False,
              deterministic: bool = False, backend: str = "auto"):
    """Exact attention softmax(q·kᵀ·scale)·v as an XLA custom call (jit, vmap, grad).

    q: (batch, seqlen_q, heads_q, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim),
    heads_q a multiple of heads_kv; float32, float16 or bfloat16 (all three alike) on the CPU
    or a CUDA device. float32 on CUDA runs through cuda_tf32x3 (head_dim <= 128, every
    variant and varlen) or cuda_tiled (full and causal only); 16-bit CUDA calls run
    cuda_sm90 or cuda_mma with every variant.
    causal, scale, window, softcap, alibi_slopes, sinks: as flashtile.attention
    (alibi_slopes float32 (heads_q) or (batch, heads_q); sinks float32 (heads_q)). The
    scalar options are static: under jax.jit pass them through static_argnames or a closure.
    return_lse: also return the log-sum-exp, float32 (batch, heads_q, seqlen_q).
    deterministic: the backward kernels' bitwise-reproducible mode (Options::deterministic).
    backend: "auto" or a name from flashtile.backends() of q's device; the backward runs it
    when it has a backward pass, else the library's choice.

    Returns out (like q), or (out, lse). Differentiable in q, k, v, alibi_slopes and sinks
    (and through lse); the module docstring says which gradients the kernels give.
    """
    api = "flashtile.jax.attention"
    opts = _options(api, causal, scale, window, softcap, backend, return_lse, deterministic)
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    _check_tensors(api, 4, "4-D (batch, seqlen, heads, head_dim)", q=q, k=k, v=v)
    alibi_slopes = None if alibi_slopes is None else jnp.asarray(alibi_slopes)
    sinks = None if sinks is None else jnp.asarray(sinks)
    _check_small(api, jnp.float32, alibi_slopes=alibi_slopes, sinks=sinks)
    return _attention(opts, q, k, v, alibi_slopes, sinks)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention_varlen(opts: _Options, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                      alibi_slopes, sinks):
    return _forward_varlen(opts, opts.return_lse, q, k, v, cu_seqlens_q, cu_seqlens_k,
                           seqused_k, alibi_slopes, sinks)


def _attention_varlen_fwd(opts: _Options, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                          alibi_slopes, sinks):
    slopes_perturbed = _perturbed(alibi_slopes)
    args = _values(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes, sinks)
    out, lse = _forward_varlen(opts, True, *args)
    primal = (out, lse) if opts.return_lse else out
    return primal, (*args, out, lse, slopes_perturbed)


def _attention_varlen_bwd(opts: _Options, residuals, cotangent):
    *args, out, lse, slopes_perturbed = residuals
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes, sinks = args
    dout, dlse = _cotangents(opts, cotangent, out)

    def reference():
        dq, dk, dv, dslopes, dsinks = _reference_backward_varlen(
            opts, *args, out, lse, dout, jnp.zeros_like(lse) if dlse is None else dlse)
        return dq, dk, dv, dslopes if slopes_perturbed else None, dsinks

    def kernels(backend):
        dq, dk, dv, *dsinks = _kernel_backward_varlen(
            opts._replace(backend=backend), q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
            alibi_slopes, sinks, out, lse, dout, _lse_cotangent(dlse))
        return dq, dk, dv, None, dsinks[0] if dsinks else None

    dq, dk, dv, dslopes, dsinks = _choose_backward(
        opts, q, k, alibi_slopes, sinks, kernels, reference, _reference_reason(slopes_perturbed))
    return dq, dk, dv, None, None, None, dslopes, dsinks  # no gradient for the int32 arrays


_attention_varlen.defvjp(_attention_varlen_fwd, _attention_varlen_bwd, symbolic_zeros=True)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int | None = None,
                     max_seqlen_k: int | None = None, *, seqused_k=None, causal: bool = False,
                     scale: float | None = None, window=(-1, -1), softcap: float = 0.0,
                     alibi_slopes=None, sinks=None, return_lse: bool = False,
                     deterministic: bool = False, backend: str = "auto"):
    """Exact attention over a packed batch of variable-length sequences, as a custom call.

    flash_attn_varlen_func's layout and flashtile.attention_varlen's arguments: q (total_q,
    heads_q, head_dim), k, v (total_k, heads_kv, head_dim); cu_seqlens_q, cu_seqlens_k int32
    (batch + 1,) JAX arrays (traced: their values may change between calls of one jitted
    function), seqused_k optional int32 (batch,). The library reads cu_seqlens on the host
    when the call runs (on CUDA: a copy ordered on XLA's stream, which waits for it).
    max_seqlen_q / max_seqlen_k: optional static bounds, checked when given.
    return_lse: also return the log-sum-exp, float32 (heads_q, total_q).
    deterministic, backend: as attention.

    Returns out, or (out, lse); differentiable in q, k, v, alibi_slopes and sinks.
    """
    api = "flashtile.jax.attention_varlen"
    opts = _options(api, causal, scale, window, softcap, backend, return_lse, deterministic,
                    max_seqlen_q, max_seqlen_k)
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    _check_tensors(api, 3, "3-D (total_tokens, heads, head_dim)", q=q, k=k, v=v)
    as_array = lambda x: None if x is None else jnp.asarray(x)
    cu_seqlens_q, cu_seqlens_k, seqused_k = (as_array(x) for x in (cu_seqlens_q, cu_seqlens_k,
                                                                   seqused_k))
    alibi_slopes, sinks = as_array(alibi_slopes), as_array(sinks)
    _check_small(api, jnp.int32, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                 seqused_k=seqused_k)
    _check_small(api, jnp.float32, alibi_slopes=alibi_slopes, sinks=sinks)
    return _attention_varlen(opts, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes,
                             sinks)
