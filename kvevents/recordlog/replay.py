"""Replay helpers independent of the transport: selecting records and pacing them in time."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from kvevents.errors import DecodeError
from kvevents.events import KVEventBatch, decode_batch
from kvevents.recordlog.format import Record
from kvevents.recordlog.reader import Damage, RecordReader

__all__ = ["select_records", "count_records", "paced", "parse_speed", "apply_log", "ApplyResult"]


def parse_speed(text: str) -> float | None:
    """'max' -> None (no pacing), else a positive factor ('1', '10', '2.5', '10x')."""
    t = text.strip().lower()
    if t in ("max", "inf"):
        return None
    t = t[:-1] if t.endswith("x") else t
    try:
        v = float(t)
    except ValueError:
        raise ValueError(f"--speed must be a positive number or 'max', got {text!r}") from None
    if not v > 0:
        raise ValueError(f"--speed must be a positive number or 'max', got {text!r}")
    return v


def select_records(
    path: str | os.PathLike[str],
    *,
    from_seq: int | None = None,
    to_seq: int | None = None,
    kinds: Iterable[str] = ("live", "replay", "snapshot"),
    on_damage: Callable[[Damage], None] | None = None,
) -> Iterator[Record]:
    """Records of the given kinds whose seq is within [from_seq, to_seq] (bounds on recorded seqs;
    records without a seq, e.g. snapshots, pass only when no bound is set)."""
    want = frozenset(kinds)
    with RecordReader(path, on_damage=on_damage) as reader:
        for rec in reader:
            if rec.kind not in want:
                continue
            if from_seq is not None or to_seq is not None:
                if rec.seq is None or rec.kind == "snapshot":
                    continue
                if from_seq is not None and rec.seq < from_seq:
                    continue
                if to_seq is not None and rec.seq > to_seq:
                    continue
            yield rec


def count_records(path: str | os.PathLike[str], **kw: object) -> int:
    """How many records `select_records` would yield (a quiet first pass, for progress totals)."""
    return sum(1 for _ in select_records(path, on_damage=lambda d: None, **kw))  # type: ignore[arg-type,misc]


def paced(
    records: Iterable[Record],
    speed: float | None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[Record]:
    """Yield records keeping their recorded receive-time spacing divided by `speed` (None: no waits)."""
    t0_rec: float | None = None
    t0 = 0.0
    for rec in records:
        if speed is not None:
            if t0_rec is None:
                t0_rec, t0 = rec.recv_time, clock()
            else:
                due = t0 + max(0.0, rec.recv_time - t0_rec) / speed
                wait = due - clock()
                if wait > 0:
                    sleep(wait)
        yield rec


@dataclass
class ApplyResult:
    """What `apply_log` fed: records, resets, undecodable payloads, seconds."""

    records: int = 0
    batches: int = 0
    resets: int = 0
    decode_errors: int = 0
    seconds: float = 0.0


def apply_log(
    path: str | os.PathLike[str],
    apply: Callable[[str, KVEventBatch], Any],
    drop: Callable[[str, int | None], Any],
    *,
    on_damage: Callable[[Damage], None] | None = None,
) -> ApplyResult:
    """Feed every batch record to `apply(source, batch)` and every reset marker to
    `drop(source, dp_rank)`, in log order: the offline (warm-restart) rebuild of a consumer index."""
    res = ApplyResult()
    t0 = time.perf_counter()
    decode = decode_batch
    with RecordReader(path, on_damage=on_damage) as reader:
        for r in reader:
            if r.kind == "reset":
                res.resets += 1
                drop(r.source, r.dp_rank)
                continue
            try:
                batch = decode(r.payload)
            except DecodeError:
                res.decode_errors += 1
                continue
            apply(r.source, batch)
            res.batches += 1
        res.records = reader.records
    res.seconds = time.perf_counter() - t0
    return res
