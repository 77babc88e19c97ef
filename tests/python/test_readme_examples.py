"""The README's Python examples, verbatim, so that they keep running."""

import pytest

NUMPY_EXAMPLE = '''
import numpy as np, flashtile
q = np.random.randn(2, 1024, 8, 64).astype(np.float32)   # (batch, seqlen, heads, head_dim)
k = np.random.randn(2, 1024, 2, 64).astype(np.float32)   # 2 KV heads: GQA
v = np.random.randn(2, 1024, 2, 64).astype(np.float32)
out, lse = flashtile.attention(q, k, v, causal=True, return_lse=True)
'''

VARIANTS_EXAMPLE = '''
import numpy as np, flashtile
cu_seqlens = np.array([0, 100, 100, 356], dtype=np.int32)  # 3 sequences: 100, 0, 256 tokens
q = np.random.randn(356, 8, 64).astype(np.float32)         # packed (total_tokens, heads, head_dim)
k = np.random.randn(356, 2, 64).astype(np.float32)
v = np.random.randn(356, 2, 64).astype(np.float32)
sinks = np.zeros(8, dtype=np.float32)                      # one logit per query head (gpt-oss)
out, lse = flashtile.attention_varlen(q, k, v, cu_seqlens, cu_seqlens, causal=True,
                                      window=(127, 0), softcap=30.0, sinks=sinks,
                                      return_lse=True)    # lse: (heads, total_tokens)
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

JAX_EXAMPLE = '''
import jax, jax.numpy as jnp, flashtile.jax as ftj
q = jax.random.normal(jax.random.key(0), (2, 256, 8, 64), jnp.bfloat16)  # BSHD
k, v = (jax.random.normal(jax.random.key(i), (2, 256, 2, 64), jnp.bfloat16) for i in (1, 2))

attend = jax.jit(ftj.attention, static_argnames=("causal", "window", "softcap"))
out = attend(q, k, v, causal=True, window=(127, 0), softcap=30.0)   # an XLA custom call

@jax.jit
def loss(q, k, v):
    return jnp.sum(ftj.attention(q, k, v, causal=True).astype(jnp.float32) ** 2)

dq, dk, dv = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)             # through custom_vjp
batched = jax.vmap(ftj.attention, in_axes=(0, None, None))(jnp.stack([q, q]), k, v)
'''

# The examples README.md shows as Python blocks (the transformers one is not among them).
README_EXAMPLES = {"numpy": NUMPY_EXAMPLE, "variants": VARIANTS_EXAMPLE, "torch": TORCH_EXAMPLE,
                   "jax": JAX_EXAMPLE}


@pytest.mark.parametrize("example", README_EXAMPLES.values(), ids=README_EXAMPLES.keys())
def test_examples_are_the_readmes(example):
    import pathlib
    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    assert "```python" + example + "```" in readme


def test_numpy_example():
    scope = {}
    exec(NUMPY_EXAMPLE, scope)
    assert scope["out"].shape == (2, 1024, 8, 64) and scope["lse"].shape == (2, 8, 1024)


def test_variants_example():
    scope = {}
    exec(VARIANTS_EXAMPLE, scope)
    assert scope["out"].shape == (356, 8, 64) and scope["lse"].shape == (8, 356)


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


def test_jax_example():
    jax = pytest.importorskip("jax")
    scope = {}
    exec(JAX_EXAMPLE, scope)
    assert scope["out"].shape == (2, 256, 8, 64) and scope["out"].dtype == jax.numpy.bfloat16
    assert scope["dk"].shape == (2, 256, 2, 64) and scope["batched"].shape == (2, 2, 256, 8, 64)
    # The example's call against the library's own oracle (float64) on the same arrays.
    import numpy as np, flashtile
    f32 = lambda x: np.asarray(x.astype(jax.numpy.float32))
    ref = flashtile.attention(f32(scope["q"]), f32(scope["k"]), f32(scope["v"]), causal=True,
                              window=(127, 0), softcap=30.0, backend="cpu_reference")
    assert np.abs(f32(scope["out"]) - ref).max() <= 2e-2  # bf16 output: 8-bit mantissa
