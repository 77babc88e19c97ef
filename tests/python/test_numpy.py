"""flashtile.attention on numpy arrays (CPU): the tests CI runs."""

import threading
import time

import numpy as np
import pytest

import flashtile
from conftest import max_rel_error, random_case, reference_attention

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim): odd sizes, seqlen_q != seqlen_k
# both ways, GQA and MQA, head_dim tails.
SHAPES = [
    (1, 1, 1, 1, 1, 32),
    (2, 17, 113, 4, 2, 64),
    (1, 129, 127, 3, 1, 40),
    (3, 113, 17, 2, 2, 7),
    (1, 1, 1025, 8, 2, 128),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_matches_float64_reference(rng, shape, causal):
    q, k, v = random_case(rng, *shape)
    out, lse = flashtile.attention(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = reference_attention(q, k, v, causal=causal)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (shape[0], shape[3], shape[1])
    assert max_rel_error(out, ref_out) <= 1e-5
    assert max_rel_error(lse, ref_lse) <= 1e-5


def test_causal_is_bottom_right(rng):
    # 5 queries, 3 keys: query i sees keys j <= i - 2, so queries 0 and 1 see nothing.
    q, k, v = random_case(rng, 1, 5, 3, 2, 2, 16)
    out, lse = flashtile.attention(q, k, v, causal=True, return_lse=True)
    assert np.all(out[:, :2] == 0.0)
    assert np.all(np.isneginf(lse[:, :, :2]))
    # Query 2 sees key 0 only: its output is v[key 0] exactly (one softmax weight of 1).
    np.testing.assert_allclose(out[:, 2], v[:, 0], rtol=1e-6)
    ref_out, ref_lse = reference_attention(q, k, v, causal=True)
    assert max_rel_error(out, ref_out) <= 1e-5
    assert max_rel_error(lse, ref_lse) <= 1e-5


def test_scale(rng):
    q, k, v = random_case(rng, 2, 9, 11, 2, 1, 24)
    out = flashtile.attention(q, k, v, scale=0.37)
    assert max_rel_error(out, reference_attention(q, k, v, scale=0.37)[0]) <= 1e-5


def test_strided_views_are_read_in_place(rng):
    # q as the transpose of a contiguous BHSD array; k and v every other head of a wider
    # array and every other row; out a strided window of a larger NaN-poisoned buffer.
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = 2, 19, 23, 4, 2, 32
    q_bhsd = rng.uniform(-1, 1, (batch, heads_q, seqlen_q, head_dim)).astype(np.float32)
    q = q_bhsd.transpose(0, 2, 1, 3)
    kv = rng.uniform(-1, 1, (2, batch, 2 * seqlen_k, 2 * heads_kv, head_dim)).astype(np.float32)
    k, v = kv[0, :, ::2, ::2], kv[1, :, ::2, ::2]
    buffer = np.full((batch, seqlen_q, heads_q + 3, head_dim + 8), np.nan, dtype=np.float32)
    out = buffer[:, :, 1:1 + heads_q, 4:4 + head_dim]
    assert not (q.flags.c_contiguous or k.flags.c_contiguous or out.flags.c_contiguous)
    result = flashtile.attention(q, k, v, causal=True, out=out)
    assert result is out
    ref_out, _ = reference_attention(q, k, v, causal=True)
    assert max_rel_error(out, ref_out) <= 1e-5
    # Nothing outside the window was written.
    outside = np.ones(buffer.shape, dtype=bool)
    outside[:, :, 1:1 + heads_q, 4:4 + head_dim] = False
    assert np.all(np.isnan(buffer[outside]))


def test_out_parameter(rng):
    q, k, v = random_case(rng, 1, 7, 7, 2, 2, 16)
    out = np.full(q.shape, np.nan, dtype=np.float32)
    result, lse = flashtile.attention(q, k, v, out=out, return_lse=True)
    assert result is out
    assert max_rel_error(out, reference_attention(q, k, v)[0]) <= 1e-5
    assert lse.shape == (1, 2, 7)


def test_read_only_inputs(rng):
    q, k, v = random_case(rng, 1, 5, 6, 1, 1, 8)
    for x in (q, k, v):
        x.flags.writeable = False
    out = flashtile.attention(q, k, v)
    assert max_rel_error(out, reference_attention(q, k, v)[0]) <= 1e-5


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision(rng, dtype):
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        np_dtype = np.dtype(ml_dtypes.bfloat16)
        eps = 2.0 ** -7
    else:
        np_dtype = np.dtype(np.float16)
        eps = 2.0 ** -10
    q, k, v = random_case(rng, 2, 33, 47, 4, 2, 32, dtype=np_dtype)
    out, lse = flashtile.attention(q, k, v, causal=True, return_lse=True)
    assert out.dtype == np_dtype and lse.dtype == np.float32
    ref_out, ref_lse = reference_attention(q, k, v, causal=True)
    # The CPU backends compute in fp32 and round once on output: a few ulps of the dtype.
    assert max_rel_error(out, ref_out) <= 4 * eps
    assert max_rel_error(lse, ref_lse) <= 1e-5


def test_backends_and_plan(rng):
    info = flashtile.backends()
    assert list(info)[:2] == ["cpu_reference", "cpu_standard"]
    assert info["cpu_standard"] == flashtile.BackendInfo("cpu", True, "")
    for name, backend in info.items():
        assert backend.device in ("cpu", "cuda")
        assert backend.available == (backend.reason == ""), name
    q, k, v = random_case(rng, 1, 4, 4, 1, 1, 8)
    assert flashtile.plan(q, k, v) in [n for n, b in info.items() if b.device == "cpu"]
    assert flashtile.plan(q, k, v, backend="cpu_reference") == "cpu_reference"
    out = flashtile.attention(q, k, v, backend="cpu_reference")
    assert max_rel_error(out, reference_attention(q, k, v)[0]) <= 1e-5


def test_version():
    assert isinstance(flashtile.__version__, str) and flashtile.__version__.count(".") == 2
    metadata = pytest.importorskip("importlib.metadata")
    try:
        installed = metadata.version("flashtile")
    except metadata.PackageNotFoundError:
        pytest.skip("flashtile is not installed as a distribution (in-tree build)")
    assert installed == flashtile.__version__  # pyproject.toml reads CMakeLists.txt's


def test_one_version_everywhere():
    """CMakeLists.txt holds the version once; the module and the CLI report it."""
    import os
    import re
    import shutil
    import subprocess
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "CMakeLists.txt")) as f:
        declared = re.search(r"project\(flashtile VERSION ([0-9.]+)", f.read()).group(1)
    assert flashtile.__version__ == declared
    cli = shutil.which("flashtile")
    if cli is None:
        pytest.skip("the flashtile CLI is not on PATH (pip install . puts it there)")
    shown = subprocess.run([cli, "--version"], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == f"flashtile {declared}"


# --- errors: the library's message, as ValueError or TypeError, nothing written ----------

def _case(rng):
    return random_case(rng, 2, 8, 8, 4, 2, 16)


def test_error_last_stride(rng):
    q, k, v = random_case(rng, 1, 8, 8, 2, 2, 32)
    with pytest.raises(ValueError, match=r"q\.strides\[3\] \(head_dim stride\) must be 1, got 2"):
        flashtile.attention(q[..., ::2], k[..., ::2], v[..., ::2])


def test_error_shapes(rng):
    q, k, v = _case(rng)
    with pytest.raises(ValueError, match=r"v\.shape\[1\] must equal k seqlen \(expected 8, got 5\)"):
        flashtile.attention(q, k, v[:, :5])
    with pytest.raises(ValueError, match=r"q heads \(4\) must be a multiple of k heads \(3\)"):
        flashtile.attention(q, *random_case(rng, 2, 8, 8, 3, 3, 16)[1:])
    with pytest.raises(ValueError, match=r"k must be 4-D \(batch, seqlen, heads, head_dim\), got 3-D"):
        flashtile.attention(q, k[0], v)


def test_error_dtypes(rng):
    q, k, v = _case(rng)
    with pytest.raises(TypeError, match=r"k\.dtype must match q\.dtype \(expected float32, got float16\)"):
        flashtile.attention(q, k.astype(np.float16), v)
    with pytest.raises(TypeError, match=r"q\.dtype must be float32, float16 or bfloat16, got float64"):
        flashtile.attention(q.astype(np.float64), k, v)
    with pytest.raises(TypeError, match=r"out\.dtype must be float32, float16 or bfloat16, got int32"):
        flashtile.attention(q, k, v, out=np.zeros(q.shape, dtype=np.int32))
    with pytest.raises(TypeError, match=r"q must be a numpy array or a DLPack array"):
        flashtile.attention(q.tolist(), k, v)


def test_error_arguments(rng):
    q, k, v = _case(rng)
    with pytest.raises(ValueError, match=r"out must not overlap q"):
        flashtile.attention(q, k, v, out=q)
    with pytest.raises(ValueError, match=r"scale must be finite, got inf"):
        flashtile.attention(q, k, v, scale=float("inf"))
    with pytest.raises(ValueError, match=r"backend must be one of auto, cpu_reference, .*got 'fast'"):
        flashtile.attention(q, k, v, backend="fast")
    with pytest.raises(ValueError, match=r"out\.shape\[1\] must equal the q dimension"):
        flashtile.attention(q, k, v, out=np.empty((2, 9, 4, 16), dtype=np.float32))
    # Where a backend runs is known in every build, so the device mismatch is what is reported.
    with pytest.raises(ValueError, match=r"backend cuda_tiled runs on cuda but the tensors are on cpu"):
        flashtile.attention(q, k, v, backend="cuda_tiled")


def test_error_leaves_out_untouched(rng):
    q, k, v = _case(rng)
    out = np.full(q.shape, np.nan, dtype=np.float32)
    with pytest.raises(ValueError):
        flashtile.attention(q, k, v[:, :5], out=out)
    with pytest.raises(ValueError):
        flashtile.attention(q, k, v, out=out, scale=float("nan"))
    assert np.all(np.isnan(out))


def test_gil_is_released_during_cpu_compute(rng):
    # While a worker thread runs a ~0.1-0.5 s CPU attention (cpu_standard: single-threaded,
    # predictable), this thread keeps running Python: the longest pause it sees must be far
    # shorter than the call (a held GIL would stall it for the whole call).
    q, k, v = random_case(rng, 1, 2048, 2048, 2, 2, 64)
    timing = {}

    def worker():
        start = time.perf_counter()
        flashtile.attention(q, k, v, backend="cpu_standard")
        timing["call"] = time.perf_counter() - start

    thread = threading.Thread(target=worker)
    longest_pause, last = 0.0, time.perf_counter()
    thread.start()
    while thread.is_alive():
        now = time.perf_counter()
        longest_pause, last = max(longest_pause, now - last), now
    thread.join()
    assert timing["call"] > 0.05, "the case is too small to tell"
    assert longest_pause < 0.5 * timing["call"]


def test_flags_must_be_bools(rng):
    # Truthiness would turn causal='False' into causal attention and return_lse='no' into a
    # tuple: both are refused, with nothing run.
    q, k, v = random_case(rng, 1, 8, 8, 2, 2, 16)
    with pytest.raises(TypeError, match="causal must be True or False, got 'False'"):
        flashtile.attention(q, k, v, causal="False")
    with pytest.raises(TypeError, match="return_lse must be True or False, got 'no'"):
        flashtile.attention(q, k, v, return_lse="no")
    out, lse = flashtile.attention(q, k, v, causal=np.bool_(True), return_lse=True)
    assert lse.shape == (1, 2, 8)


def test_masked_arrays_are_refused(rng):
    q, k, v = random_case(rng, 1, 8, 8, 2, 2, 16)
    masked = np.ma.masked_array(q, mask=np.zeros(q.shape, bool))
    with pytest.raises(TypeError, match="masked array"):
        flashtile.attention(masked, k, v)


def test_read_only_out_is_refused_and_untouched(rng):
    q, k, v = random_case(rng, 1, 8, 8, 2, 2, 16)
    out = np.full(q.shape, np.nan, np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out is a read-only array"):
        flashtile.attention(q, k, v, out=out)
    assert np.isnan(out).all()


class _DLPackOnly:
    """A bare DLPack producer (no numpy type), as any framework's array looks to flashtile."""

    def __init__(self, array):
        self.array, self.shape, self.dtype = array, array.shape, array.dtype

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_out_flagged_read_only_by_dlpack_is_refused_and_untouched(rng):
    q, k, v = (_DLPackOnly(x) for x in random_case(rng, 1, 8, 8, 2, 2, 16))
    out = np.full(q.shape, np.nan, np.float32)
    out.flags.writeable = False  # numpy's versioned DLPack export flags it read-only
    with pytest.raises(ValueError, match="out is read-only .its DLPack export is flagged"):
        flashtile.attention(q, k, v, out=_DLPackOnly(out))
    assert np.isnan(out).all()
    writable = np.full(q.shape, np.nan, np.float32)
    flashtile.attention(q, k, v, out=_DLPackOnly(writable))
    assert np.isfinite(writable).all()


def test_out_that_aliases_itself_is_refused(rng):
    q, k, v = random_case(rng, 1, 8, 8, 2, 2, 16)
    base = np.zeros(16, np.float32)
    out = np.lib.stride_tricks.as_strided(base, q.shape, (0, 0, 0, 4), writeable=True)
    with pytest.raises(ValueError, match="out must not overlap itself"):
        flashtile.attention(q, k, v, out=out)
    assert not base.any()
