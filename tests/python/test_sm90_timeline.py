"""bench/sm90_timeline.py, the reader of cuda_sm90's forward timelines, on synthetic files whose
costs are known: it must recover them (the GPU that writes real files is not here)."""
import importlib.util
import pathlib
import struct
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("sm90_timeline", ROOT / "bench" / "sm90_timeline.py")
timeline = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(timeline)

GHZ = 1.5
PER_TILE, LOOP_FIXED, Q_WAIT, EPILOGUE, GAP = 3000, 1500, 2000, 1000, 4000


def synthetic(path, sms=4, items_per_sm=6, consumers=2, magic=b"FTSM90T1", extra=b""):
    rng = np.random.default_rng(7)
    records = np.zeros(sms * items_per_sm * consumers + 3, dtype=timeline.RECORD)  # 3 unused
    n = 0
    for sm in range(sms):
        clock = 10_000 * (sm + 1)
        for k in range(items_per_sm):
            tiles = int(rng.choice([8, 16, 32]))
            start = clock
            q = start + Q_WAIT
            done = q + LOOP_FIXED + PER_TILE * tiles
            end = done + EPILOGUE
            for wg in range(consumers):
                r = records[n]
                r["smid"], r["cta"], r["item"], r["tiles"] = sm, sm * 100 + k, sm * 100 + k, tiles
                r["global_ns"] = int(start / GHZ) + 1_000_000
                r["clock"] = (start + wg, q + wg, done + wg, end + wg)
                n += 1
            clock = end + consumers - 1 + GAP
    header = struct.pack("<8s12I", magic, 128, 128, 128, consumers, 4, len(records), 4, 16,
                         4096, 4096, 0, 0)
    path.write_bytes(header + records.tobytes() + extra)
    return path


def test_recovers_the_costs_it_was_given(tmp_path):
    header, records = timeline.read(synthetic(tmp_path / "t.bin"))
    assert header["head_dim"] == 128 and len(records) == 4 * 6 * 2  # unused slots dropped
    assert timeline.ns_per_cycle(records) == pytest.approx(1 / GHZ, rel=1e-3)
    phases, fit, gaps, busy = timeline.analyse(records)
    assert fit["cycles_per_tile"] == pytest.approx(PER_TILE, rel=1e-6)
    assert fit["loop_intercept"] == pytest.approx(LOOP_FIXED, abs=1)
    assert np.median(phases["q_wait"]) == Q_WAIT
    assert np.median(phases["epilogue"]) == EPILOGUE
    assert np.all(gaps == GAP)
    assert np.all((busy > 0.5) & (busy < 1.0))


def test_the_command_prints_the_fit(tmp_path):
    path = synthetic(tmp_path / "t.bin")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "sm90_timeline.py"), str(path)],
                         capture_output=True, text=True, check=True).stdout
    assert "pipeline tma_ping_pong" in out
    assert "3000 cycles a tile + 1500" in out
    assert "gap between items on an SM: median 4000 cycles" in out


@pytest.mark.parametrize("kwargs", [dict(magic=b"NOTATIME"), dict(extra=b"\0" * 7)])
def test_refuses_files_that_are_not_timelines(tmp_path, kwargs):
    path = synthetic(tmp_path / "bad.bin", **kwargs)
    with pytest.raises(ValueError):
        timeline.read(path)
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "sm90_timeline.py"), str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 1 and "sm90_timeline:" in result.stderr
