"""attn_implementation="FlashTile" in Hugging Face transformers, on a small random Llama.

The model is built from a LlamaConfig (nothing downloaded) and compared with
attn_implementation="sdpa": logits, greedy generation (prefill + single-token decode with a
KV cache), and the refusal of padding masks.
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


def logits(model, implementation, input_ids, **kwargs):
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        return model(input_ids, **kwargs).logits.float()


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


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES, ids=lambda x: str(x).replace("torch.", ""))
def test_llama_logits_match_sdpa(device, dtype):
    model = small_llama(device, dtype)
    input_ids = torch.randint(0, 256, (2, 77), generator=torch.Generator().manual_seed(1)).to(device)
    ours_probe = torch.zeros(1, 2, 1, 64, device=device, dtype=dtype)
    if dtype != torch.float32:
        try:
            flashtile.plan(ours_probe, ours_probe, ours_probe)
        except ValueError as error:
            if "no backend can run this call" in str(error):
                pytest.skip(str(error))
            raise
    ours = logits(model, NAME, input_ids)
    theirs = logits(model, "sdpa", input_ids)
    if dtype == torch.float32:
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    else:
        # Both against the fp32 model: flashtile's error at most twice SDPA's own (+ slack
        # for the tie-breaking of roundings through two layers).
        exact = logits(small_llama(device, torch.float32), "sdpa", input_ids)
        err_ours = (ours - exact).abs().max().item()
        err_theirs = (theirs - exact).abs().max().item()
        assert err_ours <= 2 * err_theirs + 1e-3, (err_ours, err_theirs)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not _cuda_backend_available(), reason="needs CUDA"))])
def test_llama_generate_matches_sdpa(device):
    # Prefill (causal, q_len == kv_len), then decode steps (q_len 1 against the cache).
    model = small_llama(device, torch.float32)
    prompt = torch.randint(0, 256, (2, 13), generator=torch.Generator().manual_seed(2)).to(device)
    mask = torch.ones_like(prompt)
    # A spy registered like register() does, to see which query lengths reach flashtile.
    query_lengths = []

    def spy(module, query, *args, **kwargs):
        query_lengths.append(query.shape[2])
        return ft_hf.attention_forward(module, query, *args, **kwargs)

    transformers.AttentionInterface.register("FlashTileSpy", spy)
    transformers.masking_utils.AttentionMaskInterface.register(
        "FlashTileSpy", transformers.masking_utils.sdpa_mask)
    outputs = {}
    for implementation in ("sdpa", "FlashTileSpy"):
        model.set_attn_implementation(implementation)
        outputs[implementation] = model.generate(
            prompt, attention_mask=mask, max_new_tokens=12, do_sample=False,
            output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    assert torch.equal(outputs["sdpa"].sequences, outputs["FlashTileSpy"].sequences)
    for a, b in zip(outputs["sdpa"].logits, outputs["FlashTileSpy"].logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # 2 layers: one prefill of 13 tokens, then 11 single-token decode steps.
    assert query_lengths == [13] * 2 + [1] * 22


def test_padding_mask_is_refused_not_ignored():
    model = small_llama("cpu", torch.float32)
    input_ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(3))
    padded = torch.ones_like(input_ids)
    padded[0, :3] = 0
    with pytest.raises(ValueError, match="cannot apply an attention_mask"):
        logits(model, NAME, input_ids, attention_mask=padded)
    # An all-ones mask needs no masking: transformers drops it and flashtile runs.
    full = torch.ones_like(input_ids)
    torch.testing.assert_close(logits(model, NAME, input_ids, attention_mask=full),
                               logits(model, "sdpa", input_ids), rtol=1e-4, atol=1e-4)


def test_attention_forward_signature():
    # Called directly as transformers calls it: BHSD in, (B, S, H, D) out, GQA via the module.
    module = torch.nn.Module()
    module.num_key_value_groups = 2
    module.is_causal = True
    query = torch.randn(1, 4, 10, 32)
    key, value = torch.randn(1, 2, 10, 32), torch.randn(1, 2, 10, 32)
    out, weights = ft_hf.attention_forward(module, query, key, value, None, scaling=0.3)
    want = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, is_causal=True, scale=0.3, enable_gqa=True)
    assert weights is None and out.shape == (1, 10, 4, 32)
    torch.testing.assert_close(out, want.transpose(1, 2), rtol=1e-5, atol=1e-6)
    # is_causal in kwargs wins over module.is_causal, as in sdpa_attention_forward.
    out, _ = ft_hf.attention_forward(module, query, key, value, None, is_causal=False)
    want = torch.nn.functional.scaled_dot_product_attention(query, key, value, enable_gqa=True)
    torch.testing.assert_close(out, want.transpose(1, 2), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="no dropout"):
        ft_hf.attention_forward(module, query, key, value, None, dropout=0.1)
    with pytest.raises(ValueError, match="softcap"):
        ft_hf.attention_forward(module, query, key, value, None, softcap=30.0)
