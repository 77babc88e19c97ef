"""attn_implementation="FlashTile" for Hugging Face transformers (5.x).

    import flashtile.integrations.transformers as ft_hf
    ft_hf.register()
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="FlashTile")

Why "FlashTile" and not "flashtile": transformers treats every implementation name that
contains the lower-case "flash" as a FlashAttention kernel to fetch from its hub
(transformers.utils.generic.is_flash_attention_requested: `"flash" in name`), so the name
"flashtile" fails in set_attn_implementation. register() checks its name with that same
function and refuses a name transformers would misread.

What the attention function applies, from what transformers passes it:
- causality as transformers' SDPA integration decides it (the is_causal kwarg, else
  module.is_causal), aligned bottom-right, so a decode or chunked-prefill step with a KV
  cache needs no mask;
- the module's `sliding_window` (Mistral, Gemma 2, gpt-oss...) with the semantics of
  transformers' own masks: causal layers see the last `sliding_window` keys, the query's
  own included (window (sliding_window - 1, 0)); bidirectional layers see keys at
  distance <= sliding_window (window (sliding_window, sliding_window));
- `softcap` (Gemma 2) and `s_aux`, the attention sinks (gpt-oss);
- `cu_seq_lens_q/k` with `max_length_q/k` (packed sequences, as for flash_attention_2).

Masks: register() also registers a mask builder (padding_mask) under the same name. It
returns None, or the 2-D padding mask (batch, kv_length) when the batch has padding, which
the attention function runs through varlen (unpad, attend, pad; padded query rows give 0).
Before that it makes sure the model's mask pattern is one flashtile computes exactly
(causal, full, or the sliding window): anything else -- packed sequences found from
position_ids, image-token or chunked masks, a static cache's empty slots -- is refused
with a ValueError, as is a ready-made 4-D mask passed to the model, rather than ignored.
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import torch as _ft_torch

__all__ = ["NAME", "register", "attention_forward", "padding_mask"]

# transformers keyword arguments that change the attention math in ways flashtile has not
# got (T5's relative position_bias; "sinks" of models whose sinks are not gpt-oss's s_aux).
_UNSUPPORTED_KWARGS = ("position_bias", "sinks")


def sliding_window_to_window(is_causal: bool, sliding_window: Optional[int]) -> tuple[int, int]:
    """transformers' sliding_window as flashtile's window (left, right), as its masks define
    it (masking_utils.sliding_window_overlay / sliding_window_bidirectional_overlay)."""
    if sliding_window is None:
        return -1, -1
    if is_causal:
        return sliding_window - 1, 0          # key j visible when i - sliding_window < j <= i
    return sliding_window, sliding_window     # |i - j| <= sliding_window


def _refuse(message: str):
    raise ValueError(f"flashtile attention: {message}; use attn_implementation='sdpa' or "
                     "'eager' for this model or input")


def _cu_seqlens(kept: torch.Tensor) -> torch.Tensor:
    """int32 (batch + 1) offsets of the rows `kept` (batch, seqlen) marks, packed in order."""
    return torch.nn.functional.pad(kept.sum(1).cumsum(0), (1, 0)).to(torch.int32)


def _padded_attention(q, k, v, padding: torch.Tensor, options: dict) -> torch.Tensor:
    """BSHD attention of a padded batch through varlen: the real tokens of each sequence are
    packed, attended, and put back; padded query rows of causal or windowed attention are 0
    (their values are never read by a real token)."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k = k.shape[1]
    if tuple(padding.shape) != (batch, seqlen_k):
        _refuse(f"the padding mask has shape {tuple(padding.shape)}, expected "
                f"(batch, kv_length) = {(batch, seqlen_k)} (a static cache?)")
    left, right = options["window"]
    positional = options["causal"] or left >= 0 or right >= 0
    if positional:
        # The queries are the last seqlen_q tokens: a padded token's query row is dropped.
        if seqlen_q > seqlen_k:
            _refuse(f"{seqlen_q} queries but {seqlen_k} keys with a causal or windowed mask")
        queries_kept = padding[:, seqlen_k - seqlen_q:]
    else:
        queries_kept = torch.ones(batch, seqlen_q, dtype=torch.bool, device=q.device)
    if left >= 0 or right >= 0:
        # A window counts positions, padding included: packing keeps every distance only when
        # each sequence's real tokens are one run (left or right padding, not both between).
        runs = padding[:, :1].int().sum(1) + (padding[:, 1:] & ~padding[:, :-1]).int().sum(1)
        if bool((runs > 1).any()):
            _refuse("a sliding window over sequences with padding between their tokens")
    out = q.new_zeros(batch, seqlen_q, heads, head_dim)
    if not bool(queries_kept.any()):
        return out
    packed = _ft_torch.attention_varlen(q[queries_kept], k[padding], v[padding],
                                        _cu_seqlens(queries_kept), _cu_seqlens(padding),
                                        **options)
    return out.index_put((queries_kept,), packed)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                      scaling: Optional[float] = None, dropout: float = 0.0,
                      sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                      s_aux: Optional[torch.Tensor] = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface on flashtile.

    query (batch, heads, seq_q, head_dim), key/value (batch, kv_heads, seq_k, head_dim);
    GQA through module.num_key_value_groups (no repeat_kv copies). attention_mask: None or
    the 2-D padding mask of padding_mask() (a 4-D mask is refused). Returns
    (attn_output, None) with attn_output (batch, seq_q, heads, head_dim). Gradients flow to
    the inputs and to s_aux.
    """
    if dropout != 0.0:
        _refuse(f"flashtile has no dropout, got dropout={dropout}")
    for name in _UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            _refuse(f"{name} is not supported")
    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[1] != key.shape[1] * groups:
        _refuse(f"query has {query.shape[1]} heads, key {key.shape[1]} and "
                f"module.num_key_value_groups is {groups}")
    # As sdpa_attention_forward: the is_causal kwarg wins over module.is_causal.
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    is_causal = bool(is_causal)
    options = dict(causal=is_causal, scale=scaling,
                   window=sliding_window_to_window(is_causal, sliding_window),
                   softcap=softcap or 0.0, sinks=None if s_aux is None else s_aux.float())
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))     # BSHD views, no copies
    cu_seqlens_q, cu_seqlens_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        if attention_mask is not None:
            _refuse("cu_seq_lens_q/k together with an attention_mask")
        if cu_seqlens_q is None or cu_seqlens_k is None:
            _refuse("cu_seq_lens_q and cu_seq_lens_k must be given together")
        batch, seqlen_q, heads, head_dim = q.shape
        out = _ft_torch.attention_varlen(
            q.reshape(-1, heads, head_dim), k.reshape(-1, *k.shape[2:]),
            v.reshape(-1, *v.shape[2:]), cu_seqlens_q.to(torch.int32),
            cu_seqlens_k.to(torch.int32), kwargs.get("max_length_q"), kwargs.get("max_length_k"),
            **options)
        return out.view(batch, seqlen_q, heads, head_dim), None
    if attention_mask is None:
        return _ft_torch.attention(q, k, v, **options), None
    if attention_mask.dim() != 2:
        _refuse(f"a {attention_mask.dim()}-D attention_mask of shape "
                f"{tuple(attention_mask.shape)} is not a padding mask; flashtile applies causal "
                "masks, sliding windows and padding only")
    return _padded_attention(q, k, v, attention_mask.bool(), options), None


def _check_mask_pattern(batch_size: int, q_length: int, kv_length: int, q_offset: int,
                        kv_offset: int, mask_function, local_size: Optional[int], device,
                        use_vmap: bool):
    """Evaluates the model's mask function (without padding), query rows a slice at a time,
    and refuses it unless it is flashtile's causal mask, full attention or a sliding window
    (bottom-right aligned on these lengths)."""
    from transformers.masking_utils import sdpa_mask

    candidates = [(-1, 0), (-1, -1)]
    if local_size:
        candidates += [sliding_window_to_window(True, local_size),
                       sliding_window_to_window(False, local_size)]
    rows = max(1, (1 << 24) // max(1, batch_size * kv_length))  # bounds the slice: 16M bools
    j = torch.arange(kv_length, device=device)
    for start in range(0, q_length, rows):
        n = min(rows, q_length - start)
        pattern = sdpa_mask(batch_size=batch_size, q_length=n, kv_length=kv_length,
                            q_offset=q_offset + start, kv_offset=kv_offset,
                            mask_function=mask_function, attention_mask=None,
                            allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
                            allow_torch_fix=False,  # (older transformers) no row un-masking
                            use_vmap=use_vmap, device=device)[:, 0]           # (B, n, kv)
        i = torch.arange(start, start + n, device=device)
        rel = j[None, :] - (i[:, None] + kv_length - q_length)
        candidates = [w for w in candidates
                      if torch.equal(pattern, _ft_torch._window_visible(rel, *w).expand_as(pattern))]
        if not candidates:
            _refuse("this model's attention mask is not a causal, full or sliding-window mask "
                    "(packed sequences, image-token, chunked or custom masks)")


def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                 mask_function=None, attention_mask: Optional[torch.Tensor] = None,
                 **kwargs) -> Optional[torch.Tensor]:
    """transformers' mask-builder interface (AttentionMaskInterface) for FlashTile.

    Returns None when no key is padded, else the boolean padding mask (batch, kv_length) of
    the keys of this call (like flash_attention_2's builder). Refuses, with ValueError, a mask
    pattern flashtile would not reproduce exactly.
    """
    from transformers import masking_utils

    q_offset, kv_offset = int(q_offset), int(kv_offset)
    device = kwargs.get("device", "cpu")
    if mask_function is masking_utils.causal_mask_function:
        # flashtile aligns the last query with the last key: so must the cache.
        if q_offset + q_length != kv_offset + kv_length:
            _refuse(f"queries at positions [{q_offset}, {q_offset + q_length}) and keys at "
                    f"[{kv_offset}, {kv_offset + kv_length}) do not end together (a static "
                    "cache or a prefix?)")
    elif mask_function is not masking_utils.bidirectional_mask_function:
        _check_mask_pattern(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function,
                            kwargs.get("local_size"), device, kwargs.get("use_vmap", False))
    if attention_mask is None:
        return None
    if attention_mask.shape[-1] < kv_offset + kv_length:
        _refuse(f"the attention_mask covers {attention_mask.shape[-1]} positions but the keys "
                f"reach position {kv_offset + kv_length} (a static cache?)")
    padding = attention_mask[:, kv_offset:kv_offset + kv_length].to(device=device,
                                                                       dtype=torch.bool)
    return None if bool(padding.all()) else padding


NAME = "FlashTile"


def register(name: str = NAME) -> str:
    """Makes attn_implementation=name ("FlashTile") available to transformers models.

    Registers attention_forward and its mask builder padding_mask; returns the name.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    try:
        from transformers.utils.generic import is_flash_attention_requested
    except ImportError:  # older transformers: no such heuristic to dodge
        is_flash_attention_requested = None
    if is_flash_attention_requested is not None and is_flash_attention_requested(
            requested_attention_implementation=name):
        raise ValueError(
            f"transformers takes attn_implementation={name!r} for a FlashAttention kernel "
            "(its name contains 'flash'); register flashtile under another name, e.g. "
            f"{NAME!r}")

    AttentionInterface.register(name, attention_forward)
    # Without a mask builder of its own, transformers would build no mask at all for this
    # name and padding would be silently ignored.
    AttentionMaskInterface.register(name, padding_mask)
    return name
