"""Record log benchmark: write and read MB/s, and the `log index` rebuild of a large log.

    python benchmarks/bench_recordlog.py                 # defaults: 1M block copies, page 16
    python benchmarks/bench_recordlog.py --blocks 200000 --keep /tmp/big.kvlog

Target (issue 6): rebuilding a BlockIndex from a 1M-block-copy log in under 5 s.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings

from kvevents.events import AllBlocksCleared, BatchEncoder, BlockRemoved, BlockStored
from kvevents.recordlog import RecordReader, RecordWriter, apply_log


def build_payloads(blocks: int, page: int, per_batch: int, workers: int, seed: int) -> list[tuple[str, bytes]]:
    """(source, payload) pairs: chains of `per_batch` blocks per BlockStored, ~5% removed again."""
    rng = random.Random(seed)
    enc = BatchEncoder("map")
    out: list[tuple[str, bytes]] = [(f"w{w}", enc.encode(0.0, [AllBlocksCleared()], 0, 1)) for w in range(workers)]
    made = 0
    ts = 1.7e9
    while made < blocks:
        w = rng.randrange(workers)
        n = min(per_batch, blocks - made)
        hashes = [rng.getrandbits(64) - 2**63 for _ in range(n)]
        tokens = [rng.randrange(150000) for _ in range(n * page)]
        events: list = [BlockStored(hashes, None, tokens, page, None, "GPU", None)]
        if rng.random() < 0.05:
            events.append(BlockRemoved(hashes[-max(1, n // 10) :], "GPU"))
        ts += 0.01
        out.append((f"w{w}", enc.encode(ts, events, 0, 1)))
        made += n
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=1_000_000, help="block copies stored in the log")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--per-batch", type=int, default=64, help="blocks per BlockStored event (one batch)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--keep", help="write the log here and keep it (default: a temp file, removed)")
    args = ap.parse_args(argv)
    payloads = build_payloads(args.blocks, args.page_size, args.per_batch, args.workers, 1)
    total = sum(len(p) for _, p in payloads)
    path = args.keep or os.path.join(tempfile.mkdtemp(), "bench.kvlog")
    print(f"{len(payloads)} batches, {args.blocks} block copies, {total / 1e6:.1f} MB of payload")

    for durability in ("flush", "buffered"):
        t0 = time.perf_counter()
        with RecordWriter(path, durability=durability) as w:
            for i, (src, p) in enumerate(payloads):
                w.write(p, source=src, endpoint="tcp://10.0.0.1:5557", seq=i, epoch=1, dp_rank=0, recv_time=1.7e9 + i)
        el = time.perf_counter() - t0
        size = os.path.getsize(path)
        print(f"write ({durability:8s}): {size / 1e6 / el:8.1f} MB/s  {len(payloads) / el:10.0f} records/s")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t0 = time.perf_counter()
        n = 0
        for rec in RecordReader(path):
            n += len(rec.payload) > 0
        el = time.perf_counter() - t0
    print(f"read (CRC checked):  {size / 1e6 / el:8.1f} MB/s  {n / el:10.0f} records/s")

    del payloads  # the rebuild runs as in a fresh router process, not beside 1M generated objects
    gc.collect()
    from kvevents.consumers.indexer import BlockIndex

    index = BlockIndex()
    res = apply_log(path, index.apply, lambda s, r: index.drop_source(s, r))
    ok = res.seconds < 5.0
    print(
        f"log index rebuild: {res.seconds:.2f} s for {res.batches} batches, {args.blocks} stored copies "
        f"({len(index)} live after removes): {args.blocks / res.seconds / 1e6:.2f} M copies/s "
        f"[target < 5 s: {'met' if ok else 'MISSED'}]"
    )
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "kvevents", "log", "index", path, "--json"], capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    inner = json.loads(r.stdout)["seconds"] if r.returncode == 0 else float("nan")
    print(f"`kvevents log index FILE`: {wall:.2f} s wall (process start included), {inner:.2f} s rebuild")
    if not args.keep:
        os.remove(path)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
