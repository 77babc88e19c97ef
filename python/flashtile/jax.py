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
- grad: jax.custom_vjp. The backward is, for now, the interim reference _reference_backward:
  plain jnp ops recomputing the scores from the saved LSE (O(seqlen_q * seqlen_k) memory per
  head, every variant, gradients for ALiBi slopes and sinks too), until flashtile's backward
  kernels land; swapping them in replaces that one function (_reference_backward_varlen
  for attention_varlen).
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
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
    # varlen only
    max_seqlen_q: Optional[int] = None
    max_seqlen_k: Optional[int] = None


def _options(api: str, causal, scale, window, softcap, backend, return_lse,
             max_seqlen_q=None, max_seqlen_k=None) -> _Options:
    static = dict(causal=causal, scale=scale, window=window, softcap=softcap, backend=backend,
                  return_lse=return_lse, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    for name, value in static.items():
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(value)):
            raise TypeError(f"{api}: {name} is a static option, but got a traced value: under "
                            f"jax.jit pass it through static_argnames (or a closure)")
    for name, flag in (("causal", causal), ("return_lse", return_lse)):
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
                    optional_int(max_seqlen_q), optional_int(max_seqlen_k))


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

def _ffi_attrs(opts: _Options, has_alibi: bool, has_sinks: bool, has_seqused_k: bool) -> dict:
    """The attributes python/src/jax_ffi.cpp decodes (CallAttrs), with their exact types."""
    return dict(causal=np.bool_(opts.causal), has_scale=np.bool_(opts.scale is not None),
                scale=np.float32(0.0 if opts.scale is None else opts.scale),
                window_left=np.int64(opts.window[0]), window_right=np.int64(opts.window[1]),
                softcap=np.float32(opts.softcap), has_alibi_slopes=np.bool_(has_alibi),
                has_sinks=np.bool_(has_sinks), has_seqused_k=np.bool_(has_seqused_k),
                max_seqlen_q=np.int64(-1 if opts.max_seqlen_q is None else opts.max_seqlen_q),
                max_seqlen_k=np.int64(-1 if opts.max_seqlen_k is None else opts.max_seqlen_k),
                backend=opts.backend)


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


@functools.lru_cache(maxsize=None)
def _dense_kernel(opts: _Options, with_lse: bool, has_alibi: bool, has_sinks: bool):
    """The custom call as a function of arrays only, with its batching rule."""

    def split(extras):
        extras = list(extras)
        alibi = extras.pop(0) if has_alibi else None
        sinks = extras.pop(0) if has_sinks else None
        return alibi, sinks

    @jax.custom_batching.custom_vmap
    def kernel(q, k, v, *extras):
        return _call_dense(opts, with_lse, q, k, v, *split(extras))

    @kernel.def_vmap
    def rule(axis_size, in_batched, q, k, v, *extras):
        q_b, k_b, v_b, *extras_b = in_batched
        alibi, sinks = split(extras)
        alibi_b, sinks_b = split(extras_b)
        if sinks_b:  # sinks are per head: no batch dimension to fold into
            return _map_slices(kernel, axis_size, in_batched, (q, k, v, *extras))
        batch = q.shape[1] if q_b else q.shape[0]
        if alibi is not None and (alibi_b or alibi.ndim == 2):
            # (V, H) or (V, B, H) or unbatched (B, H) -> (V*B, H): one row per folded batch.
            per_batch = alibi if alibi_b else jnp.broadcast_to(alibi, (axis_size,) + alibi.shape)
            if per_batch.ndim == 2:
                per_batch = jnp.broadcast_to(per_batch[:, None], (axis_size, batch)
                                             + per_batch.shape[1:])
            alibi = per_batch.reshape((-1,) + per_batch.shape[2:])
        # Through `kernel` again, so that an enclosing vmap folds its own axis in turn.
        out = kernel(_fold(q, axis_size, q_b), _fold(k, axis_size, k_b),
                     _fold(v, axis_size, v_b), *[x for x in (alibi, sinks) if x is not None])
        if with_lse:
            return tuple(_unfold(x, axis_size) for x in out), (True, True)
        return _unfold(out, axis_size), True

    return kernel


def _forward_dense(opts: _Options, with_lse: bool, q, k, v, alibi_slopes, sinks):
    kernel = _dense_kernel(opts, with_lse, alibi_slopes is not None, sinks is not None)
    return kernel(q, k, v, *[x for x in (alibi_slopes, sinks) if x is not None])


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


@functools.lru_cache(maxsize=None)
def _varlen_kernel(opts: _Options, with_lse: bool, given: tuple):
    """The varlen custom call as a function of arrays only; `given` says which of
    (seqused_k, alibi_slopes, sinks) follow cu_seqlens_k. Under vmap the mapped calls run
    one after another: a packed batch has no free dimension to fold the mapped axis into."""

    def unpack(extras):
        extras = list(extras)
        return [extras.pop(0) if present else None for present in given]

    @jax.custom_batching.custom_vmap
    def kernel(q, k, v, cu_seqlens_q, cu_seqlens_k, *extras):
        return _call_varlen(opts, with_lse, q, k, v, cu_seqlens_q, cu_seqlens_k,
                            *unpack(extras))

    @kernel.def_vmap
    def rule(axis_size, in_batched, *args):
        return _map_slices(kernel, axis_size, in_batched, args)

    return kernel


def _forward_varlen(opts: _Options, with_lse: bool, q, k, v, cu_seqlens_q, cu_seqlens_k,
                    seqused_k, alibi_slopes, sinks):
    optional = (seqused_k, alibi_slopes, sinks)
    kernel = _varlen_kernel(opts, with_lse, tuple(x is not None for x in optional))
    return kernel(q, k, v, cu_seqlens_q, cu_seqlens_k, *[x for x in optional if x is not None])


# --- the interim reference backward -------------------------------------------------------------

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
    """The interim backward of attention (plain jnp, O(Sq*Sk) per head): dq, dk, dv (dtypes of
    q, k, v), dalibi_slopes and dsinks (None when not given). flashtile's backward kernels
    replace this function."""
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
    dsinks; flashtile's varlen backward kernel replaces this function."""
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


# --- attention with its vjp ---------------------------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(opts: _Options, q, k, v, alibi_slopes, sinks):
    return _forward_dense(opts, opts.return_lse, q, k, v, alibi_slopes, sinks)


def _attention_fwd(opts: _Options, q, k, v, alibi_slopes, sinks):
    out, lse = _forward_dense(opts, True, q, k, v, alibi_slopes, sinks)
    primal = (out, lse) if opts.return_lse else out
    return primal, (q, k, v, alibi_slopes, sinks, out, lse)


def _attention_bwd(opts: _Options, residuals, cotangent):
    q, k, v, alibi_slopes, sinks, out, lse = residuals
    dout, dlse = cotangent if opts.return_lse else (cotangent, jnp.zeros_like(lse))
    return _reference_backward(opts, q, k, v, alibi_slopes, sinks, out, lse, dout, dlse)


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(q, k, v, *, causal: bool = False, scale: float | None = None, window=(-1, -1),
              softcap: float = 0.0, alibi_slopes=None, sinks=None, return_lse: bool = False,
              backend: str = "auto"):
    """Exact attention softmax(q·kᵀ·scale)·v as an XLA custom call (jit, vmap, grad).

    q: (batch, seqlen_q, heads_q, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim),
    heads_q a multiple of heads_kv; float32, float16 or bfloat16 (all three alike) on the CPU
    or a CUDA device. float32 on CUDA runs through cuda_tiled, which takes full and causal
    attention only; 16-bit CUDA calls run cuda_mma with every variant.
    causal, scale, window, softcap, alibi_slopes, sinks: as flashtile.attention
    (alibi_slopes float32 (heads_q) or (batch, heads_q); sinks float32 (heads_q)). The
    scalar options are static: under jax.jit pass them through static_argnames or a closure.
    return_lse: also return the log-sum-exp, float32 (batch, heads_q, seqlen_q).
    backend: "auto" or a name from flashtile.backends() of q's device.

    Returns out (like q), or (out, lse). Differentiable in q, k, v, alibi_slopes and sinks
    (and through lse); see the module docstring for the interim backward.
    """
    api = "flashtile.jax.attention"
    opts = _options(api, causal, scale, window, softcap, backend, return_lse)
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
    out, lse = _forward_varlen(opts, True, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                               alibi_slopes, sinks)
    primal = (out, lse) if opts.return_lse else out
    return primal, (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes, sinks, out,
                    lse)


def _attention_varlen_bwd(opts: _Options, residuals, cotangent):
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes, sinks, out, lse = residuals
    dout, dlse = cotangent if opts.return_lse else (cotangent, jnp.zeros_like(lse))
    dq, dk, dv, dslopes, dsinks = _reference_backward_varlen(
        opts, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes, sinks, out, lse,
        dout, dlse)
    return dq, dk, dv, None, None, None, dslopes, dsinks  # no gradient for the int32 arrays


_attention_varlen.defvjp(_attention_varlen_fwd, _attention_varlen_bwd)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int | None = None,
                     max_seqlen_k: int | None = None, *, seqused_k=None, causal: bool = False,
                     scale: float | None = None, window=(-1, -1), softcap: float = 0.0,
                     alibi_slopes=None, sinks=None, return_lse: bool = False,
                     backend: str = "auto"):
    """Exact attention over a packed batch of variable-length sequences, as a custom call.

    flash_attn_varlen_func's layout and flashtile.attention_varlen's arguments: q (total_q,
    heads_q, head_dim), k, v (total_k, heads_kv, head_dim); cu_seqlens_q, cu_seqlens_k int32
    (batch + 1,) JAX arrays (traced: their values may change between calls of one jitted
    function), seqused_k optional int32 (batch,). The library reads cu_seqlens on the host
    when the call runs (on CUDA: a copy ordered on XLA's stream, which waits for it).
    max_seqlen_q / max_seqlen_k: optional static bounds, checked when given.
    return_lse: also return the log-sum-exp, float32 (heads_q, total_q).

    Returns out, or (out, lse); differentiable in q, k, v, alibi_slopes and sinks.
    """
    api = "flashtile.jax.attention_varlen"
    opts = _options(api, causal, scale, window, softcap, backend, return_lse, max_seqlen_q,
                    max_seqlen_k)
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
