"""flashtile.attention with CuPy and JAX arrays: results come back in the caller's framework.

JAX arrays take the generic DLPack path (outputs in flashtile-owned memory, imported with
jax.numpy.from_dlpack); CuPy arrays get cupy.empty outputs and CuPy's current stream.
"""

import os

import numpy as np
import pytest

import flashtile
from conftest import max_rel_error, random_case, reference_attention

# JAX grabs 75% of GPU memory at its first use unless told not to; torch runs in this
# process too.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _flashtile_cuda():
    return any(b.device == "cuda" and b.available for b in flashtile.backends().values())


def _jax_platforms():
    jax = pytest.importorskip("jax")
    platforms = ["cpu"]
    if _flashtile_cuda():
        try:
            jax.devices("gpu")
            platforms.append("gpu")
        except RuntimeError:
            pass
    return platforms


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_jax_arrays(rng, platform):
    if platform not in _jax_platforms():
        pytest.skip(f"no JAX {platform} device with a flashtile backend")
    import jax
    device = jax.devices(platform)[0]
    q, k, v = random_case(rng, 2, 31, 45, 4, 2, 64)
    ref_out, ref_lse = reference_attention(q, k, v, causal=True)
    qj, kj, vj = (jax.device_put(x, device) for x in (q, k, v))
    out, lse = flashtile.attention(qj, kj, vj, causal=True, return_lse=True)
    assert isinstance(out, jax.Array) and isinstance(lse, jax.Array), (type(out), type(lse))
    assert out.devices() == {device} and out.dtype == np.float32, (out.devices(), out.dtype)
    assert max_rel_error(np.asarray(out), ref_out) <= 1e-5
    assert max_rel_error(np.asarray(lse), ref_lse) <= 1e-5
    # The result is an ordinary array of its framework.
    assert float(jax.numpy.abs(out - qj.mean()).sum()) > 0


def test_cupy_arrays(rng):
    cupy = pytest.importorskip("cupy")
    if not _flashtile_cuda() or cupy.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("needs CUDA and a flashtile CUDA backend")
    q, k, v = random_case(rng, 2, 31, 45, 4, 2, 64)
    qc, kc, vc = (cupy.asarray(x) for x in (q, k, v))
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        out, lse = flashtile.attention(qc[:, :, ::2], kc, vc, causal=True, return_lse=True)
    stream.synchronize()
    assert isinstance(out, cupy.ndarray) and isinstance(lse, cupy.ndarray)
    ref_out, ref_lse = reference_attention(q[:, :, ::2], k, v, causal=True)
    assert max_rel_error(cupy.asnumpy(out), ref_out) <= 1e-5
    assert max_rel_error(cupy.asnumpy(lse), ref_lse) <= 1e-5
