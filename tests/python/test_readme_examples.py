"""The README's Python examples, verbatim, so that they keep running."""

import pytest

NUMPY_EXAMPLE = '''
import numpy as np, flashtile
q = np.random.randn(2, 1024, 8, 64).astype(np.float32)   # (batch, seqlen, heads, head_dim)
k = np.random.randn(2, 1024, 2, 64).astype(np.float32)   # 2 KV heads: GQA
v = np.random.randn(2, 1024, 2, 64).astype(np.float32)
out, lse = flashtile.attention(q, k, v, causal=True, return_lse=True)
'''

TORCH_EXAMPLE = '''
import torch, flashtile.torch as ft
q, k, v = (torch.randn(2, 8, 4096, 128, device="cuda") for _ in range(3))  # BHSD, as SDPA
out = ft.scaled_dot_product_attention(q, k, v, is_causal=True)
attn = torch.compile(ft.scaled_dot_product_attention, fullgraph=True)
print((attn(q, k, v, is_causal=True) - out).abs().max())
'''

TRANSFORMERS_EXAMPLE = '''
import transformers, flashtile.integrations.transformers as ft_hf
ft_hf.register()   # adds attn_implementation="FlashTile" (a name without a lower-case "flash")
config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2)
model = transformers.LlamaForCausalLM(config).eval()
model.set_attn_implementation("FlashTile")   # or from_pretrained(..., attn_implementation=...)
'''


def test_numpy_example():
    scope = {}
    exec(NUMPY_EXAMPLE, scope)
    assert scope["out"].shape == (2, 1024, 8, 64) and scope["lse"].shape == (2, 8, 1024)


def test_torch_example(capsys):
    torch = pytest.importorskip("torch")
    import flashtile
    if not torch.cuda.is_available() or not flashtile.backends()["cuda_tiled"].available:
        pytest.skip("needs CUDA")
    scope = {}
    exec(TORCH_EXAMPLE, scope)
    assert float(capsys.readouterr().out.split("(")[1].split(",")[0].rstrip(")")) == 0.0


def test_transformers_example():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    scope = {}
    exec(TRANSFORMERS_EXAMPLE, scope)
    assert scope["model"].config._attn_implementation == "FlashTile"
