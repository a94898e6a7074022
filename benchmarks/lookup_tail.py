"""Where a lookup's p99 comes from on this box: passes of the same 1,000 lookups, one after another.

    python3 benchmarks/lookup_tail.py [--workers 1024] [--copies 10000000] [--seconds 10] [--cpu 1]

The index and requests are bench_peer's (bench_consumers' shared profile, 512-page requests). Each
pass times every request's `PrefixRouter.match_columns` (/score's lookup) in process CPU time and
reports its p99 and its stalls: lookups slower than `--stall-us`, with the median gap between them
in milliseconds (a steady gap is a periodic interruption, such as the kernel's timer tick). p99 is
the 10th slowest of 1,000, so a pass with fewer than 10 stalls has a p99 of ordinary lookups and a
pass with 10 or more has one inside the stall band. Then the cost of a lookup whose caches were
flushed (512 MB written between lookups): a 1-page request (the fixed cost: the call, the walk's
set-up, the result arrays) and a whole one, against the same warm.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_consumers import build_docs, shared_batches  # noqa: E402
from bench_peer import Ours, make_requests  # noqa: E402


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=1024)
    ap.add_argument("--copies", type=int, default=10_000_000)
    ap.add_argument("--seconds", type=float, default=10.0, help="how long to keep making passes")
    ap.add_argument("--cpu", type=int, default=1, help="pin to this CPU (-1: no pinning)")
    ap.add_argument("--stall-us", type=float, default=60.0)
    return ap.parse_args()


def passes(lookup, hashed: list[np.ndarray], seconds: float, stall_s: float) -> list[tuple[float, float, int, float]]:
    """(start s, p99 us, stalls, median gap between stalls ms) per pass over `hashed`."""
    cpu, pc = time.process_time, time.perf_counter
    out, t_start = [], pc()
    while pc() - t_start < seconds:
        began, times, stalls = pc(), [], []
        for hs in hashed:
            t0, c0 = pc(), cpu()
            lookup(hs)
            took = cpu() - c0
            times.append(took)
            if took > stall_s:
                stalls.append(t0)
        times.sort()
        gaps = [b - a for a, b in zip(stalls, stalls[1:])]
        gap_ms = statistics.median(gaps) * 1e3 if gaps else float("nan")
        out.append((began - t_start, times[int(len(times) * 0.99)] * 1e6, len(stalls), gap_ms))
    return out


def flushed(lookup, hashed: list[np.ndarray], pages: int | None, junk: np.ndarray | None) -> float:
    """Median CPU us of a lookup of each request's first `pages` pages (None: all), with a write to every
    line of `junk` before each (None: warm)."""
    cpu, times = time.process_time, []
    for hs in hashed[:150]:
        if junk is not None:
            junk[::8] += 1
        h = hs if pages is None else hs[:pages]
        c0 = cpu()
        lookup(h)
        times.append(cpu() - c0)
    return statistics.median(times) * 1e6


def main() -> None:
    args = _args()
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})
    rnd = random.Random(0)
    docs = build_docs(400, 512, rnd)
    batches, copies = shared_batches(docs, args.workers, args.copies, rnd)
    reqs = make_requests(docs, 512, 1000, rnd)
    gc.collect()
    gc.freeze()
    ours = Ours(batches, copies, reqs, args.workers)
    ours.apply()
    lookup, hashed = ours.router.match_columns, ours.hashed
    rows = passes(lookup, hashed, args.seconds, args.stall_us * 1e-6)
    print(f"# {args.workers} workers x {copies:,} copies: {len(rows)} passes of {len(hashed)} lookups")
    print(f"{'start s':>8} {'p99 us':>8} {'stalls':>7} {'gap ms':>7}")
    for began, p99, n, gap in rows:
        print(f"{began:8.2f} {p99:8.1f} {n:7d} {gap:7.2f}")
    clean = [p for _, p, n, _ in rows if n < 10]
    hit = [p for _, p, n, _ in rows if n >= 10]
    print(
        f"# passes with < 10 stalls: {len(clean)}, p99 median {statistics.median(clean) if clean else float('nan'):.1f} us;"
        f" with >= 10: {len(hit)}, p99 median {statistics.median(hit) if hit else float('nan'):.1f} us;"
        f" stalls per pass median {statistics.median(n for _, _, n, _ in rows)}"
    )
    junk = np.ones(64 << 20, np.int64)  # 512 MB: more than the box's caches hold for one process
    for pages in (1, None):
        warm, cold = flushed(lookup, hashed, pages, None), flushed(lookup, hashed, pages, junk)
        print(f"# {'1-page' if pages else 'whole'} lookup, median CPU us: warm {warm:.1f}, caches flushed {cold:.1f}")


if __name__ == "__main__":
    main()
