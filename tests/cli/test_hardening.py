"""The hostile-input reproducers of the hardening issue, end to end through the CLI: each
gets a clear error (exit 2 for our checks, 105 for CLI11's) or the right answer, nothing
crashes, and no file is created, replaced or left behind."""
import os
import signal
import struct
import subprocess
import sys
import tempfile
import threading

import numpy as np

FLASHTILE = os.path.abspath(sys.argv[1])
failures = []


def run(args, cwd):
    return subprocess.run([FLASHTILE] + args, cwd=cwd, capture_output=True, text=True, timeout=120)


def check(name, ok, detail=""):
    print(("ok:   " if ok else "FAIL: ") + name + ("" if ok else " -- " + detail))
    if not ok:
        failures.append(name)


def snapshot(folder):
    """Every entry of the folder with its bytes (None for what is not a regular file)."""
    state = {}
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if os.path.islink(path) or not os.path.isfile(path):
            state[entry] = ("special", os.path.islink(path) and os.readlink(path))
        else:
            with open(path, "rb") as f:
                state[entry] = f.read()
    return state


def refused(name, args, folder, message, codes=(2, 105)):
    """The command fails with `message` on stderr, no signal, and the folder is unchanged."""
    before = snapshot(folder)
    r = run(args, folder)
    crashed = r.returncode < 0 or r.returncode in (128 + signal.SIGSEGV, 128 + signal.SIGFPE)
    check(name, not crashed and r.returncode in codes and message in r.stderr + r.stdout,
          f"rc={r.returncode} stderr={r.stderr.strip()[-300:]!r}")
    check(name + ": nothing changed", snapshot(folder) == before)


def npy_with_header(path, header, payload):
    """A .npy file with a hand-written header dict (padded as numpy pads)."""
    text = header + " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode() + payload)


with tempfile.TemporaryDirectory() as d:
    rng = np.random.default_rng(0)
    for n in "qkv":
        np.save(os.path.join(d, n + ".npy"), rng.standard_normal((1, 16, 2, 8)).astype(np.float32))
    np.save(os.path.join(d, "old_out.npy"), np.zeros(3, np.float32))
    base = ["run", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy"]

    # Crashes: sweep lists with 0, unbounded thread counts, wrapping header shapes.
    refused("bench --sweep-seqlens 0", ["bench", "--sweep", "--sweep-seqlens", "0"], d, "must be >= 1, got 0")
    refused("bench --sweep-head-dims 0", ["bench", "--sweep", "--sweep-head-dims", "0"], d, "must be >= 1, got 0")
    refused("bench --threads 100000", ["bench", "--threads", "100000", "--seqlen", "64"], d, "at most 1024")
    refused("check --threads 100000", ["check", "--threads", "100000", "--shapes", "1"], d, "at most 1024")
    npy_with_header(os.path.join(d, "wrap.npy"),
                    "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2305843009213693957, 4, 16), }",
                    b"\0" * 4096)
    refused("run: header shape whose product wraps int64", base[:2] + ["wrap.npy"] + base[3:] + ["--out", "o.npy"],
            d, "too large")

    # Files: every output is checked before anything runs, and written all or nothing.
    os.mkdir(os.path.join(d, "adir"))
    refused("run --lse names a directory", base + ["--out", "old_out.npy", "--lse", "adir"], d, "is a directory")
    refused("run --out and --lse the same path", base + ["--out", "x.npy", "--lse", "x.npy"], d,
            "name the same file")
    refused("run --out and --lse the same file by two names", base + ["--out", "x.npy", "--lse", "./x.npy"], d,
            "name the same file")
    os.mkfifo(os.path.join(d, "fifo"))
    refused("run --out a FIFO", base + ["--out", "fifo"], d, "not a regular file")
    refused("run --out a device node", base + ["--out", "/dev/null"], d, "not a regular file")
    os.symlink("old_out.npy", os.path.join(d, "link.npy"))
    refused("run --out a symlink", base + ["--out", "link.npy"], d, "symbolic link")
    refused("run --out in a missing directory", base + ["--out", "nowhere/o.npy"], d, "does not exist")
    # The old fixed temporary name, planted as a symlink to a victim file: never followed.
    victim = os.path.join(d, "victim.npy")
    np.save(victim, np.ones(2, np.float32))
    os.symlink("victim.npy", os.path.join(d, "o.npy.tmp-flashtile"))
    with open(victim, "rb") as f:
        victim_bytes = f.read()
    r = run(base + ["--out", "o.npy"], d)
    with open(victim, "rb") as f:
        check("planted temp-name symlink is not followed", r.returncode == 0 and f.read() == victim_bytes,
              r.stderr)
    os.remove(os.path.join(d, "o.npy.tmp-flashtile"))
    # A legal name of NAME_MAX characters.
    long_name = "o" * 251 + ".npy"
    r = run(base + ["--out", long_name], d)
    check("run --out with a 255-character name", r.returncode == 0 and os.path.exists(os.path.join(d, long_name)),
          r.stderr)
    os.remove(os.path.join(d, long_name))
    # Replacing an existing output is allowed, and atomic.
    r = run(base + ["--out", "old_out.npy", "--lse", "old_lse.npy"], d)
    check("run replaces an existing output", r.returncode == 0 and np.load(os.path.join(d, "old_out.npy")).shape
          == (1, 16, 2, 8), r.stderr)
    # Concurrent runs on one output: each finishes, the file is one whole result, no temporaries.
    results = []
    threads = [threading.Thread(target=lambda: results.append(run(base + ["--out", "shared.npy"], d)))
               for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check("concurrent runs on one output", all(r.returncode == 0 for r in results)
          and np.load(os.path.join(d, "shared.npy")).shape == (1, 16, 2, 8))
    check("no temporary files left", not [e for e in os.listdir(d) if e.endswith(".tmp")], str(os.listdir(d)))

    # Silently wrong before: an empty scale, malformed header shapes, non-positive lengths.
    refused("run --scale ''", base + ["--out", "o2.npy", "--scale", ""], d, "--scale must be a finite number")
    for shape in ("(2abc, 16, 2, 8)", "(2.9, 16, 2, 8)", "(1, 16, 2, 8) junk", "(-1, 16, 2, 8)", "(16)"):
        npy_with_header(os.path.join(d, "bad.npy"), "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % shape,
                        b"\0" * (16 * 2 * 8 * 4))
        refused(f"run: header shape {shape}", base[:2] + ["bad.npy"] + base[3:] + ["--out", "o2.npy"], d, "bad.npy")
    npy_with_header(os.path.join(d, "extra.npy"),
                    "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 16, 2, 8), 'extra': 1, }", b"\0" * 1024)
    refused("run: unknown header key", base[:2] + ["extra.npy"] + base[3:] + ["--out", "o2.npy"], d, "unexpected")
    refused("bench --seqlen 0", ["bench", "--seqlen", "0"], d, "must be >= 1, got 0")
    refused("bench --seqlen -5", ["bench", "--seqlen", "-5"], d, "must be >= 1, got -5")
    refused("bench --batch 0", ["bench", "--batch", "0"], d, "must be >= 1, got 0")

    # Errors that named nothing: huge sizes get a message with the shape and the sizes.
    refused("bench --seqlen 2^40", ["bench", "--seqlen", str(2 ** 40), "--repeats", "1"], d,
            "cannot allocate a tensor of shape (1, 1099511627776, 1, 64)")
    refused("check --max-seqlen 0", ["check", "--max-seqlen", "0"], d, "must be >= 1, got 0")
    npy_with_header(os.path.join(d, "huge.npy"),
                    "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1099511627776, 2, 8), }", b"\0" * 64)
    refused("run: header shape of 2^40 rows with a few bytes", base[:2] + ["huge.npy"] + base[3:] + ["--out", "o2.npy"],
            d, "truncated data")

print(f"{len(failures)} failed" if failures else "all passed")
sys.exit(1 if failures else 0)
