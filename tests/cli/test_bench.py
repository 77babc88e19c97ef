"""End-to-end checks of `flashtile bench` with each variant on the CPU backends: the rows
carry the variant, FLOPs count the visible pairs (checked against a count of the rule made
here), every row passed the oracle, refusing backends are skipped with their reason, and
bad flag values are refused before anything runs."""
import csv
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

FLASHTILE = sys.argv[1]
BACKENDS = "cpu_reference,cpu_standard,cpu_flash"

failures = 0


def expect(cond, what):
    global failures
    what = what.replace("\n", " | ")
    if not cond:
        failures += 1
        print("FAIL:", what)
    else:
        print("ok:", what)


def bench(*args):
    return subprocess.run([FLASHTILE, "bench", "--repeats", "1", "--warmup", "0", *args],
                          capture_output=True, text=True)


def visible_pairs(sq, sk, left=-1, right=-1, causal=False):
    """Pairs (i, j) with j - (i + sk - sq) in [-left, right] (-1 unbounded; causal: right 0)."""
    if causal:
        right = 0
    rel = np.arange(sk)[None, :] - (np.arange(sq)[:, None] + sk - sq)
    seen = np.ones((sq, sk), bool)
    if left >= 0:
        seen &= rel >= -left
    if right >= 0:
        seen &= rel <= right
    return int(seen.sum())


def expected_flops(heads, d, lengths, window=None, causal=False, varlen=False):
    """The field's convention for dense full/causal, the visible pairs otherwise."""
    if not varlen and window is None:
        (sq, sk), = set(lengths)
        full = 4.0 * heads * d * sq * sk * len(lengths)
        return full / 2 if causal else full
    left, right = window if window else (-1, -1)
    return 4.0 * heads * d * sum(visible_pairs(q, k, left, right, causal) for q, k in lengths)


# (flags, heads, head_dim, per-sequence (sq, sk), window, causal, varlen, variant fields)
N = 96
cases = [
    ([], 1, 64, [(N, N)], None, False, False, {}),
    (["--causal"], 1, 64, [(N, N)], None, True, False, {}),
    (["--window", "16,0"], 2, 32, [(N, N)], (16, 0), False, False, {"window": [16, 0]}),
    (["--window", "8,8", "--causal"], 2, 32, [(N, N)], (8, 8), True, False, {"window": [8, 8]}),
    (["--window", "-1,5"], 1, 32, [(N, N)], (-1, 5), False, False, {"window": [-1, 5]}),
    (["--softcap", "2"], 2, 32, [(N, N)], None, False, False, {"softcap": 2}),
    (["--alibi", "--heads", "6"], 6, 32, [(N, N)], None, False, False, {"alibi": True}),
    (["--sinks"], 2, 32, [(N, N)], None, False, False, {"sinks": "random"}),
    (["--sinks=-0.5"], 2, 32, [(N, N)], None, False, False, {"sinks": -0.5}),
    (["--sinks", "1.25", "--causal"], 2, 32, [(N, N)], None, True, False, {"sinks": 1.25}),
    (["--varlen", "40,0,1,17/60"], 2, 32, [(40, 40), (0, 0), (1, 1), (17, 60)], None, False, True,
     {}),
    (["--varlen", "30,50", "--causal", "--window", "4,-1"], 2, 16, [(30, 30), (50, 50)], (4, -1),
     True, True, {"window": [4, -1]}),
    (["--window", "12,3", "--softcap", "1.5", "--alibi", "--sinks", "--heads", "4", "--heads-kv",
      "2", "--dtype", "bf16"], 4, 40, [(N, N)], (12, 3), False, False,
     {"window": [12, 3], "softcap": 1.5, "alibi": True, "sinks": "random"}),
]

with tempfile.TemporaryDirectory() as tmp:
    for flags, heads, d, lengths, window, causal, varlen, fields in cases:
        name = " ".join(flags) or "dense"
        shape = [] if varlen else ["--seqlen", str(N)]
        if "--heads" not in flags:
            shape += ["--heads", str(heads)]
        r = bench("--json", "--backends", BACKENDS, "--head-dim", str(d), *shape, *flags)
        expect(r.returncode == 0, f"{name}: exit 0 ({r.stderr.strip()[-300:]})")
        if r.returncode != 0:
            continue
        rows = json.loads(r.stdout)
        backends = {row["backend"] for row in rows}
        expect("cpu_reference" in backends, f"{name}: the oracle backend ran")
        if fields or varlen:
            expect("cpu_standard skipped" in r.stderr and "journey step" in r.stderr,
                   f"{name}: cpu_standard (a journey step) skipped with its reason")
        else:
            expect({"cpu_standard", "cpu_flash"} <= backends, f"{name}: every CPU backend ran")
        want = expected_flops(heads, d, lengths, window, causal, varlen)
        for row in rows:
            tag = f"{name} [{row['backend']}]"
            expect(row["flops"] == want, f"{tag}: flops {row['flops']} == {want}")
            expect(abs(row["tflops"] - row["flops"] / (row["ms"] * 1e-3) / 1e12)
                   <= 1e-3 * row["tflops"] + 1e-12, f"{tag}: tflops = flops / time")
            bound = 1e-6 if row["dtype"] == "float32" else 2e-2
            expect(row["max_abs_err"] is not None and row["max_abs_err"] <= bound,
                   f"{tag}: max_abs_err {row['max_abs_err']} <= {bound}")
            expect(row["causal"] == causal, f"{tag}: causal recorded")
            want_timing = "wall" if row["backend"].startswith("cpu") else "queued"
            expect(row["timing"] == want_timing, f"{tag}: timing {row['timing']} == {want_timing}")
            for key in ("window", "softcap", "sinks"):
                expect(row[key] == fields.get(key), f"{tag}: {key} = {row[key]}")
            expect(row["alibi"] == fields.get("alibi", False), f"{tag}: alibi = {row['alibi']}")
            if varlen:
                vl = row["varlen"]
                expect(vl is not None and vl["lengths_q"] == [q for q, _ in lengths]
                       and vl["lengths_k"] == [k for _, k in lengths]
                       and vl["sequences"] == len(lengths)
                       and vl["total_q"] == sum(q for q, _ in lengths)
                       and row["batch"] == len(lengths)
                       and row["seqlen_q"] == max(q for q, _ in lengths),
                       f"{tag}: varlen lengths recorded: {vl}")
            else:
                expect(row["varlen"] is None, f"{tag}: no varlen")

    # The random varlen syntax: lengths in range, the total exact.
    r = bench("--json", "--backends", "cpu_reference", "--varlen", "random:8-64:300", "--causal",
              "--head-dim", "16")
    rows = json.loads(r.stdout) if r.returncode == 0 else []
    lengths = rows[0]["varlen"]["lengths_q"] if rows else []
    expect(sum(lengths) == 300 and all(n <= 64 for n in lengths)
           and all(n >= 8 for n in lengths[:-1]),
           f"--varlen random:8-64:300 gives lengths in [8, 64] summing to 300: {lengths}")

    # CSV output carries the variant columns.
    out_csv = os.path.join(tmp, "rows.csv")
    r = bench("--backends", "cpu_reference", "--seqlen", "64", "--window", "8,0", "--softcap", "3",
              "--alibi", "--sinks=0.5", "--output", out_csv)
    expect(r.returncode == 0 and os.path.exists(out_csv), "--output rows.csv written")
    if os.path.exists(out_csv):
        row = next(csv.DictReader(open(out_csv)))
        expect(row["window_left"] == "8" and row["window_right"] == "0" and row["softcap"] == "3"
               and row["alibi"] == "1" and row["sinks"] == "0.5" and row["varlen_sequences"] == ""
               and float(row["flops"]) == expected_flops(1, 64, [(64, 64)], (8, 0)),
               f"CSV variant columns: {row}")

    # Bad values: a clear error naming the flag, a non-zero exit, nothing run or written.
    out_json = os.path.join(tmp, "never.json")
    bad = [
        (["--window", "5"], "--window must be L,R"),
        (["--window", "a,b"], "--window must be L,R"),
        (["--window", "-2,0"], "--window must be L,R"),
        (["--window", "1,2,3"], "--window must be L,R"),
        (["--softcap", "-1"], "--softcap must be a positive finite number"),
        (["--softcap", ""], "--softcap must be a positive finite number"),
        (["--softcap", "0"], "--softcap must be a positive finite number"),
        (["--softcap", "inf"], "--softcap must be a positive finite number"),
        (["--sinks", "nan"], "--sinks must be 'random' or a finite number"),
        (["--varlen", "3,x"], "--varlen must be"),
        (["--varlen", "random:9-4:100"], "--varlen must be"),
        (["--varlen", "0,0"], "--varlen must be a batch with at least one query"),
        (["--varlen", "4", "--seqlen", "8"], "excludes"),
        (["--varlen", "4", "--sweep"], "excludes"),
    ]
    for flags, message in bad:
        r = bench("--json", "--backends", "cpu_reference", "--output", out_json, *flags)
        expect(r.returncode != 0 and message in r.stderr and r.stdout.strip() == ""
               and "[1/" not in r.stderr and not os.path.exists(out_json),
               f"refused {' '.join(flags)!r}: {r.stderr.strip()}")

print(f"{failures} failed")
sys.exit(1 if failures else 0)
