"""A tiny random-weight Llama trains with attn_implementation="FlashTile" (issue 10).

The model is built from a config (nothing downloaded): 2 layers, hidden 128, 4 query heads
and 2 kv heads of dim 32. It trains for 20 AdamW steps on two fixed batches in turn, one
full (the dense op) and one with padding (attention_mask: the varlen op), from the same
weights and data with "FlashTile", "sdpa" and "eager". Through torch's autograd the
gradients are flashtile's backward kernels on the CPU (python/flashtile/torch.py).

- Loss curves: max over steps |FlashTile - sdpa| <= 2·max over steps |eager - sdpa| +
  1e-5·loss. eager and sdpa are two correct implementations of the same math in the same
  precision, so their distance is that precision's noise after 20 steps (FlashAttention's
  "twice the reference's error" rule, applied to the curve); the small floor keeps a bound
  where the two happen to agree closely. A wrong gradient moves the curve by far more.
- One step's gradients, of every parameter, on each batch, from the initial weights, against
  the same model in float64 (the double oracle): float32 normwise relative error <= 1e-5
  (issue 10's fp32 rule: the whole model measures ~1e-6 here, the attention's kernels are
  held to 1e-5 on their own); bfloat16 max|g - g64| <= 2·max|g_sdpa - g64| + 1e-4 with
  g_sdpa the sdpa model in bfloat16 (the issue's 16-bit rule, sdpa as the reference in the
  input precision).

And a training step under torch.compile(dynamic=True) compiles once for many lengths.
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flashtile  # noqa: E402
import flashtile.integrations.transformers as ft_hf  # noqa: E402

NAME = ft_hf.register()
STEPS, BATCH, SEQLEN, VOCAB = 20, 4, 32, 256


def tiny_llama(device, dtype):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype)


def batches(device):
    """Two fixed batches: full, and padded (row 0 left-padded by 7, row 1 right-padded by 5)."""
    generator = torch.Generator().manual_seed(1)
    full, padded = (torch.randint(0, VOCAB, (BATCH, SEQLEN), generator=generator)
                    for _ in range(2))
    mask = torch.ones_like(padded)
    mask[0, :7] = 0
    mask[1, -5:] = 0
    return [(full.to(device), None), (padded.to(device), mask.to(device))]


def lm_loss(model, input_ids, mask):
    """Next-token cross-entropy of real positions predicting real tokens (what a padded row
    computes is each implementation's own business; flashtile gives 0)."""
    logits = model(input_ids, attention_mask=mask).logits[:, :-1].float()
    real = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask.bool()
    real = real[:, :-1] & real[:, 1:]
    return torch.nn.functional.cross_entropy(logits[real], input_ids[:, 1:][real])


def one_step_gradients(model, implementation, data):
    """Per batch, the gradients of every parameter from the model's current weights."""
    model.set_attn_implementation(implementation)
    model.train()
    grads = []
    for input_ids, mask in data:
        model.zero_grad()
        lm_loss(model, input_ids, mask).backward()
        grads.append({n: p.grad.double().clone() for n, p in model.named_parameters()})
    return grads


def train(implementation, device, dtype, data):
    model = tiny_llama(device, dtype)
    model.set_attn_implementation(implementation)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad()
        loss = lm_loss(model, *data[step % len(data)])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def skip_unless_flashtile_trains(device, dtype):
    """Skips where no flashtile backend runs the model's calls (causal, head_dim 32; dense and
    varlen) in this dtype: fp32 on CUDA has cuda_tiled only, which takes no varlen batch."""
    probe = torch.zeros(1, 9, 2, 32, device=device, dtype=dtype, requires_grad=True)
    cu_seqlens = torch.tensor([0, 4, 9], dtype=torch.int32, device=device)
    try:
        flashtile.torch.attention(probe, probe, probe, causal=True).sum().backward()
        flashtile.torch.attention_varlen(probe[0], probe[0], probe[0], cu_seqlens, cu_seqlens,
                                         causal=True).sum().backward()
    except (ValueError, RuntimeError) as error:
        pytest.skip(f"flashtile cannot train {dtype} on {device}: {error}")


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available() or not any(
        b.device == "cuda" and b.available for b in flashtile.backends().values()),
    reason="needs a CUDA device and a flashtile CUDA backend"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_tiny_llama_trains_like_sdpa(device, dtype):
    skip_unless_flashtile_trains(device, dtype)
    data = batches(device)

    oracle = one_step_gradients(tiny_llama(device, torch.float64), "sdpa", data)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        ours = one_step_gradients(tiny_llama(device, dtype), NAME, data)
    if device == "cpu":  # the gradients came from the kernels, dense and varlen
        ops = {event.key for event in profile.key_averages()}
        assert {"flashtile::attention_backward",
                "flashtile::attention_backward_varlen"} <= ops, sorted(
                    op for op in ops if "flashtile" in op)
    theirs = one_step_gradients(tiny_llama(device, dtype), "sdpa", data)
    for batch, (g_ours, g_theirs, g64) in enumerate(zip(ours, theirs, oracle)):
        assert g_ours.keys() == g64.keys()
        for name, want in g64.items():
            got = g_ours[name]
            if dtype == torch.float32:
                error = ((got - want).norm() / want.norm()).item()
                assert error <= 1e-5, (batch, name, error)
            else:
                error = (got - want).abs().max().item()
                bound = 2 * (g_theirs[name] - want).abs().max().item() + 1e-4
                assert error <= bound, (batch, name, error, bound)

    curves = {implementation: train(implementation, device, dtype, data)
              for implementation in (NAME, "sdpa", "eager")}
    noise = max(abs(a - b) for a, b in zip(curves["eager"], curves["sdpa"]))
    distance = max(abs(a - b) for a, b in zip(curves[NAME], curves["sdpa"]))
    assert distance <= 2 * noise + 1e-5 * curves["sdpa"][0], (distance, noise)
    # It trains: the loss of each batch falls well below its first value.
    for first in range(2):
        assert curves[NAME][first + STEPS - 2] < 0.8 * curves[NAME][first]


def test_compiled_training_step_with_dynamic_lengths_compiles_once():
    # forward + backward of a step through the op under torch.compile(dynamic=True), through
    # AOTAutograd (loss.backward() breaks the graph; the compiled backward runs for it): one
    # forward and one backward graph for four sequence lengths, the backward graph calling
    # flashtile's backward op (the kernels), the gradients those of the eager step.
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = {"forward": [], "backward": []}

    def counting(kind):
        def compiler(graph_module, example_inputs):
            graphs[kind].append(graph_module)
            return make_boxed_func(graph_module.forward)
        return compiler

    backend = aot_autograd(fw_compiler=counting("forward"), bw_compiler=counting("backward"))
    torch.manual_seed(0)
    project = torch.nn.Linear(32, 3 * 4 * 16)

    def step(x):
        batch, seqlen, _ = x.shape
        q, k, v = project(x).view(batch, seqlen, 3, 4, 16).unbind(2)
        out = flashtile.torch.attention(q, k, v, causal=True, window=(16, 0), softcap=20.0)
        loss = out.float().pow(2).mean()
        loss.backward()
        return loss

    torch._dynamo.reset()
    compiled = torch.compile(step, backend=backend, dynamic=True)
    for seqlen in (24, 37, 61, 130):
        x = torch.randn(2, seqlen, 32)
        project.zero_grad()
        loss = compiled(x)
        grads = [p.grad.clone() for p in project.parameters()]
        project.zero_grad()
        want = step(x)
        torch.testing.assert_close(loss, want)
        for got, expected in zip(grads, (p.grad for p in project.parameters())):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert len(graphs["forward"]) == 1 and len(graphs["backward"]) == 1, {
        kind: len(found) for kind, found in graphs.items()}
    assert "flashtile.attention_backward" in str(graphs["backward"][0].code)
