#!/usr/bin/env python3
"""Reads a cuda_sm90 forward timeline (src/cuda/04_sm90/timeline.cuh) and says where a work
item's time goes: the wait for its Q, its key tiles, its epilogue, the gap between items on
one SM, and the fit of an item's tile loop against its tile count (cycles a tile, and what is
left over: the fixed cost a CTA pays whatever its length).

Record a file with a build configured with -DFLASHTILE_SM90_TIMELINE=ON:
  FLASHTILE_SM90_TIMELINE=/tmp/t.bin build-timeline/tools/flashtile bench --backends cuda_sm90 \\
      --dtype bf16 --batch 4 --heads 16 --seqlen 4096 --head-dim 128 --repeats 3 --warmup 0
  python3 bench/sm90_timeline.py /tmp/t.bin
"""
import argparse
import struct
import sys

import numpy as np

MAGIC = b"FTSM90T1"
HEADER = struct.Struct("<8s12I")
HEADER_FIELDS = ("head_dim", "block_m", "block_n", "warpgroups", "pipeline", "records", "batch",
                 "heads", "seqlen_q", "seqlen_k", "causal", "reserved")
MARKS = ("start", "q_landed", "tiles_done", "epilogue_done")
RECORD = np.dtype([("smid", "<u4"), ("cta", "<u4"), ("item", "<u4"), ("tiles", "<u4"),
                   ("global_ns", "<u8"), ("clock", "<u8", (len(MARKS),))])
# The Pipeline enum of kernel.cuh, in order.
PIPELINES = ("cp_async", "tma", "tma_ws", "tma_ws_overlap", "tma_ping_pong", "tma_persistent",
             "tma_ws_m192", "tma_ws_overlap_m192", "tma_ping_pong_m192")
assert HEADER.size == 56 and RECORD.itemsize == 56


def read(path):
    """(header dict, records of the work items that finished, as a structured array)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < HEADER.size:
        raise ValueError(f"{path}: {len(raw)} bytes, shorter than the {HEADER.size}-byte header")
    magic, *values = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise ValueError(f"{path}: not a cuda_sm90 timeline (magic {magic!r})")
    header = dict(zip(HEADER_FIELDS, values))
    body = raw[HEADER.size:]
    if len(body) != header["records"] * RECORD.itemsize:
        raise ValueError(f"{path}: {len(body)} bytes of records, the header says "
                         f"{header['records']} of {RECORD.itemsize}")
    records = np.frombuffer(body, dtype=RECORD)
    clocks = records["clock"]
    finished = (clocks[:, 0] != 0) & np.all(clocks[:, 1:] >= clocks[:, :1], axis=1) & \
        (clocks[:, 3] != 0)
    return header, records[finished]


def ns_per_cycle(records):
    """The SMs' clock period, from %globaltimer against clock64 at each item's start, fitted
    per SM (each SM has its own clock64) and taken as the median over SMs."""
    periods = []
    for sm in np.unique(records["smid"]):
        r = records[records["smid"] == sm]
        cycles = r["clock"][:, 0].astype(np.float64)
        ns = r["global_ns"].astype(np.float64)
        if len(r) >= 2 and np.ptp(cycles) > 0 and np.ptp(ns) > 0:
            periods.append(np.polyfit(cycles - cycles.min(), ns - ns.min(), 1)[0])
    return float(np.median(periods)) if periods else float("nan")


def analyse(records):
    """Per-record phases (cycles), the tile fit, and the gaps between items on an SM."""
    c = records["clock"].astype(np.int64)
    phases = {
        "q_wait": c[:, 1] - c[:, 0],
        "tiles": c[:, 2] - c[:, 1],
        "epilogue": c[:, 3] - c[:, 2],
        "item": c[:, 3] - c[:, 0],
    }
    tiles = records["tiles"].astype(np.float64)
    fit = None
    if len(np.unique(tiles)) >= 2:
        slope, intercept = np.polyfit(tiles, phases["tiles"].astype(np.float64), 1)
        fit = dict(cycles_per_tile=float(slope), loop_intercept=float(intercept))
    elif len(tiles) and tiles[0] > 0:
        fit = dict(cycles_per_tile=float(np.median(phases["tiles"]) / tiles[0]), loop_intercept=0.0)
    # Items on one SM, in the order they started: from one item's end (its last warpgroup)
    # to the next one's start (its first).
    gaps, busy = [], []
    for sm in np.unique(records["smid"]):
        on_sm = records[records["smid"] == sm]
        by_item = {}
        for r in on_sm:
            key = (int(r["cta"]), int(r["item"]))
            start, end = int(r["clock"][0]), int(r["clock"][3])
            lo, hi = by_item.get(key, (start, end))
            by_item[key] = (min(lo, start), max(hi, end))
        spans = sorted(by_item.values())
        gaps += [b[0] - a[1] for a, b in zip(spans, spans[1:])]
        total = spans[-1][1] - spans[0][0]
        if total > 0:
            busy.append(sum(e - s for s, e in spans) / total)
    return phases, fit, np.array(gaps, dtype=np.int64), np.array(busy)


def summary(header, records):
    period = ns_per_cycle(records)
    phases, fit, gaps, busy = analyse(records)
    lines = []
    pipeline = header["pipeline"]
    name = PIPELINES[pipeline] if pipeline < len(PIPELINES) else str(pipeline)
    lines.append(f"d={header['head_dim']} {'causal' if header['causal'] else 'full'} "
                 f"b={header['batch']} h={header['heads']} sq={header['seqlen_q']} "
                 f"sk={header['seqlen_k']}: pipeline {name}, {header['block_m']}x{header['block_n']} "
                 f"tiles, {header['warpgroups']} consumer warpgroups")
    lines.append(f"{len(records)} warpgroup records on {len(np.unique(records['smid']))} SMs; "
                 f"clock {1 / period:.3f} GHz (globaltimer against clock64)")

    def us(cycles):
        return cycles * period / 1e3

    lines.append(f"{'phase':<12}{'median cyc':>12}{'mean cyc':>12}{'median us':>11}")
    for key, values in phases.items():
        lines.append(f"{key:<12}{np.median(values):>12.0f}{np.mean(values):>12.0f}"
                     f"{us(np.median(values)):>11.3f}")
    if fit:
        per_tile = fit["cycles_per_tile"]
        fixed = phases["item"] - per_tile * records["tiles"]
        lines.append(f"tile loop: {per_tile:.0f} cycles a tile + {fit['loop_intercept']:.0f}; "
                     f"an item's fixed cost (item - tiles x {per_tile:.0f}): median "
                     f"{np.median(fixed):.0f} cycles ({us(np.median(fixed)):.3f} us), "
                     f"{np.median(fixed) / per_tile:.2f} tiles")
    if len(gaps):
        lines.append(f"gap between items on an SM: median {np.median(gaps):.0f} cycles "
                     f"({us(np.median(gaps)):.3f} us), p90 {np.percentile(gaps, 90):.0f}")
    if len(busy):
        lines.append(f"SM busy with items, from its first start to its last end: median "
                     f"{100 * np.median(busy):.1f}%, min {100 * busy.min():.1f}%")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("files", nargs="+", help="timeline files written under FLASHTILE_SM90_TIMELINE")
    args = p.parse_args()
    status = 0
    for path in args.files:
        try:
            header, records = read(path)
        except (OSError, ValueError) as e:
            print(f"sm90_timeline: {e}", file=sys.stderr)
            status = 1
            continue
        if len(records) == 0:
            print(f"{path}: no finished item was recorded", file=sys.stderr)
            status = 1
            continue
        print(f"== {path}")
        print(summary(header, records))
    return status


if __name__ == "__main__":
    sys.exit(main())
