"""`log inspect` analysis: counts by kind, event type, medium and source; seq gaps; epochs; rates.

Rates are over the batches' own timestamps (`ts`, the publisher's clock) of the live and replayed
batches: a capture that starts with replayed history or a snapshot would otherwise show the
history as if it had arrived in the capture's first second. A log without usable batch
timestamps falls back to receive time (`rate_clock` says which).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from kvevents.errors import DecodeError
from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch
from kvevents.recordlog.format import Record
from kvevents.recordlog.reader import Damage, feed_log

__all__ = ["SeqTracker", "SourceStats", "LogStats", "StatsCollector", "inspect_log"]

MAX_LISTED = 1000  # gaps / epoch changes / decode errors kept for display (all are counted)


class SeqTracker:
    """Seq continuity per (source, dp_rank) over live/replay records; resets restart tracking.

    `observe` returns None when continuous, else a tuple (what, previous_seq) where what is
    "gap", "duplicate", "backwards" or "epoch".
    """

    def __init__(self) -> None:
        self.last: dict[tuple[str, Any], tuple[int, Any]] = {}

    def reset(self, source: str, dp_rank: int | None) -> None:
        for key in [k for k in self.last if k[0] == source and (dp_rank is None or k[1] == dp_rank)]:
            del self.last[key]

    def resume(self, source: str, dp_rank: int | None, seq: int, epoch: int | None) -> None:
        """A snapshot reflecting seqs <= `seq`: the next live seq expected is seq + 1."""
        self.last[(source, dp_rank)] = (seq, epoch)

    def observe(self, source: str, dp_rank: int | None, seq: int, epoch: int | None) -> tuple[str, int] | None:
        key = (source, dp_rank)
        prev = self.last.get(key)
        self.last[key] = (seq, epoch)
        if prev is None:
            return None
        pseq, pepoch = prev
        if epoch != pepoch and epoch is not None and pepoch is not None:
            return ("epoch", pseq)
        if seq == pseq + 1:
            return None
        if seq > pseq + 1:
            return ("gap", pseq)
        if seq == pseq:
            return ("duplicate", pseq)
        return ("backwards", pseq)


@dataclass
class SourceStats:
    """Per-source counters."""

    records: int = 0
    events: int = 0
    heartbeats: int = 0
    stored_blocks: int = 0
    removed_blocks: int = 0
    clears: int = 0
    resets: int = 0
    gaps: int = 0
    missing_seqs: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    endpoints: set[str] = field(default_factory=set)
    topics: set[str] = field(default_factory=set)
    dp_ranks: set[Any] = field(default_factory=set)
    epochs: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for k in ("endpoints", "topics"):
            d[k] = sorted(d[k])
        d["dp_ranks"] = sorted(d["dp_ranks"], key=lambda r: (r is None, r if r is not None else 0))
        return d


@dataclass
class LogStats:
    """Everything `log inspect` reports; `as_dict()` is the --json form."""

    path: str
    size: int = 0
    records: int = 0
    payload_bytes: int = 0
    kinds: Counter = field(default_factory=Counter)
    event_types: Counter = field(default_factory=Counter)
    blocks: Counter = field(default_factory=Counter)  # "stored"/"removed" -> block count
    media: dict[str, Counter] = field(default_factory=dict)  # medium -> stored/removed blocks+events
    sources: dict[str, SourceStats] = field(default_factory=dict)
    decode_errors: int = 0
    decode_error_list: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[dict[str, Any]] = field(default_factory=list)
    seq_anomalies: list[dict[str, Any]] = field(default_factory=list)
    epoch_changes: list[dict[str, Any]] = field(default_factory=list)
    resets: list[dict[str, Any]] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)
    first_time: float | None = None  # receive time (recv_time) of the first and last records
    last_time: float | None = None
    first_ts: float | None = None  # batch timestamps of the live and replayed batches
    last_ts: float | None = None
    stream: Counter = field(default_factory=Counter)  # live + replayed: records, events, blocks, bytes

    @property
    def duration_s(self) -> float:
        """Receive-time span of the capture."""
        if self.first_time is None or self.last_time is None:
            return 0.0
        return max(0.0, self.last_time - self.first_time)

    @property
    def batch_span_s(self) -> float:
        """Span of the live and replayed batches' own timestamps."""
        if self.first_ts is None or self.last_ts is None:
            return 0.0
        return max(0.0, self.last_ts - self.first_ts)

    @property
    def rate_clock(self) -> str:
        """ "batch_ts" when the batches' timestamps span time, else "recv_time"."""
        return "batch_ts" if self.batch_span_s > 0 else "recv_time"

    def rates(self) -> dict[str, float]:
        """Per second of batch time over live and replayed batches (snapshots are state, not traffic);
        over receive time and every record when the batch timestamps do not span any time."""
        if self.rate_clock == "batch_ts":
            d = self.batch_span_s
            n = self.stream
            counts = (n["records"], n["events"], n["blocks"], n["bytes"])
        else:
            d = self.duration_s
            counts = (self.records, sum(self.event_types.values()), sum(self.blocks.values()), self.payload_bytes)
        if d <= 0:
            return {"records_per_s": 0.0, "events_per_s": 0.0, "blocks_per_s": 0.0, "bytes_per_s": 0.0}
        return {k: v / d for k, v in zip(("records_per_s", "events_per_s", "blocks_per_s", "bytes_per_s"), counts)}

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "records": self.records,
            "payload_bytes": self.payload_bytes,
            "kinds": dict(self.kinds),
            "event_types": dict(self.event_types),
            "blocks": dict(self.blocks),
            "media": {m: dict(c) for m, c in self.media.items()},
            "sources": {s: st.as_dict() for s, st in self.sources.items()},
            "decode_errors": self.decode_errors,
            "decode_error_list": self.decode_error_list,
            "gaps": self.gaps,
            "seq_anomalies": self.seq_anomalies,
            "epoch_changes": self.epoch_changes,
            "resets": self.resets,
            "damage": [d.as_dict() for d in self.damage],
            "first_time": self.first_time,
            "last_time": self.last_time,
            "duration_s": self.duration_s,
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
            "batch_span_s": self.batch_span_s,
            "rate_clock": self.rate_clock,
            "rates": self.rates(),
        }


def _add(lst: list[dict[str, Any]], item: dict[str, Any]) -> None:
    if len(lst) < MAX_LISTED:
        lst.append(item)


def _medium_key(m: str | None) -> str:
    return "(none)" if m is None else m


class StatsCollector:
    """Feed records in log order; `stats` is the LogStats so far (lets one pass also verify)."""

    def __init__(self, path: str = "", size: int = 0) -> None:
        self.stats = LogStats(path, size=size)
        self._seqs = SeqTracker()

    def feed(self, rec: Record) -> None:
        _account(self.stats, self._seqs, rec)


def inspect_log(path: str | os.PathLike[str], *, on_damage: Callable[[Damage], None] | None = None) -> LogStats:
    """Stream the log once and gather LogStats (damage is skipped, reported and listed)."""
    col = StatsCollector()
    reader = feed_log(path, col.feed, on_damage=on_damage)
    col.stats.path, col.stats.size, col.stats.damage = reader.path, reader.size, list(reader.damage)
    return col.stats


def _account(st: LogStats, seqs: SeqTracker, rec: Record) -> None:
    st.records += 1
    st.kinds[rec.kind] += 1
    if st.first_time is None or rec.recv_time < st.first_time:
        st.first_time = rec.recv_time
    if st.last_time is None or rec.recv_time > st.last_time:
        st.last_time = rec.recv_time
    src = st.sources.get(rec.source)
    if src is None:
        src = st.sources[rec.source] = SourceStats()
    src.records += 1
    src.endpoints.add(rec.endpoint)
    if rec.kind == "reset":
        src.resets += 1
        seqs.reset(rec.source, rec.dp_rank)
        _add(st.resets, {"record": rec.index, "source": rec.source, "dp_rank": rec.dp_rank, "reason": rec.reason})
        return
    src.topics.add(rec.topic)
    st.payload_bytes += len(rec.payload)
    try:
        batch = decode_batch(rec.payload)
    except DecodeError as exc:
        st.decode_errors += 1
        _add(st.decode_error_list, {"record": rec.index, "source": rec.source, "seq": rec.seq, "error": str(exc)})
        return
    rank = batch.data_parallel_rank if batch.data_parallel_rank is not None else rec.dp_rank
    epoch = batch.epoch if batch.epoch is not None else rec.epoch
    src.dp_ranks.add(rank)
    if epoch is not None and epoch not in src.epochs:
        src.epochs.append(epoch)
    if rec.kind == "snapshot" and rec.seq is not None:
        seqs.resume(rec.source, rank, rec.seq, epoch)
    elif rec.kind in ("live", "replay") and rec.seq is not None:
        _seq_account(st, src, seqs, rec, rec.seq, rank, epoch)
    if rec.kind in ("live", "replay"):
        _stream_account(st, rec, batch)
    _events_account(st, src, batch)


def _seq_account(
    st: LogStats, src: SourceStats, seqs: SeqTracker, rec: Record, seq: int, rank: Any, epoch: Any
) -> None:
    """A live or replayed batch's seq: first / last, and a gap, epoch change or odd seq if any."""
    if src.first_seq is None:
        src.first_seq = seq
    src.last_seq = seq
    bad = seqs.observe(rec.source, rank, seq, epoch)
    if bad is None:
        return
    what, prev = bad
    item = {"record": rec.index, "source": rec.source, "dp_rank": rank, "after": prev, "seq": seq}
    if what == "gap":
        src.gaps += 1
        src.missing_seqs += seq - prev - 1
        _add(st.gaps, dict(item, missing=seq - prev - 1))
    elif what == "epoch":
        _add(st.epoch_changes, dict(item, epoch=epoch))
    else:
        _add(st.seq_anomalies, dict(item, what=what))


def _events_account(st: LogStats, src: SourceStats, batch: Any) -> None:
    """A batch's events by type, blocks stored / removed (by medium), clears, or a heartbeat."""
    if not batch.events:
        src.heartbeats += 1
    for ev in batch.events:
        name = type(ev).__name__
        st.event_types[name] += 1
        src.events += 1
        if isinstance(ev, (BlockStored, BlockRemoved)):
            what = "stored" if isinstance(ev, BlockStored) else "removed"
            n = len(ev.block_hashes)
            st.blocks[what] += n
            if what == "stored":
                src.stored_blocks += n
            else:
                src.removed_blocks += n
            m = st.media.setdefault(_medium_key(ev.medium), Counter())
            m[f"{what}_events"] += 1
            m[f"{what}_blocks"] += n
        elif isinstance(ev, AllBlocksCleared):
            src.clears += 1


def _stream_account(st: LogStats, rec: Record, batch: Any) -> None:
    """Batch-time span and traffic counts of one live or replayed batch."""
    ts = batch.ts
    if isinstance(ts, (int, float)) and not isinstance(ts, bool) and ts == ts and abs(ts) != float("inf"):
        if st.first_ts is None or ts < st.first_ts:
            st.first_ts = float(ts)
        if st.last_ts is None or ts > st.last_ts:
            st.last_ts = float(ts)
    n = st.stream
    n["records"] += 1
    n["bytes"] += len(rec.payload)
    n["events"] += len(batch.events)
    n["blocks"] += sum(len(ev.block_hashes) for ev in batch.events if isinstance(ev, (BlockStored, BlockRemoved)))
