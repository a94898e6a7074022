"""Recording deliveries from a Subscriber into a log (duck-typed: no transport import here)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Literal, Sequence

from kvevents.errors import DecodeError
from kvevents.events import decode_batch
from kvevents.recordlog.format import BadRecordError
from kvevents.recordlog.writer import RecordWriter

__all__ = ["Recorder", "StartMode", "START_MODES"]

StartMode = Literal["snapshot", "oldest", "now"]
START_MODES: tuple[str, ...] = ("snapshot", "oldest", "now")


class Recorder:
    """Callbacks for a Subscriber: `on_delivery` writes a batch record, `on_reset` a reset marker.

    The subscriber hands deliveries over in repaired order (replayed gaps filled in seq order,
    resyncs as a Reset then "snapshot" deliveries), so the log keeps exactly that order.
    `done` is set once `count` batch records (heartbeats included) have been written.

    `start` says where the log begins (the subscriber itself replays a joined stream from its
    oldest kept batch):
    - "oldest": everything the subscriber delivers (the publisher's kept history first);
    - "now": per (source, dp_rank), nothing before its first live batch (a kvevents Subscriber
      built with start="now" delivers nothing before it: this filter then only guards other feeds);
    - "snapshot": a source given to `begin_with_snapshot` starts with a reset marker and the
      snapshot, then only batches after the snapshot's seq S; other sources behave as "oldest".
    Call stop() before closing the writer (it writes a snapshot still held).
    A delivery that cannot be stored (a topic over 65,535 bytes...) is counted in `skipped` and
    left out; only a failing write (disk full, closed writer) stops recording (`error`).
    """

    def __init__(self, writer: RecordWriter, *, count: int | None = None, start: StartMode = "oldest") -> None:
        if start not in START_MODES:
            raise ValueError(f"start must be one of {', '.join(START_MODES)}, got {start!r}")
        self.writer = writer
        self.count = count
        self.start = start
        self.batches = 0
        self.resets = 0
        self.snapshot_batches = 0  # written by begin_with_snapshot (not part of `count`)
        self.snapshots_taken = 0  # begin_with_snapshot calls (a publisher answered)
        self.received = 0  # deliveries and resets handed over, written or not
        self.history_dropped = 0  # left out because they precede the chosen start
        self.skipped = 0  # could not be stored (see skip_reason)
        self.skip_reason: str | None = None  # the first one
        self.written: Counter[str] = Counter()  # records written, by kind (live, replay, snapshot, reset)
        self.done = threading.Event()
        self.error: Exception | None = None  # a failed write (disk full...): recording stops, done is set
        self._lock = threading.Lock()
        self._live: set[tuple[str, Any]] = set()  # "now": streams whose first live batch was seen
        self._after: dict[str, tuple[int, int | None]] = {}  # "snapshot": source -> (S, epoch)
        self._pending: dict[str, tuple[list[bytes], list[tuple[Any, Any]], int, str, str]] = {}  # held snapshots

    def stop(self) -> None:
        """Write any snapshot still held, then nothing more (waits for a write in progress)."""
        with self._lock:
            if not self.done.is_set():
                for source in list(self._pending):
                    self._write_pending(source)
            self.done.set()

    def _fail(self, exc: Exception) -> None:
        self.error = exc
        self.done.set()

    def _skip(self, exc: Exception) -> None:
        self.skipped += 1
        if self.skip_reason is None:
            self.skip_reason = str(exc)

    def begin_with_snapshot(
        self, source: str, payloads: Sequence[bytes], seq: int | None, *, endpoint: str = "", topic: str = ""
    ) -> int:
        """Start `source` with a reset marker and its publisher's KVE/SNAPSHOT batches (reflecting seqs
        <= `seq`); its later deliveries with seq <= `seq` are left out. The snapshot is written just
        before the first delivery kept (or at stop()); if the subscriber resyncs `source` first (a
        Reset, then its own snapshot), this one is dropped, so a log holds one starting state.
        `seq` None (nothing published yet) keeps nothing: the stream from seq 0 is the whole state.
        Returns the number of snapshot batches held."""
        metas: list[tuple[Any, Any]] = []
        for p in payloads:
            try:
                b = decode_batch(p)
                metas.append((b.epoch, b.data_parallel_rank))
            except DecodeError:
                metas.append((None, None))
        with self._lock:
            self.snapshots_taken += 1
            if self.done.is_set() or seq is None:
                return 0
            self._pending[source] = (list(payloads), metas, seq, endpoint, topic)
            self._after[source] = (seq, metas[0][0] if metas else None)
            return len(payloads)

    def _write_pending(self, source: str) -> None:
        """Write the snapshot held for `source` (under the lock)."""
        held = self._pending.pop(source, None)
        if held is None:
            return
        payloads, metas, seq, endpoint, topic = held
        try:
            self.writer.write_reset(
                source=source, reason="first", endpoint=endpoint, dp_rank=metas[0][1] if metas else None
            )
            self.resets += 1
            self.written["reset"] += 1
            for p, (e, r) in zip(payloads, metas):
                self.writer.write(
                    p, source=source, endpoint=endpoint, topic=topic, seq=seq, epoch=e, dp_rank=r, kind="snapshot"
                )
                self.snapshot_batches += 1
                self.written["snapshot"] += 1
        except BadRecordError as exc:
            self._skip(exc)
        except (OSError, ValueError) as exc:
            self._fail(exc)

    def _before_start(self, d: Any, rank: Any, epoch: Any) -> bool:
        """Does this delivery precede where the log starts (and so stays out)?"""
        source, kind = str(d.source), str(getattr(d, "kind", "live") or "live")
        if self.start == "now":
            if kind == "live":
                self._live.add((source, rank))
            return (source, rank) not in self._live
        after = self._after.get(source)
        if after is None:
            return False
        seq, snap_epoch = after
        d_seq = getattr(d, "seq", None)
        if (
            kind == "snapshot"
            or (epoch is not None and snap_epoch is not None and epoch != snap_epoch)
            or d_seq is None
            or d_seq > seq
        ):
            del self._after[source]  # past the snapshot (or another epoch): keep everything from here
            self._write_pending(source)
            return False
        return True

    def on_delivery(self, d: Any) -> None:
        with self._lock:
            if self.done.is_set():
                return
            self.received += 1
            batch = getattr(d, "batch", None)
            epoch = getattr(d, "epoch", None)
            if epoch is None and batch is not None:
                epoch = batch.epoch
            rank = getattr(d, "dp_rank", None)
            if rank is None and batch is not None:
                rank = batch.data_parallel_rank
            if self._before_start(d, rank, epoch):
                self.history_dropped += 1
                return
            try:
                self.writer.write(
                    d.payload,
                    source=str(d.source),
                    endpoint=str(getattr(d, "endpoint", "") or ""),
                    topic=str(getattr(d, "topic", "") or ""),
                    seq=getattr(d, "seq", None),
                    epoch=epoch,
                    dp_rank=rank,
                    kind=str(getattr(d, "kind", "live") or "live"),
                    recv_time=getattr(d, "received_at", None) or time.time(),
                )
            except BadRecordError as exc:
                return self._skip(exc)
            except (OSError, ValueError) as exc:
                return self._fail(exc)
            self.batches += 1
            self.written[str(getattr(d, "kind", "live") or "live")] += 1
            if self.count is not None and self.batches >= self.count:
                self.done.set()

    def on_reset(self, r: Any) -> None:
        with self._lock:
            if self.done.is_set():
                return
            self.received += 1
            source, rank = str(r.source), getattr(r, "dp_rank", None)
            if self.start == "now" and (source, rank) not in self._live:
                self.history_dropped += 1
                return
            self._after.pop(source, None)  # the subscriber resyncs: everything after it is kept,
            self._pending.pop(source, None)  # and its own snapshot replaces the one held
            try:
                self.writer.write_reset(source=source, reason=str(getattr(r, "reason", "") or ""), dp_rank=rank)
            except BadRecordError as exc:
                return self._skip(exc)
            except (OSError, ValueError) as exc:
                return self._fail(exc)
            self.resets += 1
            self.written["reset"] += 1
