"""attn_implementation="FlashTile" in Hugging Face transformers, on small random models.

Every model is built from a config (nothing downloaded) and compared with transformers'
own implementation of the same family: Llama and Mistral (sliding window) with "sdpa",
Gemma 2 (softcap, sliding window) and gpt-oss (sinks, sliding window) with "eager" (they
do not take sdpa). Logits, greedy generation (prefill and decode with a KV cache, padded
batches) and gradients; each test also checks that the feature it covers changes the
logits, so that ignoring it would fail. CPU here; CUDA where a flashtile CUDA backend runs
the call.
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flashtile  # noqa: E402
import flashtile.integrations.transformers as ft_hf  # noqa: E402

NAME = ft_hf.register()


def _cuda_backend_available():
    return torch.cuda.is_available() and any(
        b.device == "cuda" and b.available for b in flashtile.backends().values())


def small_llama(device, dtype, attn_implementation="sdpa"):
    torch.manual_seed(0)
    # head_dim 64 (256 / 4), GQA 4:2: a shape every flashtile backend serves.
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        attn_implementation=attn_implementation)
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


# Small configs of each family: head_dim 64, GQA 4:2, a window of 8 tokens (shorter than the
# inputs), and weights large enough (initializer_range) that softcap and sinks matter.
COMMON = dict(vocab_size=128, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64,
              max_position_embeddings=256, initializer_range=0.1)
FAMILIES = {
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, "sdpa",
                dict(sliding_window=8)),
    "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM, "eager",
               dict(sliding_window=8, attn_logit_softcapping=2.0, query_pre_attn_scalar=64)),
    "gpt_oss": (getattr(transformers, "GptOssConfig", None),
                getattr(transformers, "GptOssForCausalLM", None), "eager",
                dict(sliding_window=8, num_local_experts=4, num_experts_per_tok=2,
                     layer_types=["sliding_attention", "full_attention"])),
}
# The keyword each family's feature arrives as, and what the logits look like without it.
FEATURES = {"mistral": ["sliding_window"], "gemma2": ["sliding_window", "softcap"],
            "gpt_oss": ["sliding_window", "s_aux"]}


def small_model(family, device, dtype=torch.float32):
    config_class, model_class, _, extra = FAMILIES[family]
    if config_class is None:
        pytest.skip(f"this transformers has no {family}")
    torch.manual_seed(0)
    model = model_class(config_class(**COMMON, **extra))
    if family == "gpt_oss":
        with torch.no_grad():  # sinks of either sign and of weight comparable to the scores
            for layer in model.model.layers:
                layer.self_attn.sinks.copy_(torch.linspace(-1.0, 1.5, 4))
    return model.to(device=device, dtype=dtype).eval()


def logits(model, implementation, input_ids, **kwargs):
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        return model(input_ids, **kwargs).logits.float()


def skip_unless_flashtile_runs(device, dtype, **variant):
    """Skips when no flashtile backend on `device` takes `dtype` with this variant, dense
    and varlen (padded batches run through varlen)."""
    probe = torch.zeros(1, 9, 2, 64, device=device, dtype=dtype)
    cu_seqlens = torch.tensor([0, 4, 9], dtype=torch.int32, device=device)
    try:
        flashtile.plan(probe, probe, probe, **variant)
        flashtile.plan_varlen(probe[0], probe[0], probe[0], cu_seqlens, cu_seqlens, **variant)
    except ValueError as error:
        if "no backend can run this call" in str(error):
            pytest.skip(str(error))
        raise


def register_dropping(name, dropped):
    """An implementation that is flashtile's with some keyword arguments removed."""
    def forward(module, query, key, value, attention_mask, **kwargs):
        for keyword in dropped:
            kwargs.pop(keyword, None)
        return ft_hf.attention_forward(module, query, key, value, attention_mask, **kwargs)
    transformers.AttentionInterface.register(name, forward)
    transformers.masking_utils.AttentionMaskInterface.register(name, ft_hf.padding_mask)
    return name


def padded_batch(batch, seqlen, device, seed=3):
    # Row 0 left-padded by 5, row 1 right-padded by 4, the rest full: each row's real
    # tokens are one run, as tokenizers make them.
    input_ids = torch.randint(1, 128, (batch, seqlen), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(input_ids)
    mask[0, :5] = 0
    mask[1, -4:] = 0
    return input_ids.to(device), mask.to(device)


def test_register_refuses_names_transformers_reads_as_flash_attention():
    with pytest.raises(ValueError, match="FlashAttention kernel"):
        ft_hf.register("flashtile")


def test_config_attn_implementation():
    model = small_llama("cpu", torch.float32, attn_implementation=NAME)
    assert model.config._attn_implementation == NAME


DEVICE_DTYPES = [
    ("cpu", torch.float32),
    pytest.param("cuda", torch.float32, marks=pytest.mark.skipif(
        not _cuda_backend_available(), reason="needs CUDA")),
    pytest.param("cuda", torch.bfloat16, marks=pytest.mark.skipif(
        not _cuda_backend_available(), reason="needs CUDA")),
    pytest.param("cuda", torch.float16, marks=pytest.mark.skipif(
        not _cuda_backend_available(), reason="needs CUDA")),
]
CUDA_IF_AVAILABLE = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not _cuda_backend_available(), reason="needs CUDA"))]


def assert_logits_close(ours, theirs, exact, dtype, where=None):
    """fp32: close to the reference implementation. 16-bit: FlashAttention's rule against
    the fp32 model, flashtile's error at most twice the reference's (+ slack for the
    roundings of two layers)."""
    if where is not None:
        ours, theirs, exact = ours[where], theirs[where], exact[where] if exact is not None else None
    if dtype == torch.float32:
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    else:
        err_ours = (ours - exact).abs().max().item()
        err_theirs = (theirs - exact).abs().max().item()
        assert err_ours <= 2 * err_theirs + 1e-3, (err_ours, err_theirs)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES, ids=lambda x: str(x).replace("torch.", ""))
def test_llama_logits_match_sdpa(device, dtype):
    model = small_llama(device, dtype)
    input_ids = torch.randint(0, 256, (2, 77), generator=torch.Generator().manual_seed(1)).to(device)
    if dtype != torch.float32:
        skip_unless_flashtile_runs(device, dtype, causal=True)
    exact = logits(small_llama(device, torch.float32), "sdpa", input_ids) if dtype != torch.float32 else None
    assert_logits_close(logits(model, NAME, input_ids), logits(model, "sdpa", input_ids), exact,
                        dtype)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES, ids=lambda x: str(x).replace("torch.", ""))
def test_family_logits_match_reference(family, padded, device, dtype):
    model = small_model(family, device, dtype)
    reference = FAMILIES[family][2]
    skip_unless_flashtile_runs(device, dtype, causal=True, window=(7, 0),
                               softcap=2.0 if family == "gemma2" else 0.0)
    input_ids, mask = padded_batch(3, 29, device)
    kwargs = dict(attention_mask=mask) if padded else {}
    where = mask.bool() if padded else None   # padded positions' logits are not compared
    exact = (logits(small_model(family, device), reference, input_ids, **kwargs)
             if dtype != torch.float32 else None)
    ours = logits(model, NAME, input_ids, **kwargs)
    theirs = logits(model, reference, input_ids, **kwargs)
    assert_logits_close(ours, theirs, exact, dtype, where)
    if dtype == torch.float32:
        # Each feature changes the logits: an implementation that ignored it would fail.
        for feature in FEATURES[family]:
            without = logits(model, register_dropping(f"FlashTileWithout_{feature}", [feature]),
                             input_ids, **kwargs)
            gap = (without - theirs)[where] if padded else without - theirs
            assert gap.abs().max() > 1e-2, feature


@pytest.mark.parametrize("family", ["llama", "mistral", "gpt_oss"])
@pytest.mark.parametrize("device", CUDA_IF_AVAILABLE)
def test_generate_matches_reference(family, device):
    # A padded batch: prefill, then single-token decode steps against the KV cache, past
    # the window (and, for Mistral/gpt-oss, through the sliding-window cache layers).
    if family == "llama":
        model, reference = small_llama(device, torch.float32), "sdpa"
    else:
        model, reference = small_model(family, device), FAMILIES[family][2]
    skip_unless_flashtile_runs(device, torch.float32, causal=True,
                               window=(-1, 0) if family == "llama" else (7, 0))
    prompt = torch.randint(1, 128, (2, 7), generator=torch.Generator().manual_seed(2)).to(device)
    mask = torch.ones_like(prompt)
    mask[0, :3] = 0
    query_lengths = []

    def spy(module, query, *args, **kwargs):
        query_lengths.append(query.shape[2])
        return ft_hf.attention_forward(module, query, *args, **kwargs)

    transformers.AttentionInterface.register("FlashTileSpy", spy)
    transformers.masking_utils.AttentionMaskInterface.register("FlashTileSpy", ft_hf.padding_mask)
    outputs = {}
    for implementation in (reference, "FlashTileSpy"):
        model.set_attn_implementation(implementation)
        outputs[implementation] = model.generate(
            prompt, attention_mask=mask, max_new_tokens=14, do_sample=False,
            output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    assert torch.equal(outputs[reference].sequences, outputs["FlashTileSpy"].sequences)
    for a, b in zip(outputs[reference].logits, outputs["FlashTileSpy"].logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # 2 layers: one prefill of 7 tokens, then 13 single-token decode steps.
    assert query_lengths == [7] * 2 + [1] * 26


@pytest.mark.parametrize("family", ["mistral", "gemma2", "gpt_oss"])
def test_gradients_match_reference(family):
    # One training step's gradients, every parameter (gpt-oss: the sinks too), on a padded
    # batch: through the varlen op's backward.
    model = small_model(family, "cpu")
    reference = FAMILIES[family][2]
    input_ids, mask = padded_batch(3, 21, "cpu", seed=5)
    grads = {}
    for implementation in (reference, NAME):
        model.zero_grad()
        model.set_attn_implementation(implementation)
        model.train()
        # Next-token loss of real positions predicting real tokens only: what a padded row
        # computes is the implementation's own business (flashtile gives 0).
        out = model(input_ids, attention_mask=mask).logits[:, :-1]
        real = (mask[:, :-1] * mask[:, 1:]).bool()
        torch.nn.functional.cross_entropy(out[real], input_ids[:, 1:][real]).backward()
        grads[implementation] = {n: p.grad.clone() for n, p in model.named_parameters()
                                 if p.grad is not None}
    model.eval()
    assert grads[reference].keys() == grads[NAME].keys()
    if family == "gpt_oss":
        assert any("sinks" in n for n in grads[NAME])
    for name, grad in grads[reference].items():
        torch.testing.assert_close(grads[NAME][name], grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"{name}: {m}")


def test_llama_padded_batches_match_sdpa():
    model = small_llama("cpu", torch.float32)
    input_ids, mask = padded_batch(3, 19, "cpu", seed=4)
    torch.testing.assert_close(logits(model, NAME, input_ids, attention_mask=mask)[mask.bool()],
                               logits(model, "sdpa", input_ids, attention_mask=mask)[mask.bool()],
                               rtol=1e-4, atol=1e-4)
    # An all-ones mask needs no masking: the builder returns None and the dense path runs.
    full = torch.ones_like(input_ids)
    assert ft_hf.padding_mask(3, 19, 19, attention_mask=full.bool(),
                              mask_function=transformers.masking_utils.causal_mask_function) is None
    torch.testing.assert_close(logits(model, NAME, input_ids, attention_mask=full),
                               logits(model, "sdpa", input_ids), rtol=1e-4, atol=1e-4)


def test_masks_flashtile_cannot_apply_are_refused_not_ignored():
    model = small_model("mistral", "cpu")
    input_ids = torch.randint(1, 128, (2, 19), generator=torch.Generator().manual_seed(6))
    # A ready-made 4-D mask goes straight to the attention function.
    with pytest.raises(ValueError, match=r"a 4-D attention_mask .* is not a padding mask"):
        logits(model, NAME, input_ids, attention_mask=torch.zeros(2, 1, 19, 19))
    # Packed sequences found from position_ids: a block-diagonal mask.
    positions = torch.cat([torch.arange(9), torch.arange(10)]).expand(2, -1)
    with pytest.raises(ValueError, match=r"not a causal, full or sliding-window mask"):
        logits(model, NAME, input_ids, position_ids=positions, use_cache=False)
    # Padding between the tokens of a sequence changes what a window counts.
    holes = torch.ones_like(input_ids)
    holes[0, 8:10] = 0
    with pytest.raises(ValueError, match=r"sliding window over sequences with padding between"):
        logits(model, NAME, input_ids, attention_mask=holes)
    # Llama (no window) takes the same mask exactly.
    llama = small_llama("cpu", torch.float32)
    ids = torch.randint(0, 256, (2, 19), generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(logits(llama, NAME, ids, attention_mask=holes)[holes.bool()],
                               logits(llama, "sdpa", ids, attention_mask=holes)[holes.bool()],
                               rtol=1e-4, atol=1e-4)


def test_mask_builder_refuses_misaligned_positions():
    # A static cache's keys run past the queries: flashtile's bottom-right alignment would
    # be wrong, so the builder refuses instead of returning "no mask".
    with pytest.raises(ValueError, match=r"do not end together"):
        ft_hf.padding_mask(1, 4, 32, q_offset=3, kv_offset=0,
                           mask_function=transformers.masking_utils.causal_mask_function)
    sliding = transformers.masking_utils.sliding_window_causal_mask_function(8)
    with pytest.raises(ValueError, match=r"not a causal, full or sliding-window mask"):
        ft_hf.padding_mask(1, 4, 32, q_offset=3, kv_offset=0, mask_function=sliding,
                           local_size=8)
    assert ft_hf.padding_mask(1, 4, 32, q_offset=28, kv_offset=0, mask_function=sliding,
                              local_size=8) is None


def test_attention_forward_signature():
    # Called directly as transformers calls it: BHSD in, (B, S, H, D) out, GQA via the module.
    F = torch.nn.functional
    module = torch.nn.Module()
    module.num_key_value_groups = 2
    module.is_causal = True
    query = torch.randn(1, 4, 10, 32)
    key, value = torch.randn(1, 2, 10, 32), torch.randn(1, 2, 10, 32)
    out, weights = ft_hf.attention_forward(module, query, key, value, None, scaling=0.3)
    want = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=0.3,
                                          enable_gqa=True)
    assert weights is None and out.shape == (1, 10, 4, 32)
    torch.testing.assert_close(out, want.transpose(1, 2), rtol=1e-5, atol=1e-6)
    # is_causal in kwargs wins over module.is_causal, as in sdpa_attention_forward.
    out, _ = ft_hf.attention_forward(module, query, key, value, None, is_causal=False)
    want = F.scaled_dot_product_attention(query, key, value, enable_gqa=True)
    torch.testing.assert_close(out, want.transpose(1, 2), rtol=1e-5, atol=1e-6)
    # softcap as Gemma 2's eager attention applies it: scale, then c * tanh(S / c).
    out, _ = ft_hf.attention_forward(module, query, key, value, None, scaling=0.3, softcap=0.5)
    scores = query @ key.repeat_interleave(2, dim=1).transpose(-1, -2) * 0.3
    scores = (0.5 * torch.tanh(scores / 0.5)).masked_fill(
        torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
    want = scores.softmax(-1) @ value.repeat_interleave(2, dim=1)
    torch.testing.assert_close(out, want.transpose(1, 2), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="no dropout"):
        ft_hf.attention_forward(module, query, key, value, None, dropout=0.1)
    with pytest.raises(ValueError, match="position_bias is not supported"):
        ft_hf.attention_forward(module, query, key, value, None, position_bias=torch.zeros(1))


def test_attention_forward_packed_sequences():
    # cu_seq_lens_q/k (as models pass them to flash_attention_2): each sequence attends to
    # itself only.
    F = torch.nn.functional
    module = torch.nn.Module()
    module.num_key_value_groups = 1
    module.is_causal = True
    lengths = [4, 9, 1]
    query, key, value = (torch.randn(1, 2, 14, 16) for _ in range(3))
    cu = torch.tensor([0, 4, 13, 14], dtype=torch.int32)
    out, _ = ft_hf.attention_forward(module, query, key, value, None, cu_seq_lens_q=cu,
                                     cu_seq_lens_k=cu, max_length_q=9, max_length_k=9)
    start = 0
    for length in lengths:
        part = slice(start, start + length)
        want = F.scaled_dot_product_attention(query[:, :, part], key[:, :, part],
                                              value[:, :, part], is_causal=True)
        torch.testing.assert_close(out[:, part], want.transpose(1, 2), rtol=1e-5, atol=1e-6)
        start += length
