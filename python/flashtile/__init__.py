"""flashtile: exact attention, softmax(q·kᵀ·scale)·v, without the N×N matrix.

    import flashtile
    out = flashtile.attention(q, k, v, causal=True)   # BSHD numpy / torch / CuPy / JAX

flashtile.torch holds the torch custom op and drop-ins for SDPA and flash_attn_func;
flashtile.integrations.transformers.register() adds attn_implementation="flashtile".
"""

from ._api import BackendInfo, attention, backends, plan
from ._flashtile import __version__, cuda_compiled, cuda_device_count

__all__ = ["attention", "backends", "plan", "BackendInfo", "__version__", "cuda_compiled",
           "cuda_device_count"]
