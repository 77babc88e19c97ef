"""The backward pass from Python: flashtile.attention_backward(_varlen) on numpy and DLPack
arrays, the torch ops' autograd through the kernels (CPU), gradcheck on the float64
reference path, opcheck, and flash_attn_func / flash_attn_varlen_func training.

The kernels' gradients are compared with the reference backward in float64 (itself checked
by gradcheck against finite differences of the float64 reference forward) and with the C++
oracle (backend="cpu_reference", checked against finite differences in the C++ suite).
"""

import numpy as np
import pytest

import flashtile
from conftest import random_case

RNG_SEED = 7


def rel(a, b):
    """Normwise relative error, absolute where the reference is all zeros (as the library's
    rule: with one key, dq is exactly 0 and the kernels leave fp32 roundoff)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    norm = np.linalg.norm(b)
    return np.linalg.norm(a - b) / (norm if norm > 0 else 1.0)


def forward_and_dout(rng, q, k, v, **variant):
    out, lse = flashtile.attention(q, k, v, return_lse=True, **variant)
    dout = rng.uniform(-1.0, 1.0, out.shape).astype(q.dtype)
    return out, lse, dout


VARIANTS = [
    {},
    {"causal": True},
    {"window": (9, 3)},
    {"causal": True, "window": (5, -1), "softcap": 1.5},
    {"softcap": 0.7, "scale": 0.3},
    {"alibi": True},
    {"sinks": True},
    {"causal": True, "window": (12, 0), "softcap": 2.0, "alibi": True, "sinks": True},
]


def varlen_case(rng, lengths_q, lengths_k, seqused_k, heads_q=4, heads_kv=2, head_dim=16):
    """A packed fp32 batch: q, k, v, cu_seqlens_q, cu_seqlens_k and seqused_k (int32)."""
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    q = rng.uniform(-1, 1, (cu_q[-1], heads_q, head_dim)).astype(np.float32)
    k = rng.uniform(-1, 1, (cu_k[-1], heads_kv, head_dim)).astype(np.float32)
    v = rng.uniform(-1, 1, (cu_k[-1], heads_kv, head_dim)).astype(np.float32)
    return q, k, v, cu_q, cu_k, np.array(seqused_k, np.int32)


def variant_args(rng, variant, heads_q):
    args = {k: v for k, v in variant.items() if k not in ("alibi", "sinks")}
    if variant.get("alibi"):
        args["alibi_slopes"] = rng.uniform(0.05, 0.5, heads_q).astype(np.float32)
    if variant.get("sinks"):
        args["sinks"] = rng.uniform(-1.0, 1.0, heads_q).astype(np.float32)
    return args


# --- numpy: the kernels against the C++ oracle -------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("seqlens", [(17, 23), (31, 9), (1, 1)])
def test_numpy_backward_matches_the_oracle(variant, seqlens):
    rng = np.random.default_rng(RNG_SEED)
    q, k, v = random_case(rng, 2, *seqlens, 4, 2, 24)
    args = variant_args(rng, variant, 4)
    out, lse, dout = forward_and_dout(rng, q, k, v, **args)
    got = flashtile.attention_backward(dout, q, k, v, out, lse, backend="cpu_flash", **args)
    want = flashtile.attention_backward(dout, q, k, v, out, lse, backend="cpu_reference", **args)
    assert len(got) == (4 if "sinks" in args else 3)
    for g, w, like in zip(got, want, (q, k, v, None)):
        if like is not None:
            assert g.shape == like.shape and g.dtype == like.dtype
        assert rel(g, w) <= 1e-5


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_numpy_16_bit(dtype):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    np_dtype = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    rng = np.random.default_rng(RNG_SEED)
    q, k, v = (x.astype(np_dtype) for x in random_case(rng, 1, 40, 50, 2, 1, 32))
    out, lse, dout = forward_and_dout(rng, q, k, v, causal=True)
    got = flashtile.attention_backward(dout, q, k, v, out, lse, causal=True)
    want = flashtile.attention_backward(dout, q, k, v, out, lse, causal=True,
                                        backend="cpu_reference")
    unit = 2.0 ** -10 if dtype == "float16" else 2.0 ** -7
    for g, w in zip(got, want):
        assert g.dtype == q.dtype
        # Both round the same fp32-accurate gradient to the dtype: a few units apart at most.
        assert np.abs(g.astype(np.float32) - w.astype(np.float32)).max() <= 4 * unit


def test_varlen_numpy_with_empty_and_length_one_sequences():
    rng = np.random.default_rng(RNG_SEED)
    q, k, v, cu_q, cu_k, seqused_k = varlen_case(rng, [3, 0, 1, 20], [5, 2, 1, 18], [5, 0, 1, 11])
    args = variant_args(rng, {"causal": True, "softcap": 2.0, "sinks": True}, 4)
    out, lse = flashtile.attention_varlen(q, k, v, cu_q, cu_k, seqused_k=seqused_k,
                                          return_lse=True, **args)
    dout = rng.uniform(-1, 1, out.shape).astype(np.float32)
    got = flashtile.attention_backward_varlen(dout, q, k, v, out, lse, cu_q, cu_k,
                                              seqused_k=seqused_k, **args)
    want = flashtile.attention_backward_varlen(dout, q, k, v, out, lse, cu_q, cu_k,
                                               seqused_k=seqused_k, backend="cpu_reference",
                                               **args)
    for g, w in zip(got, want):
        assert rel(g, w) <= 1e-5
    # Keys past seqused_k get no gradient.
    assert np.all(got[1][cu_k[3] + 11:cu_k[4]] == 0) and np.all(got[2][cu_k[1]:cu_k[2]] == 0)


def test_deterministic_is_bitwise():
    rng = np.random.default_rng(RNG_SEED)
    q, k, v = random_case(rng, 2, 100, 130, 4, 2, 32)
    out, lse, dout = forward_and_dout(rng, q, k, v, causal=True)
    first = flashtile.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
    for _ in range(5):
        again = flashtile.attention_backward(dout, q, k, v, out, lse, causal=True,
                                             deterministic=True)
        for a, b in zip(first, again):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_numpy_lse_gradient_matches_the_oracle(variant):
    """dlse (a gradient into the LSE) through cpu_flash against the C++ oracle; it changes dq,
    dk (and dsinks) and leaves dv (which P alone forms) as it was."""
    rng = np.random.default_rng(RNG_SEED)
    q, k, v = random_case(rng, 2, 19, 26, 4, 2, 24)
    args = variant_args(rng, variant, 4)
    out, lse, dout = forward_and_dout(rng, q, k, v, **args)
    dlse = rng.uniform(-1.0, 1.0, lse.shape).astype(np.float32)
    got = flashtile.attention_backward(dout, q, k, v, out, lse, backend="cpu_flash", dlse=dlse,
                                       **args)
    want = flashtile.attention_backward(dout, q, k, v, out, lse, backend="cpu_reference",
                                        dlse=dlse, **args)
    without = flashtile.attention_backward(dout, q, k, v, out, lse, backend="cpu_flash", **args)
    for g, w in zip(got, want):
        assert rel(g, w) <= 1e-5
    assert rel(without[0], want[0]) > 1e-3 and rel(without[1], want[1]) > 1e-3
    assert np.array_equal(without[2], got[2])


@pytest.mark.parametrize("sinks", [False, True])
def test_varlen_lse_gradient_on_rows_that_see_no_key(sinks):
    """Sequence 1 has queries and no used key: lse -inf (or the sink's logit), P = 0; its rows'
    dlse must give no NaN, and with sinks it reaches dsinks (∂lse/∂sink = 1 there)."""
    rng = np.random.default_rng(RNG_SEED)
    q, k, v, cu_q, cu_k, seqused_k = varlen_case(rng, [3, 4, 1, 20], [5, 2, 1, 18], [5, 0, 1, 11])
    args = variant_args(rng, {"causal": True, "softcap": 2.0, "sinks": sinks}, 4)
    out, lse = flashtile.attention_varlen(q, k, v, cu_q, cu_k, seqused_k=seqused_k,
                                          return_lse=True, **args)
    assert np.all(np.isinf(lse[:, 3:7])) != sinks
    dout = rng.uniform(-1, 1, out.shape).astype(np.float32)
    dlse = rng.uniform(-1, 1, lse.shape).astype(np.float32)
    got = flashtile.attention_backward_varlen(dout, q, k, v, out, lse, cu_q, cu_k,
                                              seqused_k=seqused_k, dlse=dlse, **args)
    want = flashtile.attention_backward_varlen(dout, q, k, v, out, lse, cu_q, cu_k,
                                               seqused_k=seqused_k, backend="cpu_reference",
                                               dlse=dlse, **args)
    for g, w in zip(got, want):
        assert np.all(np.isfinite(g))
        assert rel(g, w) <= 1e-5
    assert np.all(got[0][3:7] == 0)  # those rows see nothing: no gradient for their queries


def test_lse_gradient_bad_inputs():
    rng = np.random.default_rng(RNG_SEED)
    q, k, v = random_case(rng, 1, 6, 6, 2, 2, 8)
    out, lse, dout = forward_and_dout(rng, q, k, v)
    for dlse, error, message in (
            (lse[:, :1], ValueError, "dlse.shape must be"),
            (lse.astype(np.float64), TypeError, "dlse.dtype must be float32"),
            (lse.transpose(0, 2, 1).copy().transpose(0, 2, 1), ValueError,
             "dlse must be C-contiguous")):
        with pytest.raises(error, match=message):
            flashtile.attention_backward(dout, q, k, v, out, lse, dlse=dlse)


README_BACKWARD_EXAMPLE = '''
import numpy as np, flashtile
q = np.random.randn(2, 1024, 8, 64).astype(np.float32)   # (batch, seqlen, heads, head_dim)
k = np.random.randn(2, 1024, 2, 64).astype(np.float32)   # 2 KV heads: GQA
v = np.random.randn(2, 1024, 2, 64).astype(np.float32)
out, lse = flashtile.attention(q, k, v, causal=True, return_lse=True)  # q, k, v as above
dout = np.ones_like(out)                                                # ∂loss/∂out
dq, dk, dv = flashtile.attention_backward(dout, q, k, v, out, lse, causal=True)
'''


def test_readme_backward_example():
    """The README's Backward snippet, verbatim, after its numpy example's setup."""
    scope = {}
    exec(README_BACKWARD_EXAMPLE, scope)
    assert scope["dq"].shape == scope["q"].shape and scope["dk"].shape == scope["k"].shape


# --- argument checking, as attention() --------------------------------------------------------

def bad_calls():
    rng = np.random.default_rng(RNG_SEED)
    q, k, v = random_case(rng, 1, 5, 6, 2, 1, 8)
    out, lse = flashtile.attention(q, k, v, return_lse=True)
    dout = np.ones_like(q)
    return [
        ("dout shape", (dout[:, :4], q, k, v, out, lse), {}, ValueError, "dout.shape[1] must equal"),
        ("dout dtype", (dout.astype(np.float16), q, k, v, out, lse), {}, TypeError,
         "dout.dtype must match q.dtype"),
        ("lse shape", (dout, q, k, v, out, lse[:, :1]), {}, ValueError, "lse.shape must be"),
        ("lse dtype", (dout, q, k, v, out, lse.astype(np.float64)), {}, TypeError,
         "lse.dtype must be float32"),
        ("out shape", (dout, q, k, v, out[:, :3], lse), {}, ValueError, "out.shape[1]"),
        ("deterministic", (dout, q, k, v, out, lse), {"deterministic": "yes"}, TypeError,
         "deterministic must be True or False"),
        ("backend", (dout, q, k, v, out, lse), {"backend": "cpu_standard"}, ValueError,
         "cpu_standard has no backward pass"),
        ("window", (dout, q, k, v, out, lse), {"window": (3,)}, ValueError, "window must be a pair"),
        ("not an array", (dout.tolist(), q, k, v, out, lse), {}, TypeError, "must be a numpy array"),
    ]


@pytest.mark.parametrize("name,args,kwargs,error,message", bad_calls(), ids=lambda x: str(x)[:20])
def test_bad_arguments(name, args, kwargs, error, message):
    with pytest.raises(error, match=message.replace("[", r"\[").replace("(", r"\(")):
        flashtile.attention_backward(*args, **kwargs)


# --- torch --------------------------------------------------------------------------------------

try:
    import torch
    import flashtile.torch as ft
except ImportError:  # the numpy tests above still run
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def torch_case(batch, sq, sk, hq, hkv, d, dtype=None, seed=0):
    # (dtype None: float32; no torch attribute in the signature, which is read at import
    # time, so the module still loads and its numpy tests run where torch is missing)
    dtype = torch.float32 if dtype is None else dtype
    g = torch.Generator().manual_seed(seed)
    make = lambda s, h: (torch.rand((batch, s, h, d), generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    return make(sq, hq), make(sk, hkv), make(sk, hkv)


@needs_torch
def test_dlpack_torch_tensors_in_and_out():
    q, k, v = torch_case(1, 20, 30, 2, 2, 16)
    out, lse = flashtile.attention(q, k, v, return_lse=True)
    dq, dk, dv = flashtile.attention_backward(torch.ones_like(out), q, k, v, out, lse)
    assert all(isinstance(x, torch.Tensor) for x in (dq, dk, dv))
    assert dk.shape == k.shape and dq.dtype == q.dtype


@needs_torch
@pytest.mark.parametrize("through_lse", [False, True], ids=["out", "out_and_lse"])
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_autograd_uses_the_kernels_and_matches_the_float64_reference(variant, through_lse):
    """The float32 gradients are the kernels' own and within 1e-5 of the float64 reference
    path; through_lse: the loss uses lse too (as ring attention's merge makes), and its
    gradient reaches the kernels as dlse."""
    rng = np.random.default_rng(RNG_SEED)
    args = variant_args(rng, variant, 4)
    params = {n: torch.tensor(args.pop(n)) for n in ("alibi_slopes", "sinks") if n in args}
    q, k, v = torch_case(2, 19, 26, 4, 2, 16)
    dout = torch.rand(q.shape, dtype=torch.float64) * 2 - 1
    dlse = torch.rand((2, 4, 19), dtype=torch.float64) * 2 - 1 if through_lse else None
    grads = {}
    for dtype in (torch.float32, torch.float64):
        leaves = [x.detach().to(dtype).clone().requires_grad_() for x in (q, k, v)]
        sinks = params.get("sinks")
        if sinks is not None:
            sinks = sinks.detach().to(dtype).clone().requires_grad_()
        result = ft.attention(*leaves, alibi_slopes=params.get("alibi_slopes"), sinks=sinks,
                              return_lse=through_lse, **args)
        out, lse = result if through_lse else (result, None)
        loss = (out * dout.to(dtype)).sum()
        if through_lse:
            loss = loss + (lse * dlse.to(dtype)).sum()
        loss.backward()
        grads[dtype] = [x.grad for x in leaves] + ([sinks.grad] if sinks is not None else [])
    for g32, g64 in zip(grads[torch.float32], grads[torch.float64]):
        assert rel(g32.numpy(), g64.numpy()) <= 1e-5
    # The float32 gradients are the kernels' own.
    out, lse = flashtile.attention(q, k, v, return_lse=True, sinks=params.get("sinks"),
                                   alibi_slopes=params.get("alibi_slopes"), **args)
    direct = flashtile.attention_backward(
        dout.float(), q, k, v, out, lse, dlse=dlse.float() if through_lse else None,
        sinks=params.get("sinks"), alibi_slopes=params.get("alibi_slopes"), **args)
    for a, b in zip(grads[torch.float32], direct):
        assert torch.equal(a, b)


@needs_torch
def test_autograd_of_the_lse_alone_and_of_a_varlen_batch():
    """Only lse in the loss (out's gradient is None: the op passes zeros), dense; and a packed
    batch with a sequence whose queries see no key (lse -inf: no NaN), out and lse together."""
    q, k, v = torch_case(2, 13, 9, 4, 1, 8)
    grads = {}
    for dtype in (torch.float32, torch.float64):
        leaves = [x.detach().to(dtype).clone().requires_grad_() for x in (q, k, v)]
        _, lse = ft.attention(*leaves, causal=True, softcap=1.5, return_lse=True)
        (torch.where(torch.isinf(lse), 0.0, lse) ** 2).sum().backward()
        grads[dtype] = [x.grad for x in leaves]
    for g32, g64 in zip(grads[torch.float32], grads[torch.float64]):
        assert torch.all(torch.isfinite(g32)) and rel(g32.numpy(), g64.numpy()) <= 1e-5
    cu_q = torch.tensor([0, 3, 7, 8, 28], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 7, 8, 26], dtype=torch.int32)
    seqused_k = torch.tensor([5, 0, 1, 11], dtype=torch.int32)
    g = torch.Generator().manual_seed(5)
    packed = [torch.rand((n, h, 16), generator=g, dtype=torch.float64) - 0.5
              for n, h in ((28, 4), (26, 2), (26, 2))]
    dout = torch.rand((28, 4, 16), generator=g, dtype=torch.float64) - 0.5
    dlse = torch.rand((4, 28), generator=g, dtype=torch.float64) - 0.5
    vgrads = {}
    for dtype in (torch.float32, torch.float64):
        leaves = [x.to(dtype).clone().requires_grad_() for x in packed]
        out, lse = ft.attention_varlen(*leaves, cu_q, cu_k, seqused_k=seqused_k, causal=True,
                                       return_lse=True)
        assert torch.all(torch.isinf(lse[:, 3:7]))
        lse_term = torch.where(torch.isinf(lse), 0.0, lse) * dlse.to(dtype)
        ((out * dout.to(dtype)).sum() + lse_term.sum()).backward()
        vgrads[dtype] = [x.grad for x in leaves]
    for g32, g64 in zip(vgrads[torch.float32], vgrads[torch.float64]):
        assert torch.all(torch.isfinite(g32)) and rel(g32.numpy(), g64.numpy()) <= 1e-5


@needs_torch
def test_merging_two_key_halves_through_their_lse_trains_like_full_attention():
    """Ring / context-parallel attention's merge: attention over each half of the keys, then
    out = Σ_h exp(lse_h - lse)·out_h with lse = logsumexp_h(lse_h). Its gradients (the kernels,
    through both halves' out and lse) equal full attention's."""
    q, k, v = torch_case(2, 23, 40, 4, 2, 16, seed=6)
    dout = torch.rand(q.shape, dtype=torch.float64).float() * 2 - 1
    full = [x.clone().requires_grad_() for x in (q, k, v)]
    (ft.attention(*full, softcap=3.0) * dout).sum().backward()
    split = [x.clone().requires_grad_() for x in (q, k, v)]
    halves = [ft.attention(split[0], split[1][:, s], split[2][:, s], softcap=3.0,
                           return_lse=True) for s in (slice(0, 17), slice(17, 40))]
    lse = torch.logsumexp(torch.stack([l for _, l in halves]), dim=0)       # (B, H, Sq)
    merged = sum(o * torch.exp(l - lse).transpose(1, 2)[..., None] for o, l in halves)
    (merged * dout).sum().backward()
    for a, b in zip(split, full):
        assert rel(a.grad.numpy(), b.grad.numpy()) <= 1e-5


@needs_torch
def test_learnable_slopes_take_the_reference_with_an_lse_gradient_too():
    q, k, v = torch_case(1, 12, 12, 2, 2, 8)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    slopes = torch.tensor([0.1, 0.3], requires_grad=True)
    out, lse = ft.attention(*leaves, alibi_slopes=slopes, return_lse=True)
    (out.sum() + lse.sum()).backward()
    assert slopes.grad is not None and torch.all(torch.isfinite(slopes.grad))
    # The same through float64: the reference's lse and slope terms are the gradchecked ones.
    leaves64 = [x.double().requires_grad_() for x in (q, k, v)]
    slopes64 = slopes.detach().double().requires_grad_()
    out64, lse64 = ft.attention(*leaves64, alibi_slopes=slopes64, return_lse=True)
    (out64.sum() + lse64.sum()).backward()
    assert rel(slopes.grad.numpy(), slopes64.grad.numpy()) <= 1e-5
    assert rel(leaves[0].grad.numpy(), leaves64[0].grad.numpy()) <= 1e-5


@pytest.mark.parametrize("variant", [
    {"causal": True},
    {"window": (3, 1), "softcap": 1.0, "alibi": True, "sinks": True},
], ids=str)
@needs_torch
def test_gradcheck_float64_dense(variant):
    rng = np.random.default_rng(RNG_SEED)
    args = variant_args(rng, variant, 2)
    q, k, v = (x.requires_grad_() for x in torch_case(1, 5, 7, 2, 1, 4, torch.float64))
    inputs = [q, k, v]
    alibi = args.pop("alibi_slopes", None)
    sinks = args.pop("sinks", None)
    names = []
    if alibi is not None:
        inputs.append(torch.tensor(alibi, dtype=torch.float64, requires_grad=True))
        names.append("alibi_slopes")
    if sinks is not None:
        inputs.append(torch.tensor(sinks, dtype=torch.float64, requires_grad=True))
        names.append("sinks")

    def fn(q, k, v, *params):
        out, lse = ft.attention(q, k, v, return_lse=True, **args, **dict(zip(names, params)))
        return out, lse.masked_fill(torch.isinf(lse), 0.0)

    assert torch.autograd.gradcheck(fn, tuple(inputs), atol=1e-6, rtol=1e-5)


@needs_torch
def test_gradcheck_float64_varlen():
    cu_q = torch.tensor([0, 3, 3, 5], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 6, 9], dtype=torch.int32)
    g = torch.Generator().manual_seed(3)
    q = (torch.rand((5, 2, 4), generator=g, dtype=torch.float64) - 0.5).requires_grad_()
    k = (torch.rand((9, 1, 4), generator=g, dtype=torch.float64) - 0.5).requires_grad_()
    v = (torch.rand((9, 1, 4), generator=g, dtype=torch.float64) - 0.5).requires_grad_()
    sinks = torch.tensor([0.2, -0.4], dtype=torch.float64, requires_grad=True)

    def fn(q, k, v, sinks):
        return ft.attention_varlen(q, k, v, cu_q, cu_k, causal=True, softcap=1.5, sinks=sinks)

    assert torch.autograd.gradcheck(fn, (q, k, v, sinks), atol=1e-6, rtol=1e-5)


@needs_torch
def test_opcheck_forward_op_with_kernel_backward():
    q, k, v = (x.requires_grad_() for x in torch_case(2, 17, 23, 4, 2, 32))
    sinks = torch.tensor([0.1, -0.2, 0.3, 0.0], requires_grad=True)
    args = (q, k, v, True, 0.2, 6, 0, 1.5, None, sinks, "auto")
    torch.library.opcheck(torch.ops.flashtile.attention.default, args)


@needs_torch
def test_opcheck_backward_ops():
    q, k, v = torch_case(2, 17, 23, 4, 2, 32)
    sinks = torch.tensor([0.1, -0.2, 0.3, 0.0])
    out, lse = flashtile.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    dout = torch.ones_like(out)
    for dlse in (None, torch.rand_like(lse) - 0.5):
        torch.library.opcheck(torch.ops.flashtile.attention_backward.default,
                              (dout, q, k, v, out, lse, dlse, True, None, -1, -1, 0.0, None,
                               sinks, False, "auto"))
    cu_q = torch.tensor([0, 5, 5, 14], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 10, 19], dtype=torch.int32)
    qp, kp, vp = (torch.rand((n, h, 16)) for n, h in ((14, 4), (19, 2), (19, 2)))
    outp, lsep = flashtile.attention_varlen(qp, kp, vp, cu_q, cu_k, return_lse=True)
    for dlse in (None, torch.rand_like(lsep) - 0.5):
        torch.library.opcheck(torch.ops.flashtile.attention_backward_varlen.default,
                              (torch.ones_like(outp), qp, kp, vp, outp, lsep, dlse, cu_q, cu_k,
                               None, False, None, -1, -1, 0.0, None, None, False, "auto"))


@needs_torch
def test_flash_attn_func_trains_with_kernel_gradients():
    torch.manual_seed(0)
    q0, k0, v0 = torch_case(2, 32, 32, 4, 2, 16)
    target = torch.rand(q0.shape) - 0.5
    params = [torch.nn.Parameter(x.clone()) for x in (q0, k0, v0)]
    opt = torch.optim.Adam(params, lr=0.05)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        out = ft.flash_attn_func(*params, causal=True)
        loss = ((out - target) ** 2).mean()
        loss.backward()
        losses.append(loss.item())
        opt.step()
    assert losses[-1] < 0.9 * losses[0]
    # The last step's gradients are the kernels'.
    q, k, v = (p.detach() for p in params)
    opt.zero_grad()
    out = ft.flash_attn_func(*params, causal=True)
    ((out - target) ** 2).mean().backward()
    o, lse = flashtile.attention(q, k, v, causal=True, return_lse=True)
    dout = 2 * (o - target) / o.numel()
    direct = flashtile.attention_backward(dout, q, k, v, o, lse, causal=True)
    for p, d in zip(params, direct):
        assert rel(p.grad.numpy(), d.numpy()) <= 1e-6


@needs_torch
def test_flash_attn_varlen_func_trains_with_kernel_gradients():
    torch.manual_seed(0)
    cu = torch.tensor([0, 10, 11, 30], dtype=torch.int32)
    q, k, v = (torch.nn.Parameter(torch.rand((30, h, 16)) - 0.5) for h in (4, 2, 2))
    target = torch.rand((30, 4, 16)) - 0.5
    opt = torch.optim.Adam([q, k, v], lr=0.05)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        out = ft.flash_attn_varlen_func(q, k, v, cu, cu, 19, 19, causal=True, window_size=(6, 0))
        loss = ((out - target) ** 2).mean()
        loss.backward()
        losses.append(loss.item())
        opt.step()
    assert losses[-1] < 0.9 * losses[0]
    o, lse = flashtile.attention_varlen(q.detach(), k.detach(), v.detach(), cu, cu, causal=True,
                                        window=(6, 0), return_lse=True)
    opt.zero_grad()
    out = ft.flash_attn_varlen_func(q, k, v, cu, cu, 19, 19, causal=True, window_size=(6, 0))
    ((out - target) ** 2).mean().backward()
    direct = flashtile.attention_backward_varlen(2 * (o - target) / o.numel(), q.detach(),
                                                 k.detach(), v.detach(), o, lse, cu, cu,
                                                 causal=True, window=(6, 0))
    for p, d in zip((q, k, v), direct):
        assert rel(p.grad.numpy(), d.numpy()) <= 1e-6


# --- torch on CUDA: the autograd calls cuda_mma's backward -------------------------------------

needs_cuda_mma = pytest.mark.skipif(
    torch is None or not torch.cuda.is_available()
    or not flashtile.backends().get("cuda_mma", (None, False))[1],
    reason="needs torch, a CUDA device and the cuda_mma backend")


def max_err(a, b):
    return (a.double() - b.double()).abs().max().item()


@needs_cuda_mma
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_autograd_uses_cuda_mma_within_flash_attentions_rule(dtype, causal):
    """FlashAttention's rule against the float64 reference: max|g - g64| <= 2 max|g_ref16 -
    g64| + 1e-4, g_ref16 being PyTorch's math SDPA in the same 16-bit dtype on the GPU."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dt = getattr(torch, dtype)
    # sq < sk: no row is fully masked (PyTorch's math SDPA gives such rows NaN).
    q, k, v = (x.to("cuda", dt) for x in torch_case(2, 257, 300, 4, 2, 64, seed=1))
    dout = (torch.rand(q.shape, dtype=torch.float64) * 2 - 1).to("cuda", dt)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    (ft.attention(*leaves, causal=causal) * dout).sum().backward()
    got = [x.grad for x in leaves]
    # The kernels' own gradients, called directly.
    out, lse = flashtile.attention(q, k, v, causal=causal, return_lse=True)
    direct = flashtile.attention_backward(dout, q, k, v, out, lse, causal=causal,
                                          backend="cuda_mma")
    for a, b in zip(got, direct):
        assert torch.equal(a, b)
    bhsd = lambda x, rep: x.transpose(1, 2).repeat_interleave(rep, dim=1)
    want, ref16 = [], []
    for prec, sink in ((torch.float64, want), (dt, ref16)):
        xs = [bhsd(x.detach().to(prec), r).clone().requires_grad_()
              for x, r in ((q, 1), (k, 2), (v, 2))]
        # FlashAttention's bottom-right causal mask (sq != sk), written out.
        mask = None
        if causal:
            i = torch.arange(257, device="cuda")[:, None]
            j = torch.arange(300, device="cuda")[None, :]
            mask = j <= i + 300 - 257
        with sdpa_kernel(SDPBackend.MATH):
            o = torch.nn.functional.scaled_dot_product_attention(*xs, attn_mask=mask)
        (o * dout.transpose(1, 2).to(prec)).sum().backward()
        sink.extend([xs[0].grad.transpose(1, 2),
                     xs[1].grad.transpose(1, 2).unflatten(2, (2, 2)).sum(3),
                     xs[2].grad.transpose(1, 2).unflatten(2, (2, 2)).sum(3)])
    for g, w, r in zip(got, want, ref16):
        assert max_err(g, w) <= 2 * max_err(r, w) + 1e-4


@needs_cuda_mma
def test_cuda_variants_and_varlen_take_the_kernels():
    """Sinks (with their gradient), softcap and a window on CUDA bf16 through autograd, and a
    causal varlen batch in f16, against the float64 reference path on the CPU (normwise
    relative 3e-2: 16-bit agreement; a wrong row, head or sign is O(1))."""
    q, k, v = torch_case(1, 129, 130, 4, 1, 128, seed=2)
    sinks = torch.tensor([0.3, -0.5, 0.1, 0.8], dtype=torch.float64)
    dout = torch.rand(q.shape, dtype=torch.float64) * 2 - 1
    args = dict(window=(40, 5), softcap=3.0)
    grads = {}
    for device, dtype in (("cuda", torch.bfloat16), ("cpu", torch.float64)):
        leaves = [x.to(device, dtype).requires_grad_() for x in (q, k, v)]
        s = sinks.to(device, torch.float32 if device == "cuda" else dtype).requires_grad_()
        (ft.attention(*leaves, sinks=s, **args) * dout.to(device, dtype)).sum().backward()
        grads[device] = [x.grad.cpu().double() for x in leaves + [s]]
    for g, w in zip(grads["cuda"], grads["cpu"]):
        assert rel(g.numpy(), w.numpy()) <= 3e-2
    # varlen: sequences of 5, 0 and 70 queries over 9, 4 and 66 keys, causal.
    cu_q = torch.tensor([0, 5, 5, 75], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 13, 79], dtype=torch.int32)
    g = torch.Generator().manual_seed(4)
    packed = [torch.rand((n, h, 64), generator=g, dtype=torch.float64) - 0.5
              for n, h in ((75, 4), (79, 2), (79, 2))]
    vgrads = {}
    for device, dtype in (("cuda", torch.float16), ("cpu", torch.float64)):
        leaves = [x.to(device, dtype).requires_grad_() for x in packed]
        out = ft.attention_varlen(*leaves, cu_q.to(device), cu_k.to(device), 70, 66, causal=True)
        (out.double().cpu() ** 2).sum().backward()
        vgrads[device] = [x.grad.cpu().double() for x in leaves]
    for g, w in zip(vgrads["cuda"], vgrads["cpu"]):
        assert rel(g.numpy(), w.numpy()) <= 3e-2


@needs_cuda_mma
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_autograd_through_lse_uses_cuda_mma_within_flash_attentions_rule(dtype):
    """A loss of out and lse at head_dim 128 (GQA, causal, sinks): the gradients are cuda_mma's
    (dk, dv, dsinks bitwise as a direct call with dlse; dq through atomics, within 1e-3), and
    meet FlashAttention's rule against float64 math attention, whose 16-bit run in the same
    dtype on the GPU is the baseline (dsinks: normwise 3e-2 of the float64 one)."""
    dt = getattr(torch, dtype)
    q, k, v = (x.to("cuda", dt) for x in torch_case(2, 130, 200, 4, 2, 128, seed=3))
    sinks = torch.tensor([0.3, -0.5, 0.1, 0.8], device="cuda")
    dout = (torch.rand(q.shape, dtype=torch.float64) * 2 - 1).to("cuda", dt)
    dlse = (torch.rand((2, 4, 130), dtype=torch.float64) * 2 - 1).to("cuda", torch.float32)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    s = sinks.clone().requires_grad_()
    out, lse = ft.attention(*leaves, causal=True, sinks=s, return_lse=True)
    ((out * dout).float().sum() + (lse * dlse).sum()).backward()
    got = [x.grad for x in leaves]
    o, l = flashtile.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    direct = flashtile.attention_backward(dout, q, k, v, o, l, causal=True, sinks=sinks,
                                          dlse=dlse, backend="cuda_mma")
    assert max_err(got[0], direct[0]) <= 1e-3
    for a, b in zip(got[1:] + [s.grad], direct[1:]):
        assert torch.equal(a, b)

    def math_grads(prec):
        """d(Σ out∘dout + Σ lse∘dlse) of attention written out in `prec` (bottom-right causal,
        the sink a score column with no value)."""
        xs = [x.detach().to(prec).transpose(1, 2).clone().requires_grad_() for x in (q, k, v)]
        sk = xs[1].repeat_interleave(2, dim=1)
        sv = xs[2].repeat_interleave(2, dim=1)
        scores = xs[0] @ sk.transpose(-1, -2) * 128 ** -0.5
        i = torch.arange(130, device="cuda")[:, None]
        j = torch.arange(200, device="cuda")[None, :]
        scores = scores.masked_fill(j > i + 200 - 130, float("-inf"))
        sink = sinks.to(prec).reshape(1, 4, 1, 1).expand(2, 4, 130, 1).clone().requires_grad_()
        full = torch.cat([scores, sink], dim=-1)
        lse_ = torch.logsumexp(full, dim=-1)
        p = torch.exp(full - lse_[..., None])[..., :-1]
        o_ = p @ sv
        ((o_ * dout.transpose(1, 2).to(prec)).sum() + (lse_ * dlse.to(prec)).sum()).backward()
        return [xs[0].grad.transpose(1, 2), xs[1].grad.transpose(1, 2),
                xs[2].grad.transpose(1, 2), sink.grad.sum((0, 2, 3))]

    want, ref16 = math_grads(torch.float64), math_grads(dt)
    for g, w, r in zip(got, want[:3], ref16[:3]):
        assert max_err(g, w) <= 2 * max_err(r, w) + 1e-4
    assert rel(s.grad.cpu().double().numpy(), want[3].cpu().numpy()) <= 3e-2
