"""flashtile with torch tensors: the plain API, the custom op, the SDPA and flash_attn drop-ins.

CPU tests run wherever torch is installed; CUDA tests need a GPU and a flashtile CUDA
backend; half-precision CUDA tests skip while no CUDA backend takes that dtype.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashtile  # noqa: E402
import flashtile.torch as ft  # noqa: E402
from conftest import (max_rel_error, reference_attention,  # noqa: E402
                      reference_attention_varlen)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

F = torch.nn.functional


def _cuda_backend_available():
    return torch.cuda.is_available() and any(
        b.device == "cuda" and b.available for b in flashtile.backends().values())


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not _cuda_backend_available(), reason="no CUDA device or no flashtile CUDA backend"))]


@pytest.fixture(autouse=True)
def _full_fp32_matmul():
    # Reference results in true fp32 (TF32 would make torch the less accurate side).
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = previous


def bshd(batch, seqlen, heads, head_dim, device, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(batch, seqlen, heads, head_dim, generator=g) * 2 - 1).to(device, dtype)


def case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, device, dtype=torch.float32):
    return (bshd(batch, seqlen_q, heads_q, head_dim, device, dtype, 1),
            bshd(batch, seqlen_k, heads_kv, head_dim, device, dtype, 2),
            bshd(batch, seqlen_k, heads_kv, head_dim, device, dtype, 3))


def numpy_of(x):
    """float tensors as float32 numpy arrays (bf16 has no numpy dtype), others as they are."""
    if x is None:
        return None
    return (x.detach().float() if x.is_floating_point() else x.detach()).cpu().numpy()


def reference(q, k, v, causal=False, scale=None, **variant):
    """conftest's float64 numpy reference of torch tensors (variant arrays included)."""
    variant = {name: numpy_of(x) if isinstance(x, torch.Tensor) else x
               for name, x in variant.items()}
    return reference_attention(*(numpy_of(x) for x in (q, k, v)), causal=causal, scale=scale,
                               **variant)


def torch_reference(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0,
                    alibi_slopes=None, sinks=None):
    """The same math in float64 torch ops, for autograd: (out BSHD, lse (B, H, Sq)).

    Independent of flashtile.torch's hand-written backward: torch differentiates this.
    Rows must see a key or have a sink (an empty row's lse is -inf, whose gradient is NaN).
    """
    f64 = torch.float64
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = head_dim ** -0.5 if scale is None else scale
    Q = q.to(f64).transpose(1, 2)
    K = k.to(f64).transpose(1, 2).repeat_interleave(heads_q // heads_kv, dim=1)
    V = v.to(f64).transpose(1, 2).repeat_interleave(heads_q // heads_kv, dim=1)
    S = Q @ K.transpose(-1, -2) * scale                                   # (B, H, Sq, Sk)
    if softcap:
        S = softcap * torch.tanh(S / softcap)
    i = torch.arange(seqlen_q, device=q.device)[:, None]
    j = torch.arange(seqlen_k, device=q.device)[None, :]
    rel = j - (i + seqlen_k - seqlen_q)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(f64).reshape(-1, heads_q, 1, 1)
        S = S - slopes * rel.abs().to(f64)
    left, right = window[0], 0 if causal else window[1]
    visible = torch.ones_like(rel, dtype=torch.bool)
    if left >= 0:
        visible &= rel >= -left
    if right >= 0:
        visible &= rel <= right
    S = S.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        column = sinks.to(f64).reshape(1, heads_q, 1, 1).expand(batch, heads_q, seqlen_q, 1)
        lse = torch.cat([S, column], dim=-1).logsumexp(-1)
    else:
        lse = S.logsumexp(-1)
    P = torch.exp(S - lse.unsqueeze(-1))
    return (P @ V).transpose(1, 2), lse


def torch_reference_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k=None,
                           alibi_slopes=None, **variant):
    """torch_reference per sequence of a packed batch, concatenated: (out, lse (H, Tq))."""
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        k_end = cu_k[b + 1] if seqused_k is None else cu_k[b] + int(seqused_k[b])
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], k_end)
        if cu_q[b + 1] == cu_q[b]:
            continue
        slopes = alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 \
            else alibi_slopes
        out, lse = torch_reference(q[None, qs], k[None, ks], v[None, ks], alibi_slopes=slopes,
                                   **variant)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


def skip_unless_backend(q, k, v, **kwargs):
    """Skips the test when no flashtile backend takes this call (e.g. a variant on CUDA
    before a CUDA backend takes it; on the CPU the oracle takes everything)."""
    try:
        return flashtile.plan(q, k, v, **kwargs)
    except ValueError as error:
        if "no backend can run this call" in str(error):
            pytest.skip(str(error))
        raise


def skip_unless_varlen_backend(q, k, v, cu_seqlens_q, cu_seqlens_k, **kwargs):
    try:
        return flashtile.plan_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, **kwargs)
    except ValueError as error:
        if "no backend can run this call" in str(error):
            pytest.skip(str(error))
        raise


# --- flashtile.attention with torch tensors ------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_reference(device, causal):
    q, k, v = case(2, 67, 129, 4, 2, 64, device)
    out, lse = flashtile.attention(q, k, v, causal=causal, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.device == q.device and out.dtype == q.dtype
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, 67) and lse.device == q.device
    ref_out, ref_lse = reference(q, k, v, causal)
    assert max_rel_error(out.cpu().numpy(), ref_out) <= 1e-5
    assert max_rel_error(lse.cpu().numpy(), ref_lse) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_attention_strided_views_and_out(device):
    # BHSD tensors transposed to BSHD views, written into a strided window of a buffer.
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in case(2, 33, 40, 4, 4, 32, device))
    assert not q.is_contiguous() and q.stride(-1) == 1
    buffer = torch.full((2, 33, 6, 48), float("nan"), device=device)
    out = buffer[:, :, 1:5, 8:40]
    result = flashtile.attention(q, k, v, causal=True, out=out)
    assert result is out
    assert max_rel_error(out.cpu().numpy(), reference(q, k, v, True)[0]) <= 1e-5
    buffer[:, :, 1:5, 8:40] = 0
    assert torch.isnan(buffer).sum() == buffer.numel() - out.numel()


def test_attention_error_types():
    q, k, v = case(1, 8, 8, 2, 2, 16, "cpu")
    with pytest.raises(TypeError, match=r"k\.dtype must match q\.dtype \(expected float32, got float16\)"):
        flashtile.attention(q, k.half(), v)
    with pytest.raises(TypeError, match=r"q\.dtype must be float32, float16 or bfloat16, got float64"):
        flashtile.attention(q.double(), k.double(), v.double())
    with pytest.raises(ValueError, match=r"head_dim stride"):
        flashtile.attention(q.transpose(2, 3), k.transpose(2, 3), v.transpose(2, 3))


@pytest.mark.skipif(not _cuda_backend_available(), reason="needs CUDA")
def test_attention_runs_on_current_stream():
    # The inputs are written on a side stream after a ~50 ms GPU sleep. Run on that stream,
    # the kernel sees them; run on another stream, it would read the stale zeros.
    q_new, k, v = case(1, 256, 256, 4, 4, 64, "cuda")
    expected = flashtile.attention(q_new, k, v)
    q = torch.zeros_like(q_new)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)
        q.copy_(q_new)
        out = flashtile.attention(q, k, v)
    stream.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.skipif(not _cuda_backend_available(), reason="needs CUDA")
def test_attention_passes_current_stream(monkeypatch):
    # torch's __dlpack__ makes its default stream wait for the current one, which hides a
    # wrong stream from the test above: check the handle handed to the library as well.
    import flashtile._api as api
    seen = []
    forward = api._flashtile.forward

    def spy(q, k, v, out, lse, args):
        seen.append(args.stream)
        return forward(q, k, v, out, lse, args)

    monkeypatch.setattr(api._flashtile, "forward", spy)
    q, k, v = case(1, 16, 16, 2, 2, 64, "cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        flashtile.attention(q, k, v)
    stream.synchronize()
    assert seen == [stream.cuda_stream] and stream.cuda_stream != 0


@pytest.mark.skipif(not _cuda_backend_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_half_precision_cuda(dtype):
    q, k, v = case(2, 130, 257, 8, 2, 128, "cuda", dtype)
    skip_unless_backend(q, k, v, causal=True)
    out = flashtile.attention(q, k, v, causal=True)
    ref = F.scaled_dot_product_attention(*(x.transpose(1, 2).float() for x in (q, k, v)),
                                         attn_mask=_bottom_right(130, 257, "cuda"),
                                         enable_gqa=True).transpose(1, 2)
    low = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)),
                                         attn_mask=_bottom_right(130, 257, "cuda"),
                                         enable_gqa=True).transpose(1, 2)
    # FlashAttention's rule against torch's own same-precision result.
    assert (out.float() - ref).abs().max() <= 2 * (low.float() - ref).abs().max() + 1e-5


def _bottom_right(seqlen_q, seqlen_k, device):
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    return j <= i + seqlen_k - seqlen_q


# --- the custom op ------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("seqlens,causal", [((17, 23), True), ((23, 17), True), ((16, 16), False)])
def test_opcheck(device, requires_grad, seqlens, causal):
    q, k, v = case(2, *seqlens, 4, 2, 32, device)
    args = tuple(x.requires_grad_(requires_grad) for x in (q, k, v)) + (
        causal, None, -1, -1, 0.0, None, None, "auto")
    torch.library.opcheck(torch.ops.flashtile.attention.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    torch._dynamo.reset()
    q, k, v = case(2, 64, 80, 4, 2, 64, device)

    def block(q, k, v):
        out, lse = ft.attention(q * 0.5, k, v, causal=True, return_lse=True)
        return out.sum(dim=2) + 1.0, lse.exp()

    compiled = torch.compile(block, fullgraph=True)
    got, want = compiled(q, k, v), block(q, k, v)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_sdpa(causal):
    # The op's backward (a reference in torch ops) against SDPA's autograd, fp32 on the CPU,
    # including the gradient that flows through lse.
    q, k, v = case(2, 19, 27, 4, 2, 32, "cpu")
    mine = [x.clone().requires_grad_() for x in (q, k, v)]
    theirs = [x.clone().transpose(1, 2).requires_grad_() for x in (q, k, v)]
    out, lse = ft.attention(*mine, causal=causal, return_lse=True)
    mask = _bottom_right(19, 27, "cpu") if causal else None
    ref = F.scaled_dot_product_attention(*theirs, attn_mask=mask, enable_gqa=True).transpose(1, 2)
    scores = theirs[0] @ theirs[1].repeat_interleave(2, dim=1).transpose(-1, -2) / 32 ** 0.5
    if causal:
        scores = scores.masked_fill(~mask, float("-inf"))
    ref_lse = scores.logsumexp(-1)
    w_out, w_lse = torch.randn_like(out), torch.randn_like(lse)
    ((out * w_out).sum() + (lse * w_lse).sum()).backward()
    ((ref * w_out).sum() + (ref_lse * w_lse).sum()).backward()
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a.grad, b.grad.transpose(1, 2), rtol=1e-4, atol=1e-5)


# --- drop-ins -----------------------------------------------------------------------------

class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(37, 37), (21, 50), (50, 21)])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_dropin_matches_sdpa(device, seqlen_q, seqlen_k, causal):
    # BHSD, GQA, causal aligned top-left as SDPA's is_causal.
    query = bshd(2, 4, seqlen_q, 64, device, seed=4)
    key, value = bshd(2, 2, seqlen_k, 64, device, seed=5), bshd(2, 2, seqlen_k, 64, device, seed=6)
    want = F.scaled_dot_product_attention(query, key, value, is_causal=causal, enable_gqa=True,
                                          scale=0.2)
    got = ft.scaled_dot_product_attention(query, key, value, is_causal=causal, enable_gqa=True,
                                          scale=0.2)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_sdpa_dropin_passes_views_without_copies():
    query, key, value = (bshd(2, 4, 33, 32, "cpu", seed=s) for s in (7, 8, 9))
    with _OpLog() as log:
        ft.scaled_dot_product_attention(query, key, value, is_causal=True)
    copies = [op for op in log.ops if any(c in op for c in ("clone", "copy", "contiguous"))]
    assert copies == [] and any("flashtile.attention" in op for op in log.ops), log.ops


def test_sdpa_dropin_refusals():
    query = key = value = bshd(1, 2, 8, 16, "cpu")
    with pytest.raises(ValueError, match="attn_mask is not supported"):
        ft.scaled_dot_product_attention(query, key, value, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="dropout_p must be 0.0"):
        ft.scaled_dot_product_attention(query, key, value, dropout_p=0.1)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        ft.scaled_dot_product_attention(bshd(1, 4, 8, 16, "cpu"), key, value)


@pytest.mark.parametrize("device", DEVICES)
def test_flash_attn_func(device):
    q, k, v = case(2, 40, 57, 6, 2, 64, device)
    out = ft.flash_attn_func(q, k, v, causal=True, softmax_scale=0.15)
    out2, lse, probs = ft.flash_attn_func(q, k, v, 0.0, 0.15, True, return_attn_probs=True)
    ref_out, ref_lse = reference(q, k, v, causal=True, scale=0.15)
    assert torch.equal(out, out2) and probs is None
    assert max_rel_error(out.cpu().numpy(), ref_out) <= 1e-5
    assert lse.shape == (2, 6, 40) and max_rel_error(lse.cpu().numpy(), ref_lse) <= 1e-5
    with pytest.raises(ValueError, match=r"flash_attn_func: dropout_p must be 0.0 .*got 0.1"):
        ft.flash_attn_func(q, k, v, dropout_p=0.1, window_size=(4, 0))


def test_head_dim_stride_fallback_copies_only_then():
    # The torch wrappers, like flash_attn, make rows contiguous only when they are not.
    q, k, v = case(1, 8, 8, 2, 2, 16, "cpu")
    out = ft.attention(q.transpose(2, 3).contiguous().transpose(2, 3), k, v)
    torch.testing.assert_close(out, ft.attention(q, k, v), rtol=0, atol=0)
    assert np.isfinite(out.numpy()).all()


# --- variants and varlen: the ops, their gradients, compile, opcheck, drop-ins ----------------

def variant_params(batch, heads, device, alibi=None, sinks=False, seed=10):
    """ALiBi slopes (None, "heads" or "batch_heads") and sinks as float32 tensors."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    if alibi == "heads":
        params["alibi_slopes"] = (torch.rand(heads, generator=g) * 0.4 + 0.05).to(device)
    elif alibi == "batch_heads":
        params["alibi_slopes"] = (torch.rand(batch, heads, generator=g) * 0.4 + 0.05).to(device)
    if sinks:
        params["sinks"] = (torch.rand(heads, generator=g) * 3 - 1).to(device)
    return params


# Every row sees at least one key (or has a sink), so the float64 autograd reference is
# finite everywhere: seqlen_q <= seqlen_k under causal masks, windows that hold the diagonal.
TORCH_VARIANTS = {
    "window": (dict(window=(5, 3)), {}),
    "causal_window": (dict(causal=True, window=(4, 0)), {}),
    "softcap": (dict(softcap=0.8), {}),
    "alibi": (dict(), dict(alibi="heads")),
    "alibi_per_batch": (dict(causal=True), dict(alibi="batch_heads")),
    "sinks": (dict(), dict(sinks=True)),
    "everything": (dict(causal=True, window=(7, 0), softcap=1.5, scale=0.3),
                   dict(alibi="batch_heads", sinks=True)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", TORCH_VARIANTS)
def test_variant_forward_matches_reference(device, name):
    options, params = TORCH_VARIANTS[name]
    q, k, v = case(2, 19, 31, 4, 2, 32, device)
    params = variant_params(2, 4, device, **params)
    skip_unless_backend(q, k, v, **options, **params)
    out, lse = ft.attention(q, k, v, return_lse=True, **options, **params)
    assert out.device == q.device and lse.shape == (2, 4, 19)
    ref_out, ref_lse = reference(q, k, v, **options, **params)
    assert max_rel_error(out.cpu().numpy(), ref_out) <= 1e-5
    assert max_rel_error(lse.cpu().numpy(), ref_lse) <= 1e-5


def _leaves(tensors):
    return {name: t.detach().clone().requires_grad_() for name, t in tensors.items()}


def _compare_gradients(ours, theirs, names, rtol=1e-4, atol=1e-5):
    for name in names:
        assert ours[name].grad is not None, name
        torch.testing.assert_close(ours[name].grad, theirs[name].grad.to(ours[name].dtype),
                                   rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", TORCH_VARIANTS)
def test_variant_gradients_match_autograd_of_the_reference(device, name):
    # The op's hand-written backward against torch's autograd through torch_reference, for
    # q, k, v and the variant parameters, with gradients flowing into out and lse.
    options, params = TORCH_VARIANTS[name]
    q, k, v = case(2, 19, 31, 4, 2, 32, device)
    tensors = {"q": q, "k": k, "v": v, **variant_params(2, 4, device, **params)}
    skip_unless_backend(**tensors, **options)
    ours, theirs = _leaves(tensors), _leaves(tensors)
    out, lse = ft.attention(**ours, return_lse=True, **options)
    ref_out, ref_lse = torch_reference(**theirs, **options)
    w_out, w_lse = torch.randn_like(out), torch.randn_like(lse)
    ((out * w_out).sum() + (lse * w_lse).sum()).backward()
    ((ref_out * w_out).sum() + (ref_lse * w_lse).sum()).backward()
    _compare_gradients(ours, theirs, tensors)


def test_gradients_of_rows_that_see_nothing_are_zero():
    # Causal with more queries than keys: the first rows see no key (out 0, lse -inf);
    # they pass no gradient anywhere and nothing becomes NaN.
    q, k, v = (x.requires_grad_() for x in case(1, 9, 4, 2, 2, 16, "cpu"))
    out, lse = ft.attention(q, k, v, causal=True, return_lse=True)
    (out.sum() + lse[torch.isfinite(lse)].sum()).backward()
    assert torch.all(q.grad[:, :5] == 0) and torch.isfinite(q.grad).all()
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()


def packed(lens_q, lens_k, heads_q, heads_kv, head_dim, device, spare_k=0):
    cu_q = torch.tensor([0] + lens_q, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu_k = torch.tensor([0] + lens_k, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    total_q, total_k = int(cu_q[-1]), int(cu_k[-1]) + spare_k
    q = bshd(1, total_q, heads_q, head_dim, device, seed=11)[0]
    k = bshd(1, total_k, heads_kv, head_dim, device, seed=12)[0]
    v = bshd(1, total_k, heads_kv, head_dim, device, seed=13)[0]
    return q, k, v, cu_q.to(device), cu_k.to(device)


# Empty sequences (no queries; no keys), length-1 sequences, seqlen_q != seqlen_k.
VARLEN_LENS = ([3, 0, 1, 9, 5, 1], [5, 2, 1, 13, 5, 0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["plain", "causal"] + list(TORCH_VARIANTS))
def test_varlen_forward_matches_reference(device, name):
    options, params = TORCH_VARIANTS.get(name, (dict(causal=name == "causal"), {}))
    q, k, v, cu_q, cu_k = packed(*VARLEN_LENS, 4, 2, 32, device)
    params = variant_params(len(VARLEN_LENS[0]), 4, device, **params)
    skip_unless_varlen_backend(q, k, v, cu_q, cu_k, **options, **params)
    out, lse = ft.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **options, **params)
    assert out.shape == q.shape and lse.shape == (4, q.shape[0])
    ref_out, ref_lse = reference_attention_varlen(
        *(numpy_of(x) for x in (q, k, v, cu_q, cu_k)), **options,
        **{n: numpy_of(x) for n, x in params.items()})
    assert max_rel_error(out.cpu().numpy(), ref_out) <= 1e-5
    assert max_rel_error(lse.cpu().numpy(), ref_lse) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["causal", "window", "everything", "alibi", "sinks"])
def test_varlen_gradients_match_autograd_of_the_reference(device, name):
    # Every sequence has keys and every row sees one (seqlen_q <= seqlen_k), as the float64
    # autograd reference needs; one sequence has no queries; k has spare rows at its end and
    # seqused_k shortens two sequences.
    options, params = TORCH_VARIANTS.get(name, (dict(causal=True), {}))
    lens_q, lens_k = [3, 0, 1, 9, 6], [5, 2, 1, 13, 8]
    q, k, v, cu_q, cu_k = packed(lens_q, lens_k, 4, 2, 16, device, spare_k=3)
    seqused_k = torch.tensor([5, 1, 1, 11, 8], dtype=torch.int32, device=device)
    tensors = {"q": q, "k": k, "v": v, **variant_params(5, 4, device, **params)}
    skip_unless_varlen_backend(q, k, v, cu_q, cu_k, seqused_k=seqused_k, **options,
                               **{n: t for n, t in tensors.items() if n not in "qkv"})
    ours, theirs = _leaves(tensors), _leaves(tensors)
    out, lse = ft.attention_varlen(ours["q"], ours["k"], ours["v"], cu_q, cu_k,
                                   seqused_k=seqused_k, return_lse=True, **options,
                                   **{n: t for n, t in ours.items() if n not in "qkv"})
    ref_out, ref_lse = torch_reference_varlen(theirs["q"], theirs["k"], theirs["v"], cu_q,
                                              cu_k, seqused_k=seqused_k, **options,
                                              **{n: t for n, t in theirs.items()
                                                 if n not in "qkv"})
    w_out, w_lse = torch.randn_like(out), torch.randn_like(lse)
    ((out * w_out).sum() + (lse * w_lse).sum()).backward()
    ((ref_out * w_out).sum() + (ref_lse * w_lse).sum()).backward()
    _compare_gradients(ours, theirs, tensors)
    # Keys nobody sees (spare rows, past seqused_k) get no gradient.
    unused = torch.ones(k.shape[0], dtype=torch.bool)
    for b, used in enumerate(seqused_k.tolist()):
        unused[int(cu_k[b]):int(cu_k[b]) + used] = False
    assert torch.all(ours["k"].grad[unused.to(device)] == 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck_with_variants(device, requires_grad):
    q, k, v = case(2, 17, 23, 4, 2, 32, device)
    params = variant_params(2, 4, device, alibi="batch_heads", sinks=True)
    skip_unless_backend(q, k, v, causal=True, scale=0.2, window=(6, 0), softcap=1.5, **params)
    tensors = [x.requires_grad_(requires_grad) for x in (q, k, v, params["alibi_slopes"],
                                                         params["sinks"])]
    args = (*tensors[:3], True, 0.2, 6, 0, 1.5, *tensors[3:], "auto")
    torch.library.opcheck(torch.ops.flashtile.attention.default, args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck_varlen(device, requires_grad):
    q, k, v, cu_q, cu_k = packed([5, 0, 9], [7, 3, 9], 4, 2, 32, device)
    params = variant_params(3, 4, device, alibi="heads", sinks=True)
    skip_unless_varlen_backend(q, k, v, cu_q, cu_k, causal=True, window=(5, -1), softcap=2.0,
                               **params)
    tensors = [x.requires_grad_(requires_grad) for x in (q, k, v, params["alibi_slopes"],
                                                         params["sinks"])]
    args = (*tensors[:3], cu_q, cu_k, 9, None, None, True, None, 5, -1, 2.0, *tensors[3:],
            "auto")
    torch.library.opcheck(torch.ops.flashtile.attention_varlen.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_variants_and_varlen(device):
    # Forward and backward of both ops inside one compiled graph, against eager.
    torch._dynamo.reset()
    q, k, v = case(2, 24, 40, 4, 2, 32, device)
    params = variant_params(2, 4, device, alibi="heads", sinks=True)
    pq, pk, pv, cu_q, cu_k = packed([7, 0, 12], [9, 4, 12], 4, 2, 32, device)
    skip_unless_backend(q, k, v, causal=True, window=(9, 0), softcap=2.0, **params)
    skip_unless_varlen_backend(pq, pk, pv, cu_q, cu_k, causal=True, window=(5, 0),
                               sinks=params["sinks"])

    def block(q, k, v, alibi, sinks, pq, pk, pv):
        dense, lse = ft.attention(q, k, v, causal=True, window=(9, 0), softcap=2.0,
                                  alibi_slopes=alibi, sinks=sinks, return_lse=True)
        varlen = ft.attention_varlen(pq, pk, pv, cu_q, cu_k, 12, 12, causal=True,
                                     window=(5, 0), sinks=sinks)
        return dense.square().sum() + lse.sum() + varlen.square().sum()

    inputs = [x.detach().clone().requires_grad_() for x in
              (q, k, v, params["alibi_slopes"], params["sinks"], pq, pk, pv)]
    eager_inputs = [x.detach().clone().requires_grad_() for x in inputs]
    compiled = torch.compile(block, fullgraph=True)
    got, want = compiled(*inputs), block(*eager_inputs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got.backward()
    want.backward()
    for a, b in zip(inputs, eager_inputs):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_flash_attn_func_variants(device):
    q, k, v = case(2, 33, 45, 6, 2, 32, device)
    alibi = variant_params(2, 6, device, alibi="batch_heads")["alibi_slopes"]
    skip_unless_backend(q, k, v, causal=True, window=(11, 0), softcap=3.0, alibi_slopes=alibi)
    out, lse, probs = ft.flash_attn_func(q, k, v, softmax_scale=0.2, causal=True,
                                         window_size=(11, 0), softcap=3.0, alibi_slopes=alibi,
                                         return_attn_probs=True)
    ref_out, ref_lse = reference(q, k, v, causal=True, scale=0.2, window=(11, 0), softcap=3.0,
                                 alibi_slopes=alibi)
    assert probs is None
    assert max_rel_error(out.cpu().numpy(), ref_out) <= 1e-5
    assert max_rel_error(lse.cpu().numpy(), ref_lse) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_flash_attn_varlen_func(device):
    lens_q, lens_k = [4, 1, 0, 10], [6, 1, 3, 10]
    q, k, v, cu_q, cu_k = packed(lens_q, lens_k, 6, 3, 32, device)
    alibi = variant_params(4, 6, device, alibi="heads")["alibi_slopes"]
    kwargs = dict(softmax_scale=0.25, causal=True, window_size=(6, 0), softcap=2.5,
                  alibi_slopes=alibi)
    skip_unless_varlen_backend(q, k, v, cu_q, cu_k, causal=True, window=(6, 0), softcap=2.5,
                               alibi_slopes=alibi)
    out = ft.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 10, 10, **kwargs)
    out2, lse, probs = ft.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 10, 10,
                                                 return_attn_probs=True, **kwargs)
    assert torch.equal(out, out2) and probs is None and lse.shape == (6, q.shape[0])
    ref_out, ref_lse = reference_attention_varlen(
        *(numpy_of(x) for x in (q, k, v, cu_q, cu_k)), causal=True, scale=0.25, window=(6, 0),
        softcap=2.5, alibi_slopes=numpy_of(alibi))
    assert max_rel_error(out.cpu().numpy(), ref_out) <= 1e-5
    assert max_rel_error(lse.cpu().numpy(), ref_lse) <= 1e-5


def test_flash_attn_refusals():
    q, k, v, cu_q, cu_k = packed([4, 6], [4, 6], 2, 2, 16, "cpu")
    with pytest.raises(ValueError, match=r"flash_attn_varlen_func: dropout_p must be 0.0"):
        ft.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 6, dropout_p=0.1)
    with pytest.raises(ValueError, match=r"block_table \(paged KV\) is not supported"):
        ft.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 6,
                                  block_table=torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"cu_seqlens_q\.dtype must be int32, got int64"):
        ft.flash_attn_varlen_func(q, k, v, cu_q.long(), cu_k, 6, 6)
    with pytest.raises(ValueError, match=r"cu_seqlens_k must be non-decreasing"):
        ft.flash_attn_varlen_func(q, k, v, cu_q, torch.tensor([0, 7, 6], dtype=torch.int32), 6, 6)
    with pytest.raises(ValueError, match=r"max_seqlen_q \(5\) is smaller than the longest"):
        ft.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 6)
    with pytest.raises(ValueError, match=r"alibi_slopes must be shaped"):
        ft.flash_attn_func(q[None], k[None], v[None], alibi_slopes=torch.ones(3))
    with pytest.raises(TypeError, match=r"alibi_slopes\.dtype must be float32, got float64"):
        ft.flash_attn_func(q[None], k[None], v[None], alibi_slopes=torch.ones(2).double())
    with pytest.raises(ValueError, match=r"window\.left must be -1 \(unbounded\) or >= 0"):
        ft.flash_attn_func(q[None], k[None], v[None], window_size=(-4, 0))


@pytest.mark.skipif(not _cuda_backend_available(), reason="needs CUDA")
def test_variant_parameters_on_the_wrong_device_are_refused():
    q, k, v = case(1, 8, 8, 2, 2, 16, "cuda")
    with pytest.raises(ValueError, match=r"alibi_slopes\.device must match q\.device"):
        ft.attention(q, k, v, alibi_slopes=torch.ones(2))
    pq, pk, pv, cu_q, cu_k = packed([4, 4], [4, 4], 2, 2, 16, "cuda")
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be on the device of q \(cuda:0\)"):
        ft.attention_varlen(pq, pk, pv, cu_q.cpu(), cu_k)


# --- torch in the modes users run it: dynamic shapes, export, CUDA graphs --------------------

@pytest.mark.parametrize("device", DEVICES)
def test_compile_dynamic_does_not_recompile_per_length(device):
    compilations = []

    def counting_backend(graph_module, example_inputs):
        compilations.append(graph_module)
        return graph_module.forward

    def step(q, k, v):
        return ft.attention(q, k, v, causal=True, window=(16, 0), softcap=20.0) * 2

    torch._dynamo.reset()
    compiled = torch.compile(step, backend=counting_backend, dynamic=True, fullgraph=True)
    for seqlen in (24, 37, 61, 130):
        q, k, v = case(2, seqlen, seqlen, 4, 2, 32, device)
        expected = step(q, k, v)
        torch.testing.assert_close(compiled(q, k, v), expected, rtol=0, atol=0)
    assert len(compilations) == 1, f"compiled {len(compilations)} times for 4 sequence lengths"


@pytest.mark.parametrize("device", DEVICES)
def test_export_round_trips(device, tmp_path):
    class Attention(torch.nn.Module):
        def forward(self, q, k, v, slopes):
            return ft.attention(q, k, v, causal=True, alibi_slopes=slopes)

    q, k, v = case(1, 40, 40, 4, 2, 32, device)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=device)
    exported = torch.export.export(Attention(), (q, k, v, slopes))
    path = tmp_path / "attention.pt2"
    torch.export.save(exported, path)
    loaded = torch.export.load(path)
    expected = Attention()(q, k, v, slopes)
    torch.testing.assert_close(loaded.module()(q, k, v, slopes), expected, rtol=0, atol=0)
    q2, k2, v2 = case(1, 40, 40, 4, 2, 32, device)  # other values, same shapes
    torch.testing.assert_close(loaded.module()(q2, k2, v2, slopes), Attention()(q2, k2, v2, slopes),
                               rtol=0, atol=0)


@pytest.mark.skipif(not _cuda_backend_available(), reason="needs CUDA")
def test_cuda_graph_replay():
    q, k, v = case(2, 300, 300, 8, 2, 64, "cuda", torch.bfloat16)
    static_q, static_k, static_v = q.clone(), k.clone(), v.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up outside the capture, on the capturing stream
        ft.attention(static_q, static_k, static_v, causal=True, window=(64, 0))
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = ft.attention(static_q, static_k, static_v, causal=True, window=(64, 0))
    for seed in (5, 6):
        q, k, v = case(2, 300, 300, 8, 2, 64, "cuda", torch.bfloat16)
        q, k, v = q * (seed - 4), k, v + seed  # new values, same buffers
        static_q.copy_(q), static_k.copy_(k), static_v.copy_(v)
        graph.replay()
        torch.testing.assert_close(static_out, ft.attention(q, k, v, causal=True, window=(64, 0)),
                                   rtol=0, atol=0)


@pytest.mark.skipif(not _cuda_backend_available() or torch.cuda.device_count() < 2,
                    reason="needs two CUDA devices")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_op_runs_on_the_tensors_device_and_keeps_the_current_one(dtype):
    """Under torch.cuda.device(c), tensors on the other device: the op (forward and the
    autograd backward) runs there, gives that device's results (the forward bit for bit; the
    gradients within dtype tolerance, as dQ's atomics may add in another order), and leaves
    c current."""
    for current, tensors in ((0, 1), (1, 0)):
        q, k, v = (x.requires_grad_() for x in case(1, 130, 130, 4, 2, 64, f"cuda:{tensors}", dtype))
        with torch.cuda.device(tensors):  # the same call with the tensors' device current
            expected = ft.attention(q, k, v, causal=True)
            expected_grads = torch.autograd.grad(expected.float().sum(), (q, k, v))
        with torch.cuda.device(current):
            out = ft.attention(q, k, v, causal=True)
            grads = torch.autograd.grad(out.float().sum(), (q, k, v))
            assert torch.cuda.current_device() == current
        assert out.device == q.device
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        for g, e in zip(grads, expected_grads):
            assert g.device == q.device
            torch.testing.assert_close(g, e)
