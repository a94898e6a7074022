"""Shared builders for the record-log tests (no tests here): event streams and small logs."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvevents.hashing import Namespace, event_hashes, storage_hashes, to_int64
from kvevents.recordlog import RecordWriter
from tests.helpers.payloads import batch

PAGE = 4


def payload(events: list, ts: float = 1700000000.0, rank: int | None = 0, epoch: int | None = 7) -> bytes:
    """A recorded batch: a 2023 timestamp and epoch 7 unless told (tests.helpers.payloads.batch)."""
    return batch(events, ts=ts, rank=rank, epoch=epoch)


def chain_events(ns: Namespace, *, published: str = "event", seed: int = 0, n_chains: int = 3) -> list[list]:
    """Batches of a small cache-like stream: clear, heads, children, removes (leaf first).

    published="storage" publishes storage hashes (extra_key mixed in): the bug --verify catches.
    """
    rng = random.Random(seed)
    fn = event_hashes if published == "event" else storage_hashes
    batches: list[list] = [[AllBlocksCleared()]]
    for c in range(n_chains):
        head = [rng.randrange(50000) for _ in range(2 * PAGE)]
        tail = [rng.randrange(50000) for _ in range(3 * PAGE)]
        hx = fn(head, PAGE, ns)
        tx = fn(tail, PAGE, ns, prior=hx[-1])
        hi, ti = [to_int64(h) for h in hx], [to_int64(h) for h in tx]
        salt = ns.cache_salt
        batches.append([BlockStored(hi, None, head, PAGE, None, "GPU", None, salt)])
        batches.append([BlockStored(ti, hi[-1], tail, PAGE, None, "GPU", None, salt)])
        if c % 2 == 0:
            batches.append([BlockRemoved(ti[::-1][:1], "GPU")])
    return batches


def write_log(
    path: Path,
    batches: list[list],
    *,
    source: str = "w0",
    start_seq: int = 0,
    t0: float = 1000.0,
    dt: float = 0.01,
    rank: int | None = 0,
) -> list[bytes]:
    """Write batches as live records with consecutive seqs; returns the payloads."""
    out = []
    with RecordWriter(path) as w:
        for i, evs in enumerate(batches):
            p = payload(evs, ts=t0 + i * dt, rank=rank)
            out.append(p)
            w.write(
                p,
                source=source,
                endpoint="tcp://127.0.0.1:5557",
                seq=start_seq + i,
                epoch=7,
                dp_rank=rank,
                recv_time=t0 + i * dt,
            )
    return out


def heartbeat_when_short(pub: Any, rec: Any, want: int, ticks: list[int]) -> Callable[[int], None]:
    """A LiveRecording.wait on_tick standing in for the idle heartbeats a test's publisher has
    turned off: a PUB socket drops what it sends before the subscription reaches it, and only a
    later sequence number shows the subscriber the gap (which it then replays). Every 0.5 s that
    the recorder `rec` is short of `want` batches, one empty batch goes out."""

    def tick(batches: int) -> None:
        ticks.append(batches)
        if batches < want and len(ticks) % 5 == 0:
            pub.publish([])

    return tick
