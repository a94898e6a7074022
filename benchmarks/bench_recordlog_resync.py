"""Resync benchmark: reading past a region of false sync markers grows linearly with its size.

    python benchmarks/bench_recordlog_resync.py                  # regions of 1, 2, 4, 8 MB
    python benchmarks/bench_recordlog_resync.py --sizes 1,6

Each region is back-to-back 12-byte frames (sync marker, CRC, length) between good records;
"half" frames claim half the region (as many fit in the file as not: the worst case of a direct
CRC per claim, quadratic), "random" frames claim 5 KB..2 MB each. Target (issue 28): linear,
i.e. seconds per MB about flat as the region grows, and the good records all found.
"""

from __future__ import annotations

import argparse
import os
import random
import struct
import sys
import tempfile
import time

from kvevents.recordlog import RecordReader
from kvevents.recordlog.format import HEADER_BYTES, SYNC, encode_record

MB = 1 << 20


def build(path: str, region: int, pattern: str) -> int:
    """Write good records, the false-marker region, good records; return the good record count."""
    rng = random.Random(1)
    good = [encode_record(1.7e9, "w0", "e", "t", i, 1, 0, "live", bytes(200)) for i in range(20)]
    n = region // 12
    if pattern == "half":
        frames = (SYNC + struct.pack("<II", 0, region // 2)) * n
    else:
        frames = b"".join(SYNC + struct.pack("<II", 0, rng.randrange(5000, 2 * MB)) for _ in range(n))
    with open(path, "wb") as f:
        f.write(HEADER_BYTES + b"".join(good[:10]) + frames + b"".join(good[10:]) + bytes(2 * MB))
    return len(good)


def read_s(path: str, want: int) -> float:
    t0 = time.perf_counter()
    got = sum(1 for _ in RecordReader(path, on_damage=lambda d: None))
    el = time.perf_counter() - t0
    if got != want:
        raise SystemExit(f"read {got} good records, expected {want}")
    return el


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,2,4,8", help="region sizes in MB, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="best of N reads per size")
    args = ap.parse_args(argv)
    sizes = [float(x) for x in args.sizes.split(",")]
    path = os.path.join(tempfile.mkdtemp(), "resync.kvlog")
    linear = True
    for pattern in ("half", "random"):
        first = None
        for mb in sizes:
            want = build(path, int(mb * MB), pattern)
            best = min(read_s(path, want) for _ in range(args.repeat))
            per = best / mb
            first = per if first is None else first
            linear &= per < 2.0 * first
            print(f"{pattern:6s} region {mb:4g} MB: {best:6.3f} s  ({per:.3f} s/MB, x{per / first:.2f} of the first)")
    os.remove(path)
    print(f"seconds per MB flat within 2x across sizes: {'met' if linear else 'MISSED'}")
    return 0 if linear else 1


if __name__ == "__main__":
    sys.exit(main())
