"""flashtile for PyTorch: custom ops that torch.compile can trace, and drop-ins.

- ``torch.ops.flashtile.attention(q, k, v, causal, scale, window_left, window_right, softcap,
  alibi_slopes, sinks, backend) -> (out, lse)``: BSHD; and
  ``torch.ops.flashtile.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
  max_seqlen_k, seqused_k, causal, scale, window_left, window_right, softcap, alibi_slopes,
  sinks, backend) -> (out, lse)``: packed (total_tokens, heads, head_dim). Both are
  registered with ``torch.library.custom_op`` and a fake (meta) implementation, so
  ``torch.compile(fullgraph=True)`` keeps them in the graph. ``attention()`` and
  ``attention_varlen()`` below call them.
- ``scaled_dot_product_attention``: the signature of
  ``torch.nn.functional.scaled_dot_product_attention`` (BHSD), for attn_mask=None and
  dropout_p=0 (anything else is refused with ValueError).
- ``flash_attn_func`` and ``flash_attn_varlen_func``: the signatures of flash_attn's.

Gradients: for CPU tensors (float32, float16, bfloat16) and CUDA tensors (float16,
bfloat16, head_dim <= 128) the ops' backward calls flashtile's backward kernels (cpu_flash;
cuda_mma on the GPU; O(N·d) memory) through two more custom ops,
``torch.ops.flashtile.attention_backward`` and ``attention_backward_varlen``; the sinks'
gradient, and a gradient flowing into the returned lse (their ``dlse`` argument), go through
the kernels too. Other cases take the reference backward instead, a plain-torch
implementation that materialises P (O(N^2) memory; for varlen O(total_q * total_k)): CUDA
tensors the CUDA kernels do not serve (float32, head_dim > 128) and ALiBi slopes that
require grad (the kernels give the slopes no gradient). float64 CPU tensors run the reference forward
and backward in float64 (the library's kernels take 16/32-bit floats): the path
torch.autograd.gradcheck checks. The reference stays the test oracle of the kernels.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _api

__all__ = ["attention", "attention_varlen", "scaled_dot_product_attention", "flash_attn_func",
           "flash_attn_varlen_func"]


# --- the ops ---------------------------------------------------------------------------------

@torch.library.custom_op("flashtile::attention", mutates_args=(), device_types=("cpu", "cuda"))
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  scale: Optional[float], window_left: int, window_right: int, softcap: float,
                  alibi_slopes: Optional[torch.Tensor], sinks: Optional[torch.Tensor],
                  backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    if q.dtype == torch.float64:
        return _reference_dense_forward(q, k, v, causal, scale, window_left, window_right,
                                        softcap, alibi_slopes, sinks)
    return _api.attention(q, k, v, causal=causal, scale=scale,
                          window=(window_left, window_right), softcap=softcap,
                          alibi_slopes=alibi_slopes, sinks=sinks, return_lse=True,
                          backend=backend)


@_attention_op.register_fake
def _attention_fake(q, k, v, causal, scale, window_left, window_right, softcap, alibi_slopes,
                    sinks, backend):
    # What the real op allocates (flashtile._api: torch.empty, C-contiguous): out like q,
    # lse float32 (batch, heads_q, seqlen_q).
    torch._check(q.dim() == 4, lambda: f"flashtile: q must be 4-D (BSHD), got {q.dim()}-D")
    batch, seqlen_q, heads_q, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads_q, seqlen_q), dtype=_lse_dtype(q), device=q.device)
    return out, lse


@torch.library.custom_op("flashtile::attention_varlen", mutates_args=(),
                         device_types=("cpu", "cuda"))
def _attention_varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                         max_seqlen_q: Optional[int], max_seqlen_k: Optional[int],
                         seqused_k: Optional[torch.Tensor], causal: bool, scale: Optional[float],
                         window_left: int, window_right: int, softcap: float,
                         alibi_slopes: Optional[torch.Tensor], sinks: Optional[torch.Tensor],
                         backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    if q.dtype == torch.float64:
        return _reference_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, causal,
                                         scale, window_left, window_right, softcap,
                                         alibi_slopes, sinks)
    return _api.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, seqused_k=seqused_k, causal=causal, scale=scale,
                                 window=(window_left, window_right), softcap=softcap,
                                 alibi_slopes=alibi_slopes, sinks=sinks, return_lse=True,
                                 backend=backend)


@_attention_varlen_op.register_fake
def _attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           seqused_k, causal, scale, window_left, window_right, softcap,
                           alibi_slopes, sinks, backend):
    # out like q (total_q, heads_q, head_dim), lse float32 (heads_q, total_q): shapes that
    # do not depend on the values of cu_seqlens.
    torch._check(q.dim() == 3,
                 lambda: f"flashtile: q must be 3-D (total_tokens, heads, head_dim), got {q.dim()}-D")
    total_q, heads_q, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((heads_q, total_q), dtype=_lse_dtype(q), device=q.device)
    return out, lse


def _lse_dtype(q: torch.Tensor) -> torch.dtype:
    """float32, or float64 for the float64 reference path."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


# --- the kernels' backward as ops ----------------------------------------------------------------

@torch.library.custom_op("flashtile::attention_backward", mutates_args=(),
                         device_types=("cpu", "cuda"))
def _attention_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                           v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                           dlse: Optional[torch.Tensor], causal: bool,
                           scale: Optional[float], window_left: int, window_right: int,
                           softcap: float, alibi_slopes: Optional[torch.Tensor],
                           sinks: Optional[torch.Tensor], deterministic: bool, backend: str
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsinks) from flashtile.attention_backward; dsinks is empty (0,) without
    sinks (an op cannot return None). dlse: the gradient into lse (float32, lse's shape,
    contiguous) or None."""
    grads = _api.attention_backward(
        dout, q, k, v, out, lse, causal=causal, scale=scale, window=(window_left, window_right),
        softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks, deterministic=deterministic,
        backend=backend, dlse=dlse)
    return grads if sinks is not None else grads + (_no_dsinks(q),)


def _no_dsinks(q: torch.Tensor) -> torch.Tensor:
    return torch.empty((0,), dtype=torch.float32, device=q.device)


def _backward_fake(dout, q, k, v, out, lse, dlse, *args):
    sinks = args[-3]
    heads_q = q.shape[-2]
    dsinks = (torch.empty((heads_q,), dtype=torch.float32, device=q.device) if sinks is not None
              else _no_dsinks(q))
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(k.shape, dtype=k.dtype, device=k.device),
            torch.empty(v.shape, dtype=v.dtype, device=v.device), dsinks)


_attention_backward_op.register_fake(_backward_fake)


@torch.library.custom_op("flashtile::attention_backward_varlen", mutates_args=(),
                         device_types=("cpu", "cuda"))
def _attention_backward_varlen_op(
        dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        out: torch.Tensor, lse: torch.Tensor, dlse: Optional[torch.Tensor],
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor], causal: bool,
        scale: Optional[float], window_left: int, window_right: int, softcap: float,
        alibi_slopes: Optional[torch.Tensor], sinks: Optional[torch.Tensor], deterministic: bool,
        backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """flashtile.attention_backward_varlen as attention_backward's op."""
    grads = _api.attention_backward_varlen(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k=seqused_k, causal=causal,
        scale=scale, window=(window_left, window_right), softcap=softcap,
        alibi_slopes=alibi_slopes, sinks=sinks, deterministic=deterministic, backend=backend,
        dlse=dlse)
    return grads if sinks is not None else grads + (_no_dsinks(q),)


_attention_backward_varlen_op.register_fake(_backward_fake)


# --- the reference backward --------------------------------------------------------------------

def _window_visible(rel: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """Key j is visible to query i when rel = j - (i + seqlen_k - seqlen_q) lies in
    [-left, right] (-1: that side unbounded); rel is computed per sequence by the caller."""
    visible = torch.ones_like(rel, dtype=torch.bool)
    if left >= 0:
        visible &= rel >= -left
    if right >= 0:
        visible &= rel <= right
    return visible


def _dense_geometry(seqlen_q: int, seqlen_k: int, left: int, right: int, device):
    """(visible, distance), both (1, 1, Sq, Sk): the mask and the ALiBi distance |rel|."""
    i = torch.arange(seqlen_q, device=device).unsqueeze(1)
    j = torch.arange(seqlen_k, device=device).unsqueeze(0)
    rel = j - (i + seqlen_k - seqlen_q)                                 # (Sq, Sk)
    return _window_visible(rel, left, right)[None, None], rel.abs().float()[None, None]


def _varlen_geometry(cu_seqlens_q, cu_seqlens_k, seqused_k, total_q: int, total_k: int,
                     left: int, right: int, device):
    """(visible, distance) of a packed batch, both (1, 1, total_q, total_k), and the
    sequence of every query row (total_q,): a block-diagonal mask, each block aligned to
    its own sequence's lengths, built without reading cu_seqlens on the host."""
    cu_q, cu_k = cu_seqlens_q.long(), cu_seqlens_k.long()
    batch = cu_q.numel() - 1
    rows = torch.arange(total_q, device=device)
    cols = torch.arange(total_k, device=device)
    # Row r belongs to the sequence b with cu[b] <= r < cu[b+1] (empty sequences own none);
    # key rows past cu_k[batch] get b = batch, which no query row has.
    seq_q = torch.searchsorted(cu_q[1:], rows, right=True)             # (Tq,)
    seq_k = torch.searchsorted(cu_k[1:], cols, right=True)             # (Tk,)
    seq_k_clamped = seq_k.clamp(max=batch - 1)
    len_q = cu_q[1:] - cu_q[:-1]                                        # (batch,)
    len_k = seqused_k.long() if seqused_k is not None else cu_k[1:] - cu_k[:-1]
    i = rows - cu_q[seq_q]                                              # position in its sequence
    j = cols - cu_k[seq_k_clamped]
    key_used = (j >= 0) & (j < len_k[seq_k_clamped])                    # (Tk,)
    offset = (len_k - len_q)[seq_q]                                     # (Tq,)
    rel = j.unsqueeze(0) - (i + offset).unsqueeze(1)                    # (Tq, Tk)
    visible = ((seq_q.unsqueeze(1) == seq_k.unsqueeze(0)) & key_used.unsqueeze(0)
               & _window_visible(rel, left, right))
    return visible[None, None], rel.abs().float()[None, None], seq_q


def _logits(Q, K, visible, distance, slope, scale, softcap):
    """S (G, H, Sq, Sk) with every variant, -inf where masked, and tanh(S_raw / softcap)
    (None without a softcap)."""
    S = torch.matmul(Q, K.transpose(-1, -2)) * scale                   # (G, H, Sq, Sk)
    capped = None
    if softcap:
        capped = torch.tanh(S / softcap)
        S = softcap * capped
    if slope is not None:
        S = S - slope * distance
    return S.masked_fill(~visible, float("-inf")), capped


def _reference_forward(Q, K, V, visible, distance, slope, sink, scale, softcap):
    """Standard attention (out (G, H, Sq, D), lse (G, H, Sq)) in the precision of Q: the
    float64 path's forward. A row with no visible key and no sink gives 0 and -inf."""
    S, _ = _logits(Q, K, visible, distance, slope, scale, softcap)
    scores = S if sink is None else torch.cat([S, sink.expand(*S.shape[:-1], 1)], dim=-1)
    lse = torch.logsumexp(scores, dim=-1)                               # (G, H, Sq)
    m = lse.unsqueeze(-1)
    P = torch.exp(S - m).masked_fill(torch.isneginf(m), 0.0)
    return torch.matmul(P, V), lse


def _scores_backward(Q, K, V, O, dO, lse, dlse, visible, distance, slope, sink, scale,
                     softcap):
    """Gradients of standard attention with every variant, recomputed from the forward's lse.

    Q, O, dO (G, H, Sq, D); K, V (G, H, Sk, D) with the kv heads already expanded; lse,
    dlse (G, H, Sq); visible, distance broadcastable to (G, H, Sq, Sk); slope broadcastable
    to (G, H, Sq, 1) or None; sink (1, H, 1, 1) or None. Returns dQ, dK, dV (expanded
    heads), the ALiBi term -Σ_j dS·|rel| (G, H, Sq) or None, and the sink gradient (H,)
    or None.
    """
    S, capped = _logits(Q, K, visible, distance, slope, scale, softcap)
    m = lse.unsqueeze(-1)                                               # (G, H, Sq, 1)
    empty = torch.isneginf(m)  # rows that saw no key and no sink: P = 0
    P = torch.exp(S - m).masked_fill(empty, 0.0)                        # (G, H, Sq, Sk)
    dV = torch.matmul(P.transpose(-1, -2), dO)                          # (G, H, Sk, D)
    dP = torch.matmul(dO, V.transpose(-1, -2))                          # (G, H, Sq, Sk)
    # D = rowsum(dO * O) from the output; the lse gradient adds P (dlse/dS = P).
    D = (dO * O).sum(-1, keepdim=True)                                  # (G, H, Sq, 1)
    g = dlse.unsqueeze(-1)                                              # (G, H, Sq, 1)
    dS = P * (dP - D + g)                                               # (G, H, Sq, Sk)
    alibi_term = -(dS * distance).sum(-1) if slope is not None else None
    dsink = None
    if sink is not None:
        # The sink is a key of logit s and value 0: dS_sink = P_sink * (0 - D + dlse).
        P_sink = torch.exp(sink - m).masked_fill(empty, 0.0)            # (G, H, Sq, 1)
        dsink = (P_sink * (g - D)).sum(dim=(0, 2, 3))                   # (H,)
    if capped is not None:
        dS = dS * (1.0 - capped * capped)
    dQ = torch.matmul(dS, K) * scale                                    # (G, H, Sq, D)
    dK = torch.matmul(dS.transpose(-1, -2), Q) * scale                  # (G, H, Sk, D)
    return dQ, dK, dV, alibi_term, dsink


def _expand_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.repeat_interleave(group, dim=1)


def _sum_kv_groups(grad: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """(G, Hq, S, D) -> (G, Hkv, S, D): GQA sums the gradients of a kv head's query heads."""
    g, _, s, d = grad.shape
    return grad.reshape(g, heads_kv, -1, s, d).sum(2)


def _window(causal: bool, left: int, right: int) -> tuple[int, int]:
    """The library's window rule: causal is right = 0; -1 (or wider) is unbounded."""
    return left, 0 if causal else right


def _kernel_backend(backend: str) -> str:
    """The backward's backend: the forward's when it has a backward, else automatic (which
    also stands for cuda_sm90, whose backward takes fewer head dims than its forward)."""
    return backend if backend in ("cpu_flash", "cpu_reference", "cuda_mma") else "auto"


def _use_kernels(ctx, q: torch.Tensor, slopes_index: int) -> bool:
    """Whether the kernels can give this backward (see the module docstring). Decided from
    devices, dtypes and which gradients exist, never from values, so tracing sees one path."""
    if q.device.type == "cpu":
        served = q.dtype != torch.float64
    else:  # cuda_mma's backward (cuda_sm90's takes a subset): 16-bit, head_dim up to 128
        served = q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 128
    return served and not ctx.needs_input_grad[slopes_index]


def _kernel_lse_gradient(grad_lse):
    """The gradient into lse as the kernels take it (float32, contiguous), or None."""
    return None if grad_lse is None else grad_lse.to(torch.float32).contiguous()


def _acc_dtype(q: torch.Tensor) -> torch.dtype:
    """The reference backward's precision: float64 on the float64 path, else float32."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _reference_dense_forward(q, k, v, causal, scale, left, right, softcap, alibi_slopes, sinks):
    """The dense op's float64 forward, in torch ops: (out BSHD, lse (B, Hq, Sq))."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = scale if scale is not None else head_dim ** -0.5
    visible, distance = _dense_geometry(seqlen_q, seqlen_k, *_window(causal, left, right), q.device)
    slope = _dense_slope(alibi_slopes, heads_q, q.dtype)
    sink = sinks.to(q.dtype).reshape(1, heads_q, 1, 1) if sinks is not None else None
    group = heads_q // heads_kv
    bhsd = lambda x: x.transpose(1, 2)                                  # BSHD -> (B, H, S, D)
    out, lse = _reference_forward(bhsd(q), _expand_kv(bhsd(k), group), _expand_kv(bhsd(v), group),
                                  visible, distance.to(q.dtype), slope, sink, scale, softcap)
    return out.transpose(1, 2).contiguous(), lse


def _dense_slope(alibi_slopes, heads_q: int, dtype):
    """(Hq) or (B, Hq) slopes -> broadcastable to (B, Hq, Sq, 1), or None."""
    if alibi_slopes is None:
        return None
    return alibi_slopes.to(dtype).reshape(-1 if alibi_slopes.dim() == 2 else 1, heads_q, 1, 1)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, left, right, softcap, alibi_slopes, sinks, backend = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, sinks)
    ctx.causal, ctx.left, ctx.right = causal, left, right
    ctx.window = _window(causal, left, right)
    ctx.scale, ctx.softcap, ctx.backend = scale, softcap, backend
    ctx.set_materialize_grads(False)  # an unused lse gives None: the kernels' case


def _backward(ctx, grad_out, grad_lse):
    """The kernels' backward where they serve the call, else the reference (see the module
    docstring)."""
    q, k, v, out, lse, alibi_slopes, sinks = ctx.saved_tensors
    if grad_out is None and grad_lse is None:
        return (None,) * 11
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    if _use_kernels(ctx, q, 8):
        dq, dk, dv, dsinks = _attention_backward_op(
            _head_dim_contiguous(grad_out), q, k, v, out, lse, _kernel_lse_gradient(grad_lse),
            ctx.causal, ctx.scale, ctx.left, ctx.right, ctx.softcap, alibi_slopes, sinks, False,
            _kernel_backend(ctx.backend))
        dsinks = dsinks.to(sinks.dtype) if sinks is not None and ctx.needs_input_grad[9] else None
        return dq, dk, dv, None, None, None, None, None, None, dsinks, None
    return _reference_dense_backward(ctx, q, k, v, out, lse, alibi_slopes, sinks, grad_out,
                                     grad_lse)


def _reference_dense_backward(ctx, q, k, v, out, lse, alibi_slopes, sinks, grad_out, grad_lse):
    """Reference backward in plain torch ops (fp32; fp64 on the float64 path), from the saved
    lse (O(N^2) memory)."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    scale = ctx.scale if ctx.scale is not None else head_dim ** -0.5
    acc = _acc_dtype(q)
    if grad_lse is None:
        grad_lse = torch.zeros_like(lse)
    bhsd = lambda x: x.to(acc).transpose(1, 2)                          # BSHD -> (B, H, S, D)
    visible, distance = _dense_geometry(seqlen_q, seqlen_k, *ctx.window, q.device)
    slope = _dense_slope(alibi_slopes, heads_q, acc)
    sink = sinks.to(acc).reshape(1, heads_q, 1, 1) if sinks is not None else None
    dQ, dK, dV, alibi_term, dsink = _scores_backward(
        bhsd(q), _expand_kv(bhsd(k), group), _expand_kv(bhsd(v), group), bhsd(out),
        bhsd(grad_out), lse.to(acc), grad_lse.to(acc), visible, distance.to(acc), slope, sink,
        scale, ctx.softcap)
    dslopes = None
    if alibi_term is not None and ctx.needs_input_grad[8]:
        dslopes = alibi_term.sum(-1)                                    # (B, Hq)
        dslopes = (dslopes if alibi_slopes.dim() == 2 else dslopes.sum(0)).to(alibi_slopes.dtype)
    dsinks = dsink.to(sinks.dtype) if dsink is not None and ctx.needs_input_grad[9] else None
    back = lambda grad, like: grad.transpose(1, 2).to(like.dtype)        # -> BSHD, input dtype
    return (back(dQ, q), back(_sum_kv_groups(dK, heads_kv), k),
            back(_sum_kv_groups(dV, heads_kv), v), None, None, None, None, None, dslopes,
            dsinks, None)


_attention_op.register_autograd(_backward, setup_context=_setup_context)


def _varlen_slope(alibi_slopes, seq_q, heads_q: int, dtype):
    """(Hq) -> (1, Hq, 1, 1); (B, Hq) -> each packed row's sequence (1, Hq, Tq, 1); or None."""
    if alibi_slopes is None:
        return None
    slopes = alibi_slopes.to(dtype)
    return (slopes[seq_q].transpose(0, 1)[None, :, :, None] if slopes.dim() == 2
            else slopes.reshape(1, heads_q, 1, 1))


def _reference_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, causal, scale,
                              left, right, softcap, alibi_slopes, sinks):
    """The varlen op's float64 forward: (out (Tq, Hq, D), lse (Hq, Tq))."""
    total_q, heads_q, head_dim = q.shape
    total_k, heads_kv = k.shape[0], k.shape[1]
    scale = scale if scale is not None else head_dim ** -0.5
    visible, distance, seq_q = _varlen_geometry(cu_seqlens_q, cu_seqlens_k, seqused_k, total_q,
                                                total_k, *_window(causal, left, right), q.device)
    slope = _varlen_slope(alibi_slopes, seq_q, heads_q, q.dtype)
    sink = sinks.to(q.dtype).reshape(1, heads_q, 1, 1) if sinks is not None else None
    group = heads_q // heads_kv
    hsd = lambda x: x.transpose(0, 1).unsqueeze(0)                     # (T, H, D) -> (1, H, T, D)
    out, lse = _reference_forward(hsd(q), _expand_kv(hsd(k), group), _expand_kv(hsd(v), group),
                                  visible, distance.to(q.dtype), slope, sink, scale, softcap)
    return out[0].transpose(0, 1).contiguous(), lse[0]


def _setup_varlen_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, _max_q, _max_k, seqused_k, causal, scale, left, right,
     softcap, alibi_slopes, sinks, backend) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                          alibi_slopes, sinks)
    ctx.causal, ctx.left, ctx.right = causal, left, right
    ctx.window = _window(causal, left, right)
    ctx.scale, ctx.softcap, ctx.backend = scale, softcap, backend
    ctx.set_materialize_grads(False)


def _varlen_backward(ctx, grad_out, grad_lse):
    """The kernels' varlen backward where they serve the call, else the reference."""
    (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes,
     sinks) = ctx.saved_tensors
    if grad_out is None and grad_lse is None:
        return (None,) * 16
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    if _use_kernels(ctx, q, 13):
        dq, dk, dv, dsinks = _attention_backward_varlen_op(
            _head_dim_contiguous(grad_out), q, k, v, out, lse, _kernel_lse_gradient(grad_lse),
            cu_seqlens_q, cu_seqlens_k,
            seqused_k, ctx.causal, ctx.scale, ctx.left, ctx.right, ctx.softcap, alibi_slopes,
            sinks, False, _kernel_backend(ctx.backend))
        dsinks = dsinks.to(sinks.dtype) if sinks is not None and ctx.needs_input_grad[14] else None
        return (dq, dk, dv) + (None,) * 11 + (dsinks, None)
    return _reference_varlen_backward(ctx, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                      seqused_k, alibi_slopes, sinks, grad_out, grad_lse)


def _reference_varlen_backward(ctx, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                               alibi_slopes, sinks, grad_out, grad_lse):
    """The reference backward over the packed batch as one block-diagonal problem."""
    total_q, heads_q, head_dim = q.shape
    total_k, heads_kv = k.shape[0], k.shape[1]
    group = heads_q // heads_kv
    scale = ctx.scale if ctx.scale is not None else head_dim ** -0.5
    acc = _acc_dtype(q)
    if grad_lse is None:
        grad_lse = torch.zeros_like(lse)
    hsd = lambda x: x.to(acc).transpose(0, 1).unsqueeze(0)              # (T, H, D) -> (1, H, T, D)
    visible, distance, seq_q = _varlen_geometry(cu_seqlens_q, cu_seqlens_k, seqused_k,
                                                total_q, total_k, *ctx.window, q.device)
    slope = _varlen_slope(alibi_slopes, seq_q, heads_q, acc)
    sink = sinks.to(acc).reshape(1, heads_q, 1, 1) if sinks is not None else None
    dQ, dK, dV, alibi_term, dsink = _scores_backward(
        hsd(q), _expand_kv(hsd(k), group), _expand_kv(hsd(v), group), hsd(out), hsd(grad_out),
        lse.to(acc).unsqueeze(0), grad_lse.to(acc).unsqueeze(0), visible, distance.to(acc),
        slope, sink, scale, ctx.softcap)
    dslopes = None
    if alibi_term is not None and ctx.needs_input_grad[13]:
        per_row = alibi_term[0].transpose(0, 1)                         # (Tq, Hq)
        if alibi_slopes.dim() == 2:
            dslopes = torch.zeros(alibi_slopes.shape, dtype=acc, device=q.device)
            dslopes = dslopes.index_add(0, seq_q, per_row)
        else:
            dslopes = per_row.sum(0)
        dslopes = dslopes.to(alibi_slopes.dtype)
    dsinks = dsink.to(sinks.dtype) if dsink is not None and ctx.needs_input_grad[14] else None
    back = lambda grad, like: grad[0].transpose(0, 1).to(like.dtype)    # -> (T, H, D)
    return (back(dQ, q), back(_sum_kv_groups(dK, heads_kv), k),
            back(_sum_kv_groups(dV, heads_kv), v), None, None, None, None, None, None, None,
            None, None, None, dslopes, dsinks, None)


_attention_varlen_op.register_autograd(_varlen_backward, setup_context=_setup_varlen_context)


# --- Python entry points -------------------------------------------------------------------------

def _head_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    # The kernels read rows of head_dim elements: the head_dim stride must be 1. Any other
    # stride (a view, a transpose) is read in place; only this case costs a copy, as in
    # flash_attn's maybe_contiguous.
    return x if x.stride(-1) == 1 or x.size(-1) == 1 else x.contiguous()


def _window_pair(window, api: str) -> tuple[int, int]:
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(f"{api}: window must be a pair (left, right), -1 for an unbounded "
                         f"side, got {window!r}") from None
    return int(left), int(right)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: Optional[float] = None, window=(-1, -1), softcap: float = 0.0,
              alibi_slopes: Optional[torch.Tensor] = None, sinks: Optional[torch.Tensor] = None,
              return_lse: bool = False, backend: str = "auto"):
    """flashtile.attention through the torch op: BSHD tensors, autograd, torch.compile.

    The arguments of flashtile.attention (window (left, right), softcap, alibi_slopes
    float32 (heads_q) or (batch, heads_q), sinks float32 (heads_q)); gradients flow to q,
    k, v, alibi_slopes and sinks. Returns out, or (out, lse) with lse float32
    (batch, heads_q, seqlen_q).
    """
    left, right = _window_pair(window, "flashtile.torch.attention")
    out, lse = _attention_op(_head_dim_contiguous(q), _head_dim_contiguous(k),
                             _head_dim_contiguous(v), bool(causal), scale, left, right,
                             float(softcap or 0.0), alibi_slopes, sinks, backend)
    return (out, lse) if return_lse else out


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                     max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None, *,
                     seqused_k: Optional[torch.Tensor] = None, causal: bool = False,
                     scale: Optional[float] = None, window=(-1, -1), softcap: float = 0.0,
                     alibi_slopes: Optional[torch.Tensor] = None,
                     sinks: Optional[torch.Tensor] = None, return_lse: bool = False,
                     backend: str = "auto"):
    """flashtile.attention_varlen through the torch op: packed tensors, autograd, compile.

    q (total_q, heads_q, head_dim), k/v (total_k, heads_kv, head_dim), int32 cu_seqlens
    (batch + 1) on q's device; the variant arguments as attention(). Returns out, or
    (out, lse) with lse float32 (heads_q, total_q).
    """
    left, right = _window_pair(window, "flashtile.torch.attention_varlen")
    out, lse = _attention_varlen_op(
        _head_dim_contiguous(q), _head_dim_contiguous(k), _head_dim_contiguous(v), cu_seqlens_q,
        cu_seqlens_k, None if max_seqlen_q is None else int(max_seqlen_q),
        None if max_seqlen_k is None else int(max_seqlen_k), seqused_k, bool(causal), scale,
        left, right, float(softcap or 0.0), alibi_slopes, sinks, backend)
    return (out, lse) if return_lse else out


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """Drop-in for torch.nn.functional.scaled_dot_product_attention (BHSD tensors).

    query (batch, heads_q, L, E), key/value (batch, heads_kv, S, E). Causal follows SDPA:
    aligned top-left (query i sees keys j <= i) when L != S. GQA needs enable_gqa=True, as
    in SDPA. Returns (batch, heads_q, L, E), a transposed view of a BSHD buffer (as SDPA's
    flash backend returns). The BHSD -> BSHD transposes are views: no copies.
    """
    if attn_mask is not None:
        raise ValueError(
            "flashtile.torch.scaled_dot_product_attention: attn_mask is not supported "
            "(flashtile applies no mask other than causal); pass attn_mask=None and use "
            "is_causal, or flashtile.torch.attention's window")
    if dropout_p != 0.0:
        raise ValueError(
            "flashtile.torch.scaled_dot_product_attention: dropout_p must be 0.0 "
            f"(flashtile has no dropout), got {dropout_p}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != 4:
            raise ValueError(
                f"flashtile.torch.scaled_dot_product_attention: {name} must be 4-D "
                f"(batch, heads, seqlen, head_dim), got {t.dim()}-D")
    if key.size(1) != query.size(1) and not enable_gqa:
        raise ValueError(
            "flashtile.torch.scaled_dot_product_attention: query has "
            f"{query.size(1)} heads and key {key.size(1)}: pass enable_gqa=True for GQA/MQA")
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # BSHD views
    seqlen_q, seqlen_k = q.size(1), k.size(1)
    if not is_causal or seqlen_q == seqlen_k:
        out = attention(q, k, v, causal=is_causal, scale=scale)
    elif seqlen_q < seqlen_k:
        # Top-left: query i sees keys 0..i, so keys past seqlen_q are never seen; on the
        # first seqlen_q keys top-left and flashtile's bottom-right alignment agree.
        out = attention(q, k[:, :seqlen_q], v[:, :seqlen_q], causal=True, scale=scale)
    else:
        # Top-left with more queries than keys: the first seqlen_k queries are a square
        # causal problem, the remaining ones see every key.
        head = attention(q[:, :seqlen_k], k, v, causal=True, scale=scale)
        tail = attention(q[:, seqlen_k:], k, v, causal=False, scale=scale)
        out = torch.cat([head, tail], dim=1)
    return out.transpose(1, 2)


def _refuse_dropout(api: str, dropout_p: float):
    if dropout_p != 0.0:
        raise ValueError(f"flashtile.torch.{api}: dropout_p must be 0.0 (flashtile has no "
                         f"dropout), got {dropout_p}")


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                    softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
                    deterministic: bool = False, return_attn_probs: bool = False):
    """Drop-in for flash_attn.flash_attn_func (BSHD tensors, causal aligned bottom-right).

    window_size (left, right), softcap and alibi_slopes (float32 (heads) or
    (batch, heads)) as in flash_attn. Returns out, or flash_attn's (out, softmax_lse,
    S_dmask) with return_attn_probs=True: lse float32 (batch, heads_q, seqlen_q), and
    S_dmask None (flashtile never forms the probabilities). dropout_p must be 0
    (ValueError otherwise); flashtile is deterministic whatever `deterministic` says.
    """
    _refuse_dropout("flash_attn_func", dropout_p)
    out, lse = attention(q, k, v, causal=causal, scale=softmax_scale, window=window_size,
                         softcap=softcap, alibi_slopes=alibi_slopes, return_lse=True)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Optional[torch.Tensor] = None,
                           deterministic: bool = False, return_attn_probs: bool = False,
                           block_table: Optional[torch.Tensor] = None):
    """Drop-in for flash_attn.flash_attn_varlen_func (packed tensors).

    q (total_q, heads_q, head_dim), k/v (total_k, heads_kv, head_dim), int32 cu_seqlens
    (batch + 1); max_seqlen_q/k are checked against the sequences. Returns out, or
    (out, softmax_lse, None) with return_attn_probs=True, lse float32 (heads_q, total_q).
    dropout_p must be 0 and block_table None (paged KV is not supported): ValueError.
    """
    _refuse_dropout("flash_attn_varlen_func", dropout_p)
    if block_table is not None:
        raise ValueError("flashtile.torch.flash_attn_varlen_func: block_table (paged KV) is "
                         "not supported; pass contiguous packed k and v")
    out, lse = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                causal=causal, scale=softmax_scale, window=window_size,
                                softcap=softcap, alibi_slopes=alibi_slopes, return_lse=True)
    return (out, lse, None) if return_attn_probs else out
