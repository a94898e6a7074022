"""Ordering what JetStream holds back into per-(source, dp_rank) engine order: Delivery and Reset.

Pure state, no NATS: fed with live messages and complete snapshots (in stream order), it delivers
batches by engine seq, drops duplicates (two bridges, redelivery, a dedup window that ran out),
waits a little for a batch stored out of order, turns a lasting gap into a Reset that the next
stored snapshot repairs, and a new epoch into a Reset plus a resync (snapshot, or seq 0).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from kvevents.errors import DecodeError
from kvevents.events import KVEventBatch, decode_batch
from kvevents.feed import Delivery, Reset, ResetReason

__all__ = ["LiveMsg", "Snapshot", "SnapshotAssembler", "StreamOrder"]

log = logging.getLogger("kvevents.jetstream")


@dataclass(slots=True)
class LiveMsg:
    """One stored live batch: who sent it, the engine seq and epoch, the bytes, where it sits."""

    source: str
    rank: int
    seq: int
    epoch: int | None
    payload: bytes
    stream_seq: int = 0
    received_at: float = 0.0
    subject: str = ""


@dataclass(slots=True)
class Snapshot:
    """A complete stored snapshot: the batches rebuilding (source, rank) as of engine seq `seq`."""

    source: str
    rank: int
    seq: int  # S: the last engine seq it covers (-1: nothing was published yet)
    epoch: int | None
    payloads: list[bytes]
    start: int  # stream seq from which the batches after S are stored
    stream_seq: int = 0  # where its end marker sits
    snap_id: str = ""


class SnapshotAssembler:
    """Collects snapshot parts by id; `add_end` returns the Snapshot once all its parts are in."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._parts: dict[str, dict[int, bytes]] = {}

    def add_part(self, snap_id: str, index: int, payload: bytes) -> None:
        parts = self._parts.setdefault(snap_id, {})
        parts[index] = payload
        while len(self._parts) > self.keep:  # abandoned snapshots (a bridge died mid-way)
            self._parts.pop(next(iter(self._parts)))

    def add_end(self, snap_id: str, count: int, meta: dict) -> Snapshot | None:
        parts = self._parts.pop(snap_id, {})
        if len(parts) != count or any(i not in parts for i in range(count)):
            return None  # parts purged or lost: not usable
        return Snapshot(payloads=[parts[i] for i in range(count)], snap_id=snap_id, **meta)


@dataclass(eq=False)
class _Stream:
    source: str
    rank: int
    epoch: int | None = None
    next_seq: int | None = None  # None: waiting for a snapshot (or seq 0) to start from
    reason: ResetReason = "first"  # why it waits
    dirty: bool = False  # delivered something since the last Reset
    pending: dict[int, LiveMsg] = field(default_factory=dict)
    gap_since: float | None = None
    waiting_since: float | None = None
    retired: set[int] = field(default_factory=set)
    spare: Snapshot | None = None  # the newest snapshot ahead of us, in case a gap follows
    last_heard: float | None = None


class StreamOrder:
    """The ordering rules; `clock` is injectable so tests step time instead of sleeping."""

    def __init__(
        self,
        *,
        reorder_wait_s: float = 2.0,
        resync_timeout_s: float = 60.0,
        max_pending: int = 100000,
        clock: Callable[[], float],
    ) -> None:
        self.reorder_wait_s = reorder_wait_s
        self.resync_timeout_s = resync_timeout_s
        self.max_pending = max_pending
        self.clock = clock
        self.start_anywhere = False  # a stream may start at the first seq seen (reading from a time, not a snapshot)
        self.counters: Counter[str] = Counter()
        self.streams: dict[tuple[str, int], _Stream] = {}
        self._out: list[Delivery | Reset] = []

    def take(self) -> list[Delivery | Reset]:
        out, self._out = self._out, []
        return out

    def _stream(self, source: str, rank: int) -> _Stream:
        st = self.streams.get((source, rank))
        if st is None:
            st = self.streams[(source, rank)] = _Stream(source, rank)
            st.waiting_since = self.clock()
        return st

    def resume(self, source: str, rank: int, epoch: int | None, next_seq: int) -> None:
        """Continue (source, rank) at `next_seq` (a recorder restarting on its own log): earlier seqs are duplicates."""
        st = self._stream(source, rank)
        st.epoch, st.next_seq, st.waiting_since, st.dirty = epoch, next_seq, None, True

    def lowest_pending_stream_seq(self) -> int | None:
        """The stream position of the oldest batch held back for ordering (None: nothing held)."""
        low = [m.stream_seq for st in self.streams.values() for m in st.pending.values()]
        return min(low) if low else None

    # ---------------------------------------------------------------- inputs
    def live(self, m: LiveMsg) -> None:
        st = self._stream(m.source, m.rank)
        st.last_heard = m.received_at or self.clock()
        if m.epoch is not None and m.epoch in st.retired:
            self.counters["stale_epoch"] += 1
            return
        if st.epoch is not None and m.epoch is not None and m.epoch != st.epoch:
            self._restart(st, m.epoch)
        elif st.epoch is None and m.epoch is not None:
            st.epoch = m.epoch
        elif (
            m.epoch is None
            and st.epoch is None
            and m.seq == 0
            and st.next_seq is not None
            and st.next_seq > 1
            and 0 not in st.pending
        ):
            self._restart(st, None)  # no epoch known: a stream starting over at 0 is a restart
        if st.next_seq is not None and m.seq < st.next_seq or m.seq in st.pending:
            self.counters["duplicates"] += 1
            return
        if len(st.pending) >= self.max_pending:
            self.counters["buffer_overflows"] += 1
            st.pending.clear()
        st.pending[m.seq] = m
        if st.next_seq is None:
            if 0 in st.pending:  # the engine's first batch: a clean start loses nothing
                st.next_seq = 0
                self.counters["clean_starts"] += 1
            elif self.start_anywhere and st.reason == "first" and not st.dirty:
                st.next_seq = m.seq
            elif st.spare is not None and self._fits(st, st.spare):
                return self._apply(st, st.spare)
            else:
                return
        self._drain(st)

    def snapshot(self, snap: Snapshot) -> None:
        st = self._stream(snap.source, snap.rank)
        if snap.epoch is not None and snap.epoch in st.retired:
            self.counters["stale_epoch"] += 1
            return
        if st.epoch is not None and snap.epoch is not None and snap.epoch != st.epoch:
            self._restart(st, snap.epoch)
        if st.next_seq is not None and snap.seq + 1 <= st.next_seq:
            self.counters["snapshots_behind"] += 1  # we are past it already
            return
        if st.next_seq is not None and not st.pending:
            st.spare = snap  # ahead of us: the batches up to S should still come; keep it for a gap
            return
        if self._fits(st, snap):
            self._apply(st, snap)
        else:
            st.spare = snap
            self.counters["snapshots_unusable"] += 1

    def tick(self) -> None:
        """Time-based rules: a gap that lasts becomes a Reset; a resync that never comes, a clean start."""
        now = self.clock()
        for st in self.streams.values():
            if (
                st.next_seq is not None
                and st.pending
                and st.gap_since is not None
                and now - st.gap_since >= self.reorder_wait_s
            ):
                self.counters["gaps"] += 1
                self._wait(st, "gap")
                if st.spare is not None and self._fits(st, st.spare):
                    self._apply(st, st.spare)
            elif (
                st.next_seq is None
                and st.pending
                and st.waiting_since is not None
                and now - st.waiting_since >= self.resync_timeout_s
            ):
                self.counters["losses"] += 1
                log.warning(
                    "%s rank %d: no snapshot within %.0fs, starting clean at seq %d (state lost)",
                    st.source,
                    st.rank,
                    self.resync_timeout_s,
                    min(st.pending),
                )
                st.next_seq = min(st.pending)
                self._drain(st)

    # ---------------------------------------------------------------- rules
    def _restart(self, st: _Stream, epoch: int | None) -> None:
        self.counters["restarts"] += 1
        if st.epoch is not None:
            st.retired.add(st.epoch)
        st.epoch = epoch
        st.pending = {k: v for k, v in st.pending.items() if v.epoch == epoch and epoch is not None}
        st.spare = None
        self._wait(st, "restart")

    def _wait(self, st: _Stream, reason: ResetReason) -> None:
        """Stop delivering (source, rank): its state is dropped now and rebuilt by a resync."""
        st.next_seq = None
        st.reason = reason
        st.gap_since = None
        st.waiting_since = self.clock()
        if st.dirty:
            self._reset(st)

    def _reset(self, st: _Stream) -> None:
        self.counters["resets"] += 1
        st.dirty = False
        self._out.append(Reset(st.source, st.rank, st.reason, st.epoch))

    def _fits(self, st: _Stream, snap: Snapshot) -> bool:
        """Can delivery go on from this snapshot: nothing missing between S and what is buffered?"""
        if st.next_seq is not None and snap.seq + 1 < st.next_seq:
            return False
        later = [s for s in st.pending if s > snap.seq]
        return not later or min(later) == snap.seq + 1

    def _apply(self, st: _Stream, snap: Snapshot) -> None:
        if st.next_seq is not None:  # a gap in progress that this snapshot closes
            st.reason = "gap"
            self.counters["gaps"] += 1
        if st.dirty:
            self._reset(st)
        batches: list[KVEventBatch] = []
        for p in snap.payloads:
            try:
                batches.append(decode_batch(p))
            except DecodeError as exc:
                self.counters["bad_payloads"] += 1
                log.warning("%s rank %d: undecodable snapshot part: %s", st.source, st.rank, exc)
                return
        now = self.clock()
        for p, b in zip(snap.payloads, batches):
            self._out.append(Delivery(st.source, snap.seq, b, p, "", "snapshot", st.rank, snap.epoch, "", now))
            self.counters["snapshot_batches"] += 1
        st.dirty = True
        if snap.epoch is not None:
            st.epoch = snap.epoch
        st.next_seq = snap.seq + 1
        st.spare = None
        st.waiting_since = None
        self.counters["snapshots_applied"] += 1
        self._drain(st)

    def _drain(self, st: _Stream) -> None:
        assert st.next_seq is not None
        pending = st.pending
        for s in [s for s in pending if s < st.next_seq]:
            del pending[s]
        while st.next_seq in pending:
            m = pending.pop(st.next_seq)
            try:
                batch = decode_batch(m.payload)
            except DecodeError as exc:
                self.counters["bad_payloads"] += 1
                log.warning("%s rank %d seq %d: undecodable payload: %s", st.source, st.rank, m.seq, exc)
            else:
                self._out.append(
                    Delivery(st.source, m.seq, batch, m.payload, "", "live", st.rank, m.epoch, m.subject, m.received_at)
                )
                self.counters["heartbeats" if not batch.events else "live"] += 1
                st.dirty = True
            st.next_seq += 1
        st.waiting_since = None
        if st.spare is not None and st.spare.seq + 1 <= st.next_seq:
            st.spare = None
        st.gap_since = (st.gap_since or self.clock()) if pending else None
