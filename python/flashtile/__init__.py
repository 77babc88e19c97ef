"""flashtile: exact attention, softmax(q·kᵀ·scale)·v, without the N×N matrix.

    import flashtile
    out = flashtile.attention(q, k, v, causal=True)   # BSHD numpy / torch / CuPy / JAX
    out = flashtile.attention(q, k, v, window=(127, 0), softcap=30.0, sinks=sinks)
    out = flashtile.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k)  # packed
    dq, dk, dv = flashtile.attention_backward(dout, q, k, v, out, lse, causal=True)

flashtile.torch holds the torch custom ops and drop-ins for SDPA, flash_attn_func and
flash_attn_varlen_func; flashtile.integrations.transformers.register() adds
attn_implementation="FlashTile". flashtile.jax holds attention as an XLA custom call (jax.jit,
vmap, grad); it is imported on first use, so importing flashtile never imports jax.
"""

from ._api import (BackendInfo, attention, attention_backward, attention_backward_varlen,
                   attention_varlen, backends, plan, plan_varlen)
from ._flashtile import __version__, cuda_compiled, cuda_device_count

__all__ = ["attention", "attention_varlen", "attention_backward", "attention_backward_varlen",
           "backends", "plan", "plan_varlen", "BackendInfo",
           "__version__", "cuda_compiled", "cuda_device_count"]


def __getattr__(name: str):
    # flashtile.jax on first access (import flashtile.jax works too): jax is never imported
    # by `import flashtile` itself.
    if name == "jax":
        import importlib
        return importlib.import_module(".jax", __name__)
    raise AttributeError(f"module 'flashtile' has no attribute {name!r}")
