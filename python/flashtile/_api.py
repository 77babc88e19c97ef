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

import operator
import sys
from typing import Any, NamedTuple

import numpy as np

from . import _flashtile

__all__ = ["attention", "attention_varlen", "attention_backward", "attention_backward_varlen",
           "backends", "plan", "plan_varlen", "BackendInfo"]

_SUPPORTED = "float32, float16 or bfloat16"


def _ml_bfloat16():
    """ml_dtypes.bfloat16 when ml_dtypes is importable (numpy has no bfloat16 of its own)."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def _framework(x: Any, name: str, api: str) -> str:
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{api}: {name} is a numpy masked array; flashtile would ignore its "
                        f"mask: pass {name}.filled(...) or an attention mask of its own")
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
        f"{api}: {name} must be a numpy array or a DLPack array "
        f"(torch, CuPy, JAX...), got {type(x).__module__}.{type(x).__qualname__}"
    )


class _Call:
    """The arrays of one call, prepared for the C++ module.

    tensors: q, k, v (and out) -- 4-D BSHD, or 3-D packed (total_tokens, heads, head_dim)
    for a varlen call; extras: the small arrays beside them (ALiBi slopes, sinks,
    cu_seqlens), whose dtypes, shapes and devices the C++ module and the library check.
    """

    def __init__(self, api: str, tensors: dict, extras: dict, packed: bool = False):
        self.api = api
        self.framework = _framework(tensors["q"], "q", api)
        self.uint16_is_bf16 = False
        layout = ("3-D (total_tokens, heads, head_dim)" if packed
                  else "4-D (batch, seqlen, heads, head_dim)")
        for name, x in tensors.items():
            _framework(x, name, api)
            if len(x.shape) != (3 if packed else 4):
                raise ValueError(f"{api}: {name} must be {layout}, got {len(x.shape)}-D")
        for name, x in extras.items():
            _framework(x, name, api)
        self.arrays = {name: self._prepare(name, x) for name, x in tensors.items()}
        self.extras = {name: self._prepare(name, x, tensor=False) for name, x in extras.items()}
        self.dtype = _dtype_name(tensors["q"], api)  # of the caller's q (not a uint16 view)

    def _prepare(self, name: str, x, tensor: bool = True):
        if isinstance(x, np.ndarray):
            if not tensor:
                return x
            if x.dtype.name == "bfloat16":  # ml_dtypes: pass the bits as a uint16 view
                self.uint16_is_bf16 = True
                return x.view(np.uint16)
            if x.dtype not in (np.float32, np.float16):
                raise TypeError(f"{self.api}: {name}.dtype must be {_SUPPORTED}, got {x.dtype}")
            return x
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(x, torch.Tensor):
            # flashtile.attention is forward-only; flashtile.torch's op carries autograd.
            return x.detach()
        if hasattr(x, "block_until_ready"):
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

    def args(self, backend: str, **options) -> "_flashtile.CallArgs":
        """The C++ module's CallArgs: the options given, the extras, stream and backend."""
        args = _flashtile.CallArgs()
        for name, value in {**options, **self.extras}.items():
            setattr(args, name, value)
        args.backend = str(backend)
        args.stream = self.stream()
        args.uint16_is_bf16 = self.uint16_is_bf16
        return args


def _dtype_name(x, api: str) -> str:
    """'float32' / 'float16' / 'bfloat16' for any array flashtile accepts."""
    name = str(x.dtype).rsplit(".", 1)[-1]  # torch.float32 -> float32
    if name not in ("float32", "float16", "bfloat16"):
        raise TypeError(f"{api}: q.dtype must be {_SUPPORTED}, got {name}")
    return name


def _flag(value, name: str, api: str) -> bool:
    """A flag must be a bool: 'False' or 'no' would otherwise count as true."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{api}: {name} must be True or False, got {value!r}")


def _variant_options(api: str, causal, scale, window, softcap) -> dict:
    """The scalar options as the C++ module takes them; the library checks their values."""
    causal = _flag(causal, "causal", api)
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(f"{api}: window must be a pair (left, right), -1 for an unbounded "
                         f"side, got {window!r}") from None
    try:
        left, right = operator.index(left), operator.index(right)
    except TypeError:
        raise TypeError(f"{api}: window must hold integers, got {window!r}") from None
    return {"causal": bool(causal), "scale": None if scale is None else float(scale),
            "window_left": left, "window_right": right,
            "softcap": 0.0 if softcap is None else float(softcap)}


def _optional_int(value, name: str, api: str):
    if value is None:
        return None
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{api}: {name} must be an integer or None, got {value!r}") from None


def _tensors(q, k, v, out=None) -> dict:
    return {"q": q, "k": k, "v": v, **({} if out is None else {"out": out})}


def _extras(**arrays) -> dict:
    """The optional arrays that were given."""
    return {name: x for name, x in arrays.items() if x is not None}


def _require_writable(out, api: str):
    """Refuses an out= that must not be written: read-only numpy arrays, JAX arrays (JAX
    arrays are immutable, though their DLPack export does not say so) and DLPack exports
    flagged read-only."""
    if isinstance(out, np.ndarray):
        if not out.flags.writeable:
            raise ValueError(f"{api}: out is a read-only array")
        return
    if type(out).__module__.split(".")[0] in ("jax", "jaxlib"):
        raise ValueError(f"{api}: out cannot be a JAX array: JAX arrays are immutable; use the "
                         "returned array (and flashtile.jax inside jax.jit)")
    if not _flashtile.is_writable_array(out):
        raise ValueError(f"{api}: out is read-only (its DLPack export is flagged read-only)")


def _run(call: _Call, out, return_lse: bool, lse_shape, backend: str, options: dict):
    """Allocates what the caller did not give, runs the call, returns out (and lse)."""
    return_lse = _flag(return_lse, "return_lse", call.api)
    q = call.arrays["q"]
    caller_out = out is not None
    if caller_out:
        out_ = call.arrays["out"]
        _require_writable(out_, call.api)
    else:
        out, out_ = call.empty(tuple(q.shape), call.dtype)
    lse = lse_ = None
    if return_lse:
        lse, lse_ = call.empty(lse_shape, "float32")
    _flashtile.forward(q, call.arrays["k"], call.arrays["v"], out_, lse_,
                       call.args(backend, **options))
    if call.framework == "dlpack" and call.device()[0] == "cuda":
        _flashtile.cuda_synchronize(call.device()[1])
    if not caller_out:
        out = call.finish(out)
    if return_lse:
        return out, call.finish(lse)
    return out


def _plan(call: _Call, backend: str, options: dict) -> str:
    q = call.arrays["q"]
    _, out_ = call.empty(tuple(q.shape), call.dtype)
    name, _workspace_bytes = _flashtile.plan(q, call.arrays["k"], call.arrays["v"], out_,
                                             call.args(backend, **options))
    return name


_VARIANT_DOC = """
    causal: mask aligned bottom-right when seqlen_q != seqlen_k (FlashAttention >= 2.1):
        query i sees key j <= i + seqlen_k - seqlen_q (the same as window right = 0).
    scale: defaults to 1/sqrt(head_dim).
    window: (left, right), FlashAttention's window_size: query i sees key j when
        j - (i + seqlen_k - seqlen_q) lies in [-left, right]; -1 leaves a side unbounded.
    softcap: c > 0 caps the scores, S <- c * tanh(S / c), after the scale (Gemma 2); 0: off.
    alibi_slopes: float32 (heads_q) or (batch, heads_q) on q's device; adds
        -slope * |i + seqlen_k - seqlen_q - j| to each score, after the softcap.
    sinks: float32 (heads_q) on q's device, one logit per query head that joins every
        row's softmax denominator (and the LSE) and carries no value (gpt-oss).
    A query row that sees no key and has no sink outputs 0 with lse -inf.
    backend: "auto" or a name from flashtile.backends().
"""


def attention(q, k, v, *, causal: bool = False, scale: float | None = None,
              window=(-1, -1), softcap: float = 0.0, alibi_slopes=None, sinks=None,
              return_lse: bool = False, backend: str = "auto", out=None):
    api = "flashtile.attention"
    options = _variant_options(api, causal, scale, window, softcap)
    call = _Call(api, _tensors(q, k, v, out),
                 _extras(alibi_slopes=alibi_slopes, sinks=sinks))
    batch, seqlen_q, heads, _ = call.arrays["q"].shape
    return _run(call, out, return_lse, (batch, heads, seqlen_q), backend, options)


attention.__doc__ = """Exact attention softmax(q·kᵀ·scale)·v, never materialising the N×N matrix.

    q: (batch, seqlen_q, heads_q, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim),
    heads_q a multiple of heads_kv (GQA/MQA) -- the BSHD layout of flash_attn_func.
    Arrays: numpy (CPU; bfloat16 through ml_dtypes), or any DLPack array on the CPU or CUDA
    (torch, CuPy, JAX). Nothing is copied: strided views are read in place, provided the
    head_dim stride is 1 (otherwise ValueError). Dtypes: float32, float16, bfloat16.
""" + _VARIANT_DOC + """    return_lse: also return the log-sum-exp, float32 (batch, heads_q, seqlen_q).
    out: an array to write the result into (same shape and dtype as q, may be strided);
        allocated with q's framework when None.

    Returns out, or (out, lse), as arrays of q's framework. With torch CUDA tensors the
    kernel runs on torch.cuda.current_stream(), with CuPy on CuPy's current stream.
    Forward only: torch outputs carry no autograd history (see flashtile.torch).
    Errors from the library arrive as ValueError (arguments, unsupported calls) or
    TypeError (dtypes) with the library's message; on error nothing is written.
    """


def _varlen_call(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                 seqused_k, causal, scale, window, softcap, alibi_slopes, sinks):
    """The prepared call and options of attention_varlen / plan_varlen."""
    api = "flashtile.attention_varlen"
    options = _variant_options(api, causal, scale, window, softcap)
    options["max_seqlen_q"] = _optional_int(max_seqlen_q, "max_seqlen_q", api)
    options["max_seqlen_k"] = _optional_int(max_seqlen_k, "max_seqlen_k", api)
    call = _Call(api, _tensors(q, k, v, out),
                 _extras(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         seqused_k=seqused_k, alibi_slopes=alibi_slopes, sinks=sinks),
                 packed=True)
    return call, options


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int | None = None,
                     max_seqlen_k: int | None = None, *, seqused_k=None, causal: bool = False,
                     scale: float | None = None, window=(-1, -1), softcap: float = 0.0,
                     alibi_slopes=None, sinks=None, return_lse: bool = False,
                     backend: str = "auto", out=None):
    call, options = _varlen_call(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, seqused_k, causal, scale, window, softcap,
                                 alibi_slopes, sinks)
    total_q, heads, _ = call.arrays["q"].shape
    return _run(call, out, return_lse, (heads, total_q), backend, options)


attention_varlen.__doc__ = """Exact attention over a packed batch of variable-length sequences.

    flash_attn_varlen_func's layout: q (total_q, heads_q, head_dim), k and v (total_k,
    heads_kv, head_dim), the sequences one after another. cu_seqlens_q / cu_seqlens_k:
    int32 (batch + 1,) on q's device; sequence b owns query rows
    [cu_seqlens_q[b], cu_seqlens_q[b+1]) and key rows [cu_seqlens_k[b], cu_seqlens_k[b+1]).
    They must not decrease, cu_seqlens_q runs from 0 to total_q, cu_seqlens_k stays inside
    k; empty sequences are fine. The library reads them on the host before anything runs
    (on CUDA: a copy ordered on the current stream, which waits for it).
    max_seqlen_q / max_seqlen_k: optional bounds on the lengths (checked when given).
    seqused_k: optional int32 (batch,): sequence b uses only its first seqused_k[b] keys.
    Masks, ALiBi distances and sinks apply per sequence (bottom-right within each).
""" + _VARIANT_DOC + """    return_lse: also return the log-sum-exp, float32 (heads_q, total_q).
    out: an array to write into, shaped and typed like q; allocated when None.

    Returns out, or (out, lse), as arrays of q's framework; arrays and errors as
    flashtile.attention.
    """


def plan(q, k, v, *, causal: bool = False, scale: float | None = None, window=(-1, -1),
         softcap: float = 0.0, alibi_slopes=None, sinks=None, backend: str = "auto") -> str:
    """Name of the backend flashtile.attention would run for these arguments.

    Takes flashtile.attention's arguments and raises what it would raise (nothing runs;
    an output is allocated).
    """
    api = "flashtile.attention"
    options = _variant_options(api, causal, scale, window, softcap)
    call = _Call(api, _tensors(q, k, v), _extras(alibi_slopes=alibi_slopes, sinks=sinks))
    return _plan(call, backend, options)


def plan_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int | None = None,
                max_seqlen_k: int | None = None, *, seqused_k=None, causal: bool = False,
                scale: float | None = None, window=(-1, -1), softcap: float = 0.0,
                alibi_slopes=None, sinks=None, backend: str = "auto") -> str:
    """Name of the backend flashtile.attention_varlen would run for these arguments.

    Takes flashtile.attention_varlen's arguments and raises what it would raise (nothing
    runs; cu_seqlens are read and checked).
    """
    call, options = _varlen_call(q, k, v, None, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, seqused_k, causal, scale, window, softcap,
                                 alibi_slopes, sinks)
    return _plan(call, backend, options)


def _run_backward(call: _Call, lse, sinks, backend: str, options: dict, dlse=None):
    """Allocates dq, dk, dv (and dsinks) in the framework of q, runs the backward pass."""
    _framework(lse, "lse", call.api)
    lse_ = call._prepare("lse", lse, tensor=False)
    dlse_ = None
    if dlse is not None:
        _framework(dlse, "dlse", call.api)
        dlse_ = call._prepare("dlse", dlse, tensor=False)
    a = call.arrays
    grads = [call.empty(tuple(a[name].shape), call.dtype) for name in ("q", "k", "v")]
    dsinks = dsinks_ = None
    if sinks is not None:
        dsinks, dsinks_ = call.empty((a["q"].shape[-2],), "float32")
    _flashtile.backward(a["q"], a["k"], a["v"], a["out"], a["dout"], lse_,
                        *(written for _, written in grads), dsinks_,
                        call.args(backend, **options), dlse=dlse_)
    if call.framework == "dlpack" and call.device()[0] == "cuda":
        _flashtile.cuda_synchronize(call.device()[1])
    result = tuple(call.finish(returned) for returned, _ in grads)
    return result + (call.finish(dsinks),) if sinks is not None else result


def attention_backward(dout, q, k, v, out, lse, *, causal: bool = False,
                       scale: float | None = None, window=(-1, -1), softcap: float = 0.0,
                       alibi_slopes=None, sinks=None, deterministic: bool = False,
                       backend: str = "auto", dlse=None):
    api = "flashtile.attention_backward"
    options = _variant_options(api, causal, scale, window, softcap)
    options["deterministic"] = _flag(deterministic, "deterministic", api)
    call = _Call(api, {**_tensors(q, k, v, out), "dout": dout},
                 _extras(alibi_slopes=alibi_slopes, sinks=sinks))
    return _run_backward(call, lse, sinks, backend, options, dlse)


attention_backward.__doc__ = """The gradients of flashtile.attention, in O(N·d) memory.

    dout: the gradient of the loss with respect to out, shaped and typed like q. q, k, v
    and the variant arguments as given to flashtile.attention; out and lse as it returned
    them (attention(..., return_lse=True)): P is recomputed from lse, never stored.
""" + _VARIANT_DOC + """    deterministic: bitwise-equal gradients run to run (the CPU backends always are).
    dlse: optional gradient of the loss with respect to lse (float32, lse's shape, C-contiguous,
        on q's device), for losses that use the LSE too (merging partial attention results):
        it adds dlse_i·P_ij to each score's gradient. None: no gradient into the LSE.

    Returns (dq, dk, dv), shaped and typed like q, k, v (GQA: dk, dv summed over each kv
    head's query heads), or (dq, dk, dv, dsinks) when sinks are given, dsinks float32
    (heads_q): the gradient of the sink logits. ALiBi slopes get no gradient. Arrays of q's
    framework; errors as flashtile.attention (on error nothing is written). On CUDA,
    cuda_mma (float16/bfloat16, head_dim <= 128) and cuda_sm90 (head_dim 64 and 128, sm_90;
    auto's pick for dense calls from 1024 keys) have a backward; other CUDA calls have none
    yet (ValueError naming each backend's reason).
    """


def attention_backward_varlen(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                              max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                              *, seqused_k=None, causal: bool = False,
                              scale: float | None = None, window=(-1, -1), softcap: float = 0.0,
                              alibi_slopes=None, sinks=None, deterministic: bool = False,
                              backend: str = "auto", dlse=None):
    """The gradients of flashtile.attention_varlen (packed tensors; lse (heads_q, total_q)).

    Arguments as attention_varlen plus dout, out, lse and dlse (as attention_backward's:
    lse's shape); returns as attention_backward.
    Key rows outside every sequence's used keys get dk = dv = 0.
    """
    api = "flashtile.attention_backward_varlen"
    options = _variant_options(api, causal, scale, window, softcap)
    options["deterministic"] = _flag(deterministic, "deterministic", api)
    options["max_seqlen_q"] = _optional_int(max_seqlen_q, "max_seqlen_q", api)
    options["max_seqlen_k"] = _optional_int(max_seqlen_k, "max_seqlen_k", api)
    call = _Call(api, {**_tensors(q, k, v, out), "dout": dout},
                 _extras(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         seqused_k=seqused_k, alibi_slopes=alibi_slopes, sinks=sinks),
                 packed=True)
    return _run_backward(call, lse, sinks, backend, options, dlse)


class BackendInfo(NamedTuple):
    device: str      # "cpu" or "cuda"
    available: bool  # compiled in, with its hardware present
    reason: str      # why not available ("" when available)


def backends() -> dict[str, BackendInfo]:
    """Every backend flashtile knows, in journey order: name -> BackendInfo."""
    return {name: BackendInfo(device, available, reason)
            for name, device, available, reason in _flashtile.backends()}
