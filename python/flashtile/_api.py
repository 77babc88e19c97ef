"""flashtile.attention and friends: framework detection, output allocation, streams.

The C++ module (_flashtile) sees every array as a non-owning view. This layer decides, per
framework of `q`, how outputs are allocated and which CUDA stream the kernel runs on:

  framework   outputs allocated with             stream
  numpy       numpy.empty                        (CPU)
  torch       torch.empty                        torch.cuda.current_stream()
  CuPy        cupy.empty                         cupy.cuda.get_current_stream()
  other       a flashtile-owned buffer, handed   legacy default stream, then a device
  (JAX...)    over with the framework's          synchronisation (we cannot know the
              from_dlpack, no copy               framework's stream)
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np

from . import _flashtile

__all__ = ["attention", "backends", "plan", "BackendInfo"]

_SUPPORTED = "float32, float16 or bfloat16"


def _ml_bfloat16():
    """ml_dtypes.bfloat16 when ml_dtypes is importable (numpy has no bfloat16 of its own)."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def _framework(x: Any, name: str) -> str:
    if isinstance(x, np.ndarray):
        return "numpy"
    # Only look at frameworks the caller has already imported: never import torch ourselves.
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return "torch"
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return "cupy"
    if hasattr(x, "__dlpack__"):
        return "dlpack"
    raise TypeError(
        f"flashtile.attention: {name} must be a numpy array or a DLPack array "
        f"(torch, CuPy, JAX...), got {type(x).__module__}.{type(x).__qualname__}"
    )


class _Call:
    """The arrays of one call, prepared for the C++ module."""

    def __init__(self, q, k, v, out):
        self.framework = _framework(q, "q")
        self.uint16_is_bf16 = False
        arrays = {"q": q, "k": k, "v": v}
        if out is not None:
            arrays["out"] = out
        for name, x in arrays.items():
            _framework(x, name)
            if len(x.shape) != 4:
                raise ValueError(
                    f"flashtile.attention: {name} must be 4-D (batch, seqlen, heads, head_dim), "
                    f"got {len(x.shape)}-D"
                )
        self.arrays = {name: self._prepare(name, x) for name, x in arrays.items()}

    def _prepare(self, name: str, x):
        if isinstance(x, np.ndarray):
            if x.dtype.name == "bfloat16":  # ml_dtypes: pass the bits as a uint16 view
                self.uint16_is_bf16 = True
                return x.view(np.uint16)
            if x.dtype not in (np.float32, np.float16):
                raise TypeError(
                    f"flashtile.attention: {name}.dtype must be {_SUPPORTED}, got {x.dtype}"
                )
            return x
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(x, torch.Tensor):
            # flashtile.attention is forward-only; flashtile.torch's op carries autograd.
            return x.detach()
        if self.framework == "dlpack" and hasattr(x, "block_until_ready"):
            x.block_until_ready()  # JAX: we read its memory from outside its streams
        return x

    def device(self):
        """('cpu', 0) or ('cuda', index) of q, from its DLPack device."""
        q = self.arrays["q"]
        if isinstance(q, np.ndarray):
            return "cpu", 0
        device_type, index = q.__dlpack_device__()
        return ("cuda", int(index)) if int(device_type) == 2 else ("cpu", 0)

    def empty(self, shape, dtype: str):
        """An uninitialised C-contiguous array of q's framework on q's device.

        Returns (array_to_return, array_to_write): they differ for numpy bfloat16 (a uint16
        view of the same memory) and for flashtile-owned buffers (converted afterwards).
        """
        q = self.arrays["q"]
        device, index = self.device()
        if self.framework == "numpy":
            if dtype == "bfloat16":
                array = np.empty(shape, dtype=_ml_bfloat16())
                return array, array.view(np.uint16)
            array = np.empty(shape, dtype=dtype)
            return array, array
        if self.framework == "torch":
            torch = sys.modules["torch"]
            array = torch.empty(shape, dtype=getattr(torch, dtype), device=q.device)
            return array, array
        if self.framework == "cupy":
            cupy = sys.modules["cupy"]
            with cupy.cuda.Device(index):
                array = cupy.empty(shape, dtype=dtype)
            return array, array
        # Any other DLPack producer (JAX...): we own the memory and hand it over afterwards.
        array = _flashtile.empty(list(shape), dtype, device, index)
        return array, array

    def stream(self) -> int:
        device, index = self.device()
        if device != "cuda":
            return 0
        if self.framework == "torch":
            torch = sys.modules["torch"]
            return torch.cuda.current_stream(index).cuda_stream
        if self.framework == "cupy":
            cupy = sys.modules["cupy"]
            with cupy.cuda.Device(index):
                return cupy.cuda.get_current_stream().ptr
        return 0

    def finish(self, array):
        """Hands a flashtile-owned output over to the caller's framework, without a copy."""
        if self.framework != "dlpack":
            return array
        q = self.arrays["q"]
        namespace = getattr(q, "__array_namespace__", None)
        if namespace is None:
            return array  # nanobind's ndarray speaks DLPack; any framework can import it
        return namespace().from_dlpack(array)


def _dtype_name(x) -> str:
    """'float32' / 'float16' / 'bfloat16' for any array flashtile accepts."""
    name = str(x.dtype).rsplit(".", 1)[-1]  # torch.float32 -> float32
    if name not in ("float32", "float16", "bfloat16"):
        raise TypeError(f"flashtile.attention: q.dtype must be {_SUPPORTED}, got {name}")
    return name


def attention(q, k, v, *, causal: bool = False, scale: float | None = None,
              return_lse: bool = False, backend: str = "auto", out=None):
    """Exact attention softmax(q·kᵀ·scale)·v, never materialising the N×N matrix.

    q: (batch, seqlen_q, heads_q, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim),
    heads_q a multiple of heads_kv (GQA/MQA) -- the BSHD layout of flash_attn_func.
    Arrays: numpy (CPU; bfloat16 through ml_dtypes), or any DLPack array on the CPU or CUDA
    (torch, CuPy, JAX). Nothing is copied: strided views are read in place, provided the
    head_dim stride is 1 (otherwise ValueError). Dtypes: float32, float16, bfloat16.

    causal: mask aligned bottom-right when seqlen_q != seqlen_k (FlashAttention >= 2.1);
        a query row that sees no key outputs 0 and lse -inf.
    scale: defaults to 1/sqrt(head_dim).
    return_lse: also return the log-sum-exp, float32 (batch, heads_q, seqlen_q).
    backend: "auto" or a name from flashtile.backends().
    out: an array to write the result into (same shape and dtype as q, may be strided);
        allocated with q's framework when None.

    Returns out, or (out, lse), as arrays of q's framework. With torch CUDA tensors the
    kernel runs on torch.cuda.current_stream(), with CuPy on CuPy's current stream.
    Forward only: torch outputs carry no autograd history (see flashtile.torch).
    Errors from the library arrive as ValueError (arguments, unsupported calls) or
    TypeError (dtypes) with the library's message.
    """
    call = _Call(q, k, v, out)
    q_, k_, v_ = call.arrays["q"], call.arrays["k"], call.arrays["v"]
    dtype = _dtype_name(q)
    caller_out = out is not None
    if caller_out:
        out_ = call.arrays["out"]
    else:
        out, out_ = call.empty(tuple(q.shape), dtype)
    lse = lse_ = None
    if return_lse:
        batch, seqlen_q, heads, _ = q.shape
        lse, lse_ = call.empty((batch, heads, seqlen_q), "float32")
    _flashtile.forward(q_, k_, v_, out_, lse_, bool(causal),
                       None if scale is None else float(scale), str(backend), call.stream(),
                       call.uint16_is_bf16)
    if call.framework == "dlpack" and call.device()[0] == "cuda":
        _flashtile.cuda_synchronize(call.device()[1])
    if not caller_out:
        out = call.finish(out)
    if return_lse:
        return out, call.finish(lse)
    return out


def plan(q, k, v, *, causal: bool = False, scale: float | None = None,
         backend: str = "auto") -> str:
    """Name of the backend flashtile.attention would run for these arguments.

    Raises what flashtile.attention would raise (nothing runs; an output is allocated).
    """
    call = _Call(q, k, v, None)
    _, out_ = call.empty(tuple(q.shape), _dtype_name(q))
    return _flashtile.plan(call.arrays["q"], call.arrays["k"], call.arrays["v"], out_,
                           bool(causal), None if scale is None else float(scale), str(backend),
                           call.uint16_is_bf16)


class BackendInfo(NamedTuple):
    device: str      # "cpu" or "cuda"
    available: bool  # compiled in, with its hardware present
    reason: str      # why not available ("" when available)


def backends() -> dict[str, BackendInfo]:
    """Every backend flashtile knows, in journey order: name -> BackendInfo."""
    return {name: BackendInfo(device, available, reason)
            for name, device, available, reason in _flashtile.backends()}
