"""Ordering what JetStream holds back into per-(source, dp_rank) engine order: Delivery and Reset.

Pure state, no NATS: fed with live messages and complete snapshots (in stream order, already
authenticated by the feed), it delivers batches by engine seq, drops duplicates (two bridges,
redelivery, a dedup window that ran out), waits a little for a batch stored out of order, turns a
stall (nothing deliverable for `reorder_wait_s` while later batches wait) into a Reset that the
next stored snapshot repairs, and a new epoch into a Reset plus a resync (snapshot, or seq 0).

It also distrusts what it is fed (issue 28):
- a second message for a delivered (epoch, seq) with other bytes is a conflict: counted, Reset,
  and a resync from a snapshot that covers that seq;
- a stored snapshot behind the stream is compared with the state delivered at its seq
  (anti-entropy, `integrity.SeqLedger`); a difference is repaired from that snapshot, and the
  batches after it are read again from the stream (`take_refills`);
- a new epoch is only a candidate until the current one has been quiet for `reorder_wait_s`, so
  a stray message of another epoch cannot blind a live stream;
- a batch far ahead of a stream that keeps moving is dropped after `reorder_wait_s`, never turned
  into a gap; a position far ahead of batches that will not reach it is given up;
- sources per stream and dp ranks per source are bounded.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from kvevents.errors import DecodeError
from kvevents.events import KVEventBatch, decode_batch
from kvevents.feed import Delivery, Reset, ResetReason
from kvevents.jetstream.integrity import SeqLedger, payload_digest, state_digest
from kvevents.jetstream.stored import LiveMsg, Refill, Snapshot, SnapshotAssembler, SnapshotRefused

__all__ = ["LiveMsg", "Refill", "Snapshot", "SnapshotAssembler", "SnapshotRefused", "StreamOrder"]

log = logging.getLogger("kvevents.jetstream")


@dataclass(eq=False)
class _Stream:
    source: str
    rank: int
    epoch: int | None = None
    next_seq: int | None = None  # None: waiting for a snapshot (or seq 0) to start from
    reason: ResetReason = "first"  # why it waits
    dirty: bool = False  # delivered something since the last Reset
    pending: dict[int, LiveMsg] = field(default_factory=dict)
    gap_since: float | None = None  # since when batches wait and the stream has not moved
    moved_at: float = 0.0  # when it last delivered
    behind: tuple[float, int] | None = None  # (when, seq) of the first batch far behind a stalled position
    waiting_since: float | None = None
    retired: set[int] = field(default_factory=set)
    spare: Snapshot | None = None  # the newest snapshot ahead of us: compared when reached, or used for a gap
    last_heard: float | None = None
    ledger: SeqLedger = field(default_factory=SeqLedger)
    need_seq: int = -1  # a resync snapshot must cover at least this seq (after a conflict)
    alive_at: float = 0.0  # when a new batch of the current epoch last came
    refill_since: float | None = None  # a Refill is out: gaps wait for it (up to resync_timeout_s)
    cand_epoch: int | None = None  # another epoch seen: adopted once the current one is quiet
    cand_since: float = 0.0
    cand_pending: dict[int, LiveMsg] = field(default_factory=dict)
    cand_snap: Snapshot | None = None


class StreamOrder:
    """The ordering rules; `clock` is injectable so tests step time instead of sleeping."""

    def __init__(
        self,
        *,
        reorder_wait_s: float = 2.0,
        resync_timeout_s: float = 60.0,
        max_pending: int = 100000,
        max_sources: int = 4096,
        max_ranks: int = 64,
        far_ahead: int = 1024,
        ledger_window: int = 4096,
        clock: Callable[[], float],
    ) -> None:
        for name, v in (("max_sources", max_sources), ("max_ranks", max_ranks), ("ledger_window", ledger_window)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        self.reorder_wait_s = reorder_wait_s
        self.resync_timeout_s = resync_timeout_s
        self.max_pending = max_pending
        self.max_sources = max_sources
        self.max_ranks = max_ranks
        self.far_ahead = far_ahead
        self.ledger_window = ledger_window
        self.clock = clock
        self.start_anywhere = False  # a stream may start at the first seq seen (reading from a time, not a snapshot)
        # reading what was stored before the consumer started: old batches of a source whose snapshot
        # is newer than where the read began are expected then, and prove nothing against its position
        self.catching_up = False
        self.counters: Counter[str] = Counter()
        self.streams: dict[tuple[str, int], _Stream] = {}
        self._ranks: Counter[str] = Counter()  # source -> dp ranks tracked
        self._out: list[Delivery | Reset] = []
        self._refills: list[Refill] = []

    def take(self) -> list[Delivery | Reset]:
        out, self._out = self._out, []
        return out

    def take_refills(self) -> list[Refill]:
        """The re-reads repairs asked for since the last call (the feed runs them, then `refilled`)."""
        out, self._refills = self._refills, []
        return out

    def _stream(self, source: str, rank: int) -> _Stream | None:
        """The stream of (source, rank), made on first use; None (counted) past max_sources / max_ranks."""
        st = self.streams.get((source, rank))
        if st is None:
            n = self._ranks[source]
            if n == 0 and len(self._ranks) >= self.max_sources:
                self._refuse("sources_refused", f"source {source}: more than {self.max_sources} sources")
                return None
            if n >= self.max_ranks:
                self._refuse("ranks_refused", f"source {source}: more than {self.max_ranks} dp ranks")
                return None
            self._ranks[source] = n + 1
            st = self.streams[(source, rank)] = _Stream(source, rank, ledger=SeqLedger(self.ledger_window))
            st.waiting_since = self.clock()
        return st

    def _refuse(self, counter: str, why: str) -> None:
        n = self.counters[counter] = self.counters[counter] + 1
        if n % 1000 == 1:
            log.warning("%s: its messages are dropped (%d %s so far)", why, n, counter)

    def resume(self, source: str, rank: int, epoch: int | None, next_seq: int) -> None:
        """Continue (source, rank) at `next_seq` (a recorder restarting on its own log): earlier seqs are duplicates."""
        st = self._stream(source, rank)
        if st is None:
            return
        st.epoch, st.next_seq, st.waiting_since, st.dirty = epoch, next_seq, None, True
        st.moved_at = self.clock()
        st.ledger.restart(next_seq - 1, None)

    def lowest_pending_stream_seq(self) -> int | None:
        """The stream position of the oldest batch held back for ordering (None: nothing held)."""
        low = [m.stream_seq for st in self.streams.values() for p in (st.pending, st.cand_pending) for m in p.values()]
        return min(low) if low else None

    # ---------------------------------------------------------------- inputs
    def live(self, m: LiveMsg) -> None:
        st = self._stream(m.source, m.rank)
        if st is None:
            return
        m.received_at = st.last_heard = m.received_at or self.clock()
        if m.epoch is not None and m.epoch in st.retired:
            self.counters["stale_epoch"] += 1
            return
        if st.epoch is not None and m.epoch is not None and m.epoch != st.epoch:
            return self._candidate(st, m.epoch, live=m)
        if st.epoch is None and m.epoch is not None:
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
        self._place(st, m)

    def snapshot(self, snap: Snapshot) -> None:
        st = self._stream(snap.source, snap.rank)
        if st is None:
            return
        if snap.epoch is not None and snap.epoch in st.retired:
            self.counters["stale_epoch"] += 1
            return
        if st.epoch is not None and snap.epoch is not None and snap.epoch != st.epoch:
            return self._candidate(st, snap.epoch, snap=snap)
        if st.next_seq is not None and snap.seq + 1 <= st.next_seq:
            self.counters["snapshots_behind"] += 1  # we are past it already: does our state agree?
            self._compare(st, snap)
            return
        if st.next_seq is not None and not st.pending:
            st.spare = snap  # ahead of us: the batches up to S should still come; compared then, or used for a gap
            return
        if snap.seq >= st.need_seq and self._fits(st, snap):
            self._apply(st, snap)
        else:
            st.spare = snap
            self.counters["snapshots_unusable"] += 1

    def refilled(self, source: str, rank: int) -> None:
        """The re-read asked for by a Refill is in: a gap that remains is a gap again."""
        st = self.streams.get((source, rank))
        if st is not None:
            st.refill_since = None
            if st.next_seq is not None and st.pending and st.next_seq not in st.pending:
                st.gap_since = self.clock()

    def tick(self) -> None:
        """Time-based rules: adopt a quiet stream's new epoch; a stall that lasts becomes a Reset; a
        batch far ahead of a moving stream goes; a resync that never comes, a clean start."""
        now = self.clock()
        for st in list(self.streams.values()):
            if st.cand_epoch is not None:
                self._maybe_adopt(st, now)
            refilling = st.refill_since is not None and now - st.refill_since < self.resync_timeout_s
            if st.next_seq is not None and st.pending and not refilling:
                self._drop_far_ahead(st, now)
            if st.next_seq is not None and st.pending and st.gap_since is not None and not refilling:
                if now - st.gap_since >= self.reorder_wait_s:
                    self.counters["gaps"] += 1
                    self._wait(st, "gap")
                    if st.spare is not None and st.spare.seq >= st.need_seq and self._fits(st, st.spare):
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
                st.ledger.restart(st.next_seq - 1, None)
                self._drain(st)

    # ---------------------------------------------------------------- rules
    def _place(self, st: _Stream, m: LiveMsg) -> None:
        """A batch of the current epoch: a duplicate (or conflict), or held and delivered in order."""
        if st.next_seq is not None and m.seq < st.next_seq:
            known = st.ledger.payload(m.seq)
            if known is not None and known != payload_digest(m.payload):
                return self._conflict(st, m.seq)
            if not self._far_behind(st, m, known is None):
                self.counters["duplicates"] += 1
                return
        old = st.pending.get(m.seq)
        if old is not None:
            if old.payload != m.payload:
                return self._conflict(st, m.seq)
            self.counters["duplicates"] += 1
            return
        st.alive_at = self.clock()
        if len(st.pending) >= self.max_pending:
            self.counters["buffer_overflows"] += 1
            st.pending.clear()
        st.pending[m.seq] = m
        if st.next_seq is None:
            if 0 in st.pending and st.need_seq < 0:  # the engine's first batch: a clean start loses nothing
                st.next_seq = 0
                st.ledger.restart(-1, 0)
                self.counters["clean_starts"] += 1
            elif self.start_anywhere and st.reason == "first" and not st.dirty:
                st.next_seq = m.seq
                st.ledger.restart(m.seq - 1, None)
            elif st.spare is not None and st.spare.seq >= st.need_seq and self._fits(st, st.spare):
                return self._apply(st, st.spare)
            else:
                return
        self._drain(st)

    def _far_behind(self, st: _Stream, m: LiveMsg, unknown: bool) -> bool:
        """Batches far behind a stream that has not moved for reorder_wait_s, and that at their pace
        would not reach its position within resync_timeout_s: the position itself (e.g. a snapshot
        claiming a far-future seq) is not believed, and the stream resyncs (True). A bridge's
        backlog behind a newer snapshot catches up fast, and is waited for."""
        assert st.next_seq is not None
        now = self.clock()
        if (
            self.catching_up
            or not unknown
            or m.seq >= st.next_seq - self.far_ahead
            or now - st.moved_at < self.reorder_wait_s
        ):
            return False
        if st.behind is None or m.seq < st.behind[1]:
            st.behind = (now, m.seq)
            return False
        t0, seq0 = st.behind
        if now - t0 < self.reorder_wait_s:
            return False
        pace = (m.seq - seq0) / (now - t0)  # seqs per second
        if pace > 0 and (st.next_seq - m.seq) / pace <= self.resync_timeout_s:
            return False
        st.behind = None
        self.counters["positions_distrusted"] += 1
        log.warning(
            "%s rank %d: batches at seq %d while the stream stands at %d and does not move; resyncing",
            st.source,
            st.rank,
            m.seq,
            st.next_seq,
        )
        self._wait(st, "gap")
        return True

    def _conflict(self, st: _Stream, seq: int) -> None:
        """Two different batches for one (epoch, seq): which one is true is unknown, so the state goes."""
        self.counters["conflicts"] += 1
        log.warning(
            "%s rank %d seq %d: two different batches stored for one seq; resyncing from a snapshot",
            st.source,
            st.rank,
            seq,
        )
        st.need_seq = max(st.need_seq, seq)
        for s in [s for s in st.pending if s <= seq]:
            del st.pending[s]
        self._wait(st, "gap")
        if st.spare is not None and st.spare.seq >= st.need_seq and self._fits(st, st.spare):
            self._apply(st, st.spare)

    def _candidate(self, st: _Stream, epoch: int, *, live: LiveMsg | None = None, snap: Snapshot | None = None) -> None:
        """A message of another epoch: held as evidence of a restart until the current epoch is quiet."""
        now = self.clock()
        if st.cand_epoch != epoch:
            if st.cand_epoch is not None:
                self.counters["epoch_candidates_dropped"] += 1
            st.cand_epoch, st.cand_since, st.cand_pending, st.cand_snap = epoch, now, {}, None
            self.counters["epoch_candidates"] += 1
        if live is not None and len(st.cand_pending) < self.max_pending:
            st.cand_pending.setdefault(live.seq, live)
        if snap is not None and (st.cand_snap is None or snap.seq >= st.cand_snap.seq):
            st.cand_snap = snap
        self._maybe_adopt(st, now)

    def _maybe_adopt(self, st: _Stream, now: float) -> None:
        """Adopt the candidate epoch once the current one has said nothing new for reorder_wait_s
        since the candidate appeared (a live engine heartbeats: a stray message changes nothing)."""
        if st.cand_epoch is None or now - max(st.cand_since, st.alive_at) < self.reorder_wait_s:
            return
        epoch, pending, snap = st.cand_epoch, st.cand_pending, st.cand_snap
        st.cand_epoch, st.cand_pending, st.cand_snap = None, {}, None
        self._restart(st, epoch)
        for m in sorted(pending.values(), key=lambda x: x.seq):
            self._place(st, m)
        if snap is not None:
            self.snapshot(snap)

    def _restart(self, st: _Stream, epoch: int | None) -> None:
        self.counters["restarts"] += 1
        if st.epoch is not None:
            st.retired.add(st.epoch)
        st.epoch = epoch
        st.pending = {k: v for k, v in st.pending.items() if v.epoch == epoch and epoch is not None}
        st.spare = None
        st.need_seq = -1
        st.refill_since = None
        self._wait(st, "restart")

    def _wait(self, st: _Stream, reason: ResetReason) -> None:
        """Stop delivering (source, rank): its state is dropped now and rebuilt by a resync."""
        st.next_seq = None
        st.reason = reason
        st.gap_since = None
        st.waiting_since = self.clock()
        st.ledger.restart(-1, None)
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

    def _decode(self, st: _Stream, snap: Snapshot) -> list[KVEventBatch] | None:
        try:
            return [decode_batch(p) for p in snap.payloads]
        except DecodeError as exc:
            self.counters["bad_payloads"] += 1
            log.warning("%s rank %d: undecodable snapshot part: %s", st.source, st.rank, exc)
            return None

    def _compare(self, st: _Stream, snap: Snapshot) -> bool:
        """Anti-entropy: the state delivered at S against the snapshot of S; a difference is repaired (True)."""
        want = st.ledger.state_at(snap.seq)
        if want is None:
            self.counters["anti_entropy_skipped"] += 1  # S too far back, or our start is not known
            return False
        batches = self._decode(st, snap)
        if batches is None:
            return False
        if state_digest(0, batches) == want:
            self.counters["anti_entropy_checks"] += 1
            return False
        self.counters["anti_entropy_repairs"] += 1
        log.warning(
            "%s rank %d: the state delivered up to seq %d differs from its stored snapshot; repairing from it",
            st.source,
            st.rank,
            snap.seq,
        )
        behind = st.next_seq is not None and st.next_seq > snap.seq + 1
        st.reason = "gap"
        self._apply(st, snap, batches, repair=True)
        if behind:  # the batches after S were delivered on the wrong state: read them again
            st.refill_since = self.clock()
            self._refills.append(Refill(st.source, st.rank, snap.start))
        return True

    def _apply(
        self, st: _Stream, snap: Snapshot, batches: list[KVEventBatch] | None = None, repair: bool = False
    ) -> None:
        if batches is None:
            batches = self._decode(st, snap)
            if batches is None:
                return
        if st.next_seq is not None and not repair:  # a gap in progress that this snapshot closes
            st.reason = "gap"
            self.counters["gaps"] += 1
        if st.dirty:
            self._reset(st)
        now = self.clock()
        for p, b in zip(snap.payloads, batches):
            self._out.append(Delivery(st.source, snap.seq, b, p, "", "snapshot", st.rank, snap.epoch, "", now))
            self.counters["snapshot_batches"] += 1
        st.dirty = True
        st.moved_at, st.behind = now, None
        if snap.epoch is not None:
            st.epoch = snap.epoch
        st.next_seq = snap.seq + 1
        st.ledger.restart(snap.seq, state_digest(0, batches))
        st.spare = None
        st.need_seq = -1
        st.waiting_since = None
        self.counters["snapshots_applied"] += 1
        self._drain(st)

    def _drain(self, st: _Stream) -> None:
        assert st.next_seq is not None
        pending = st.pending
        for s in [s for s in pending if s < st.next_seq]:
            del pending[s]
        first = st.next_seq
        ledger = st.ledger
        while st.next_seq in pending:
            m = pending.pop(st.next_seq)
            state = ledger.state
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
                if state is not None and batch.events:
                    state = state_digest(state, (batch,))
            ledger.record(m.seq, payload_digest(m.payload), state or 0)
            st.next_seq += 1
        st.waiting_since = None
        spare = st.spare
        if spare is not None and spare.seq + 1 <= st.next_seq:
            st.spare = None
            if self._compare(st, spare):  # the snapshot we were ahead of is reached: does our state agree?
                return
        now = self.clock()
        if st.next_seq != first:
            st.moved_at, st.behind = now, None
            st.gap_since = now if pending else None
        elif not pending:
            st.gap_since = None
        elif st.gap_since is None:
            st.gap_since = now

    def _drop_far_ahead(self, st: _Stream, now: float) -> None:
        """A stream that moved since a batch far ahead of it came does not wait for it: after
        reorder_wait_s it goes (a stalled stream is a gap instead, repaired by a snapshot)."""
        assert st.next_seq is not None
        limit, moved, wait = st.next_seq + self.far_ahead, st.moved_at, self.reorder_wait_s
        far = [s for s, m in st.pending.items() if s >= limit and m.received_at < moved and now - m.received_at >= wait]
        for s in far:
            del st.pending[s]
        if far:
            self.counters["far_ahead_dropped"] += len(far)
            log.warning(
                "%s rank %d: dropped %d batch(es) far ahead of seq %d", st.source, st.rank, len(far), st.next_seq
            )
        if not st.pending:
            st.gap_since = None
