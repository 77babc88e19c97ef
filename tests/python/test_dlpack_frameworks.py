"""flashtile.attention with CuPy and JAX arrays: results come back in the caller's framework.

JAX arrays take the generic DLPack path (outputs in flashtile-owned memory, imported with
jax.numpy.from_dlpack); CuPy arrays get cupy.empty outputs and CuPy's current stream.
"""

import os

import numpy as np
import pytest

import flashtile
from conftest import (max_rel_error, random_case, reference_attention,
                      reference_attention_varlen)

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


def test_jax_array_as_out_is_refused_and_untouched(rng):
    jax = pytest.importorskip("jax")
    q, k, v = random_case(rng, 1, 8, 8, 2, 2, 16)
    out = jax.numpy.full(q.shape, jax.numpy.nan, jax.numpy.float32)
    qj, kj, vj = (jax.numpy.asarray(x) for x in (q, k, v))
    with pytest.raises(ValueError, match="out cannot be a JAX array: JAX arrays are immutable"):
        flashtile.attention(qj, kj, vj, out=out)
    assert bool(jax.numpy.isnan(out).all())


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


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_jax_variants_and_varlen(rng, platform):
    if platform not in _jax_platforms():
        pytest.skip(f"no JAX {platform} device with a flashtile backend")
    import jax
    device = jax.devices(platform)[0]
    put = lambda x: jax.device_put(x, device)
    q, k, v = random_case(rng, 1, 20, 26, 4, 2, 32)
    cu_q, cu_k = np.array([0, 7, 7, 20], np.int32), np.array([0, 9, 12, 26], np.int32)
    sinks = rng.uniform(-1, 1, 4).astype(np.float32)
    options = dict(causal=True, window=(5, 0), softcap=1.5, sinks=sinks)
    try:
        flashtile.plan_varlen(put(q[0]), put(k[0]), put(v[0]), put(cu_q), put(cu_k),
                              **{**options, "sinks": put(sinks)})
    except ValueError as error:
        if "no backend can run this call" in str(error):
            pytest.skip(str(error))
        raise
    out, lse = flashtile.attention_varlen(put(q[0]), put(k[0]), put(v[0]), put(cu_q), put(cu_k),
                                          return_lse=True, **{**options, "sinks": put(sinks)})
    assert isinstance(out, jax.Array) and out.devices() == {device} and lse.shape == (4, 20)
    ref_out, ref_lse = reference_attention_varlen(q[0], k[0], v[0], cu_q, cu_k, **options)
    assert max_rel_error(np.asarray(out), ref_out) <= 1e-5
    assert max_rel_error(np.asarray(lse), ref_lse) <= 1e-5


def test_cupy_variants_and_varlen(rng):
    cupy = pytest.importorskip("cupy")
    if not _flashtile_cuda() or cupy.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("needs CUDA and a flashtile CUDA backend")
    q, k, v = random_case(rng, 1, 20, 26, 4, 2, 32)
    cu_q, cu_k = np.array([0, 7, 7, 20], np.int32), np.array([0, 9, 12, 26], np.int32)
    slopes = rng.uniform(0.1, 0.5, 4).astype(np.float32)
    args = [cupy.asarray(x) for x in (q[0], k[0], v[0], cu_q, cu_k)]
    try:
        flashtile.plan_varlen(*args, causal=True, alibi_slopes=cupy.asarray(slopes))
    except ValueError as error:
        if "no backend can run this call" in str(error):
            pytest.skip(str(error))
        raise
    out, lse = flashtile.attention_varlen(*args, causal=True, alibi_slopes=cupy.asarray(slopes),
                                          return_lse=True)
    assert isinstance(out, cupy.ndarray) and lse.shape == (4, 20)
    ref_out, ref_lse = reference_attention_varlen(q[0], k[0], v[0], cu_q, cu_k, causal=True,
                                                  alibi_slopes=slopes)
    assert max_rel_error(cupy.asnumpy(out), ref_out) <= 1e-5
    assert max_rel_error(cupy.asnumpy(lse), ref_lse) <= 1e-5
