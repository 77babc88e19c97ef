"""flashtile for PyTorch: a custom op that torch.compile can trace, and two drop-ins.

- ``torch.ops.flashtile.attention(q, k, v, causal, scale, backend) -> (out, lse)``: the op,
  BSHD, registered with ``torch.library.custom_op`` and a fake (meta) implementation, so
  ``torch.compile(fullgraph=True)`` keeps it in the graph. ``attention()`` below calls it.
- ``scaled_dot_product_attention``: the signature of
  ``torch.nn.functional.scaled_dot_product_attention`` (BHSD), for attn_mask=None and
  dropout_p=0 (anything else is refused with ValueError).
- ``flash_attn_func``: the signature of flash_attn's ``flash_attn_func`` (BSHD).

Gradients: the op's backward is a reference implementation in torch ops that
materialises P (O(N^2) memory): correct, traceable, not fast. flashtile's kernels are
forward-only.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _api

__all__ = ["attention", "scaled_dot_product_attention", "flash_attn_func"]


@torch.library.custom_op("flashtile::attention", mutates_args=(), device_types=("cpu", "cuda"))
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  scale: Optional[float], backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = _api.attention(q, k, v, causal=causal, scale=scale, return_lse=True,
                              backend=backend)
    return out, lse


@_attention_op.register_fake
def _attention_fake(q, k, v, causal, scale, backend):
    # What the real op allocates (flashtile._api: torch.empty, C-contiguous): out like q,
    # lse float32 (batch, heads_q, seqlen_q).
    torch._check(q.dim() == 4, lambda: f"flashtile: q must be 4-D (BSHD), got {q.dim()}-D")
    batch, seqlen_q, heads_q, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32, device=q.device)
    return out, lse


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, _backend = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal = causal
    ctx.scale = scale


def _backward(ctx, grad_out, grad_lse):
    """Reference backward in plain torch ops (fp32), from the saved lse.

    It materialises P (batch, heads_q, seqlen_q, seqlen_k): O(N^2) memory, unlike the
    forward. It exists so that gradients are right (and torch.compile/opcheck can trace
    them), not to be fast.
    """
    q, k, v, out, lse = ctx.saved_tensors
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    scale = ctx.scale if ctx.scale is not None else head_dim ** -0.5
    f32 = torch.float32
    Q = q.to(f32).transpose(1, 2)                                      # (B, Hq, Sq, D)
    K = k.to(f32).transpose(1, 2).repeat_interleave(group, dim=1)      # (B, Hq, Sk, D)
    V = v.to(f32).transpose(1, 2).repeat_interleave(group, dim=1)      # (B, Hq, Sk, D)
    O = out.to(f32).transpose(1, 2)                                    # (B, Hq, Sq, D)
    dO = grad_out.to(f32).transpose(1, 2)                              # (B, Hq, Sq, D)
    m = lse.unsqueeze(-1)                                              # (B, Hq, Sq, 1)
    S = torch.matmul(Q, K.transpose(-1, -2)) * scale                   # (B, Hq, Sq, Sk)
    if ctx.causal:  # bottom-right: query i sees key j when j <= i + seqlen_k - seqlen_q
        i = torch.arange(seqlen_q, device=q.device).unsqueeze(1)
        j = torch.arange(seqlen_k, device=q.device).unsqueeze(0)
        S = S.masked_fill(j > i + (seqlen_k - seqlen_q), float("-inf"))
    # P from the forward's lse; rows that saw no key (lse = -inf) have P = 0.
    P = torch.exp(S - m).masked_fill(torch.isneginf(m), 0.0)          # (B, Hq, Sq, Sk)
    dV = torch.matmul(P.transpose(-1, -2), dO)                         # (B, Hq, Sk, D)
    dP = torch.matmul(dO, V.transpose(-1, -2))                         # (B, Hq, Sq, Sk)
    # dS = P * (dP - rowsum(dO * O)) from out; + P * dlse since dlse/dS = P.
    dS = P * (dP - (dO * O).sum(-1, keepdim=True) + grad_lse.to(f32).unsqueeze(-1))
    dQ = torch.matmul(dS, K) * scale                                   # (B, Hq, Sq, D)
    dK = torch.matmul(dS.transpose(-1, -2), Q) * scale                 # (B, Hq, Sk, D)

    def to_input(grad, like):  # sum GQA groups, back to BSHD and the input dtype
        grad = grad.reshape(batch, heads_kv, -1, grad.shape[-2], head_dim).sum(2)
        return grad.transpose(1, 2).to(like.dtype)

    dq = dQ.transpose(1, 2).to(q.dtype)
    return dq, to_input(dK, k), to_input(dV, v), None, None, None


_attention_op.register_autograd(_backward, setup_context=_setup_context)


def _head_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    # The kernels read rows of head_dim elements: the head_dim stride must be 1. Any other
    # stride (a view, a transpose) is read in place; only this case costs a copy, as in
    # flash_attn's maybe_contiguous.
    return x if x.stride(-1) == 1 or x.size(-1) == 1 else x.contiguous()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: Optional[float] = None, return_lse: bool = False,
              backend: str = "auto"):
    """flashtile.attention through the torch op: BSHD tensors, traceable by torch.compile."""
    out, lse = _attention_op(_head_dim_contiguous(q), _head_dim_contiguous(k),
                             _head_dim_contiguous(v), causal, scale, backend)
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
            "is_causal")
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


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                    softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
                    deterministic: bool = False, return_attn_probs: bool = False):
    """Drop-in for flash_attn.flash_attn_func (BSHD tensors, causal aligned bottom-right).

    Returns out, or (out, softmax_lse) with return_attn_probs=True; lse is float32
    (batch, heads_q, seqlen_q). Sliding windows, softcap, ALiBi and dropout are refused with
    ValueError. flashtile is deterministic whatever `deterministic` says.
    """
    unsupported = []
    if dropout_p != 0.0:
        unsupported.append(f"dropout_p={dropout_p}")
    if tuple(window_size) != (-1, -1):
        unsupported.append(f"window_size={tuple(window_size)}")
    if softcap != 0.0:
        unsupported.append(f"softcap={softcap}")
    if alibi_slopes is not None:
        unsupported.append("alibi_slopes")
    if unsupported:
        raise ValueError("flashtile.torch.flash_attn_func: not supported: "
                         + ", ".join(unsupported))
    out, lse = attention(q, k, v, causal=causal, scale=softmax_scale, return_lse=True)
    return (out, lse) if return_attn_probs else out
