"""attn_implementation="FlashTile" for Hugging Face transformers (5.x).

    import flashtile.integrations.transformers as ft_hf
    ft_hf.register()
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="FlashTile")

Why "FlashTile" and not "flashtile": transformers treats every implementation name that
contains the lower-case "flash" as a FlashAttention kernel to fetch from its hub
(transformers.utils.generic.is_flash_attention_requested: `"flash" in name`), so the name
"flashtile" fails in set_attn_implementation. register() checks its name with that same
function and refuses a name transformers would misread.

flashtile applies no mask other than causal. register() therefore also registers
transformers' SDPA mask builder under the same name: it returns no mask when causal (or
full) attention is exact -- no padding, prefill or single-token decode -- and a mask
otherwise, which attention_forward refuses with a ValueError rather than ignoring it.
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import torch as _ft_torch

__all__ = ["NAME", "register", "attention_forward"]

# transformers keyword arguments that change the attention math; flashtile has none of them.
_UNSUPPORTED_KWARGS = ("softcap", "position_bias", "s_aux", "sinks")


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                      scaling: Optional[float] = None, dropout: float = 0.0,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface on flashtile.

    query (batch, heads, seq_q, head_dim), key/value (batch, kv_heads, seq_k, head_dim);
    GQA through module.num_key_value_groups (no repeat_kv copies). Causality is decided as
    transformers' sdpa_attention_forward decides it. Returns (attn_output, None) with
    attn_output (batch, seq_q, heads, head_dim).
    """
    if attention_mask is not None:
        raise ValueError(
            "flashtile attention cannot apply an attention_mask (got a tensor of shape "
            f"{tuple(attention_mask.shape)}): it computes causal or full attention only, so "
            "padded batches, sliding windows and custom masks are not supported; use "
            "unpadded inputs or attn_implementation='sdpa'")
    if dropout != 0.0:
        raise ValueError(f"flashtile attention has no dropout, got dropout={dropout}")
    for name in _UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            raise ValueError(f"flashtile attention does not support {name}")
    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[1] != key.shape[1] * groups:
        raise ValueError(
            f"flashtile attention: query has {query.shape[1]} heads, key {key.shape[1]} and "
            f"module.num_key_value_groups is {groups}")
    # As sdpa_attention_forward: the is_causal kwarg wins over module.is_causal; a single
    # query token (decode) attends to every key; with a mask there is no is_causal.
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    is_causal = query.shape[2] > 1 and bool(is_causal)
    out = _ft_torch.scaled_dot_product_attention(query, key, value, is_causal=is_causal,
                                                 scale=scaling, enable_gqa=True)
    # SDPA-style (batch, heads, seq, dim) view of a BSHD buffer: transposing back is free.
    return out.transpose(1, 2), None


NAME = "FlashTile"


def register(name: str = NAME) -> str:
    """Makes attn_implementation=name ("FlashTile") available to transformers models.

    Returns the name.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

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
    # name and padding would be silently ignored; SDPA's builder skips the mask exactly when
    # is_causal (or full attention) is right, and builds one (refused above) otherwise.
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
