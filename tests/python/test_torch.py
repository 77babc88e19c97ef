"""flashtile with torch tensors: the plain API, the custom op, the SDPA and flash_attn drop-ins.

CPU tests run wherever torch is installed; CUDA tests need a GPU and a flashtile CUDA
backend; half-precision CUDA tests skip while no CUDA backend takes that dtype.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashtile  # noqa: E402
import flashtile.torch as ft  # noqa: E402
from conftest import max_rel_error, reference_attention  # noqa: E402
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


def reference(q, k, v, causal=False, scale=None):
    out, lse = reference_attention(*(x.float().cpu().numpy() for x in (q, k, v)),
                                   causal=causal, scale=scale)
    return out, lse


def skip_unless_backend(q, k, v, **kwargs):
    """Skips the test when no flashtile backend takes this call (e.g. fp16 on CUDA today)."""
    try:
        return flashtile.plan(q, k, v, **kwargs)
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

    def spy(*args):
        seen.append(args[8])  # the stream argument
        return forward(*args)

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
    args = tuple(x.requires_grad_(requires_grad) for x in (q, k, v)) + (causal, None, "auto")
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
    out2, lse = ft.flash_attn_func(q, k, v, 0.0, 0.15, True, return_attn_probs=True)
    ref_out, ref_lse = reference(q, k, v, causal=True, scale=0.15)
    assert torch.equal(out, out2)
    assert max_rel_error(out.cpu().numpy(), ref_out) <= 1e-5
    assert lse.shape == (2, 6, 40) and max_rel_error(lse.cpu().numpy(), ref_lse) <= 1e-5
    with pytest.raises(ValueError, match=r"not supported: dropout_p=0.1, window_size=\(4, 0\)"):
        ft.flash_attn_func(q, k, v, dropout_p=0.1, window_size=(4, 0))


def test_head_dim_stride_fallback_copies_only_then():
    # The torch wrappers, like flash_attn, make rows contiguous only when they are not.
    q, k, v = case(1, 8, 8, 2, 2, 16, "cpu")
    out = ft.attention(q.transpose(2, 3).contiguous().transpose(2, 3), k, v)
    torch.testing.assert_close(out, ft.attention(q, k, v), rtol=0, atol=0)
    assert np.isfinite(out.numpy()).all()
