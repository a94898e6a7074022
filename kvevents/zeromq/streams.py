"""Per-(source, dp_rank) sequencing state of the subscriber, and its repair requests."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kvevents.events import KVEventBatch
from kvevents.feed import SourceStatus

__all__ = ["Item", "Stream", "Request", "SourceState"]


@dataclass(slots=True)
class Item:
    """One received batch: seq, raw topic and payload, the decoded batch, arrival time."""

    seq: int
    topic: bytes
    payload: bytes
    batch: KVEventBatch
    received_at: float


@dataclass(slots=True, eq=False)
class Stream:
    """Where one publisher rank stands: epoch, next expected seq, live items held during a repair."""

    rank: int | None
    epoch: int | None = None
    next_seq: int | None = None  # None: nothing applied yet (first contact, or after a reset)
    last_live_seq: int | None = None  # live seqs only grow on one connection; lower means restart
    busy: bool = False  # a replay, snapshot or describe is queued or in flight
    verified: bool = False  # epoch confirmed by KVE/DESCRIBE since the last (re)contact
    clean_start: bool = False  # accept the next seq as the start (no snapshot available)
    buffer: list[Item] = field(default_factory=list)
    snapshot: list[Item] = field(default_factory=list)


class Phase(Enum):
    """Where a request is: waiting its turn, its KVE/DESCRIBE in flight, its replay or snapshot
    request sent (replies taken), or draining (replies ignored until the end marker)."""

    QUEUED = "queued"
    DESCRIBING = "describing"
    REQUESTING = "requesting"
    DRAINING = "draining"  # failed, restarted meanwhile, or superseded: the end marker decides


@dataclass(slots=True, eq=False)
class Request:
    """A replay (from `start`), snapshot or describe request; one in flight per source DEALER.

    A gap replay to a publisher that answers KVE/DESCRIBE asks DESCRIBE first (Phase.DESCRIBING),
    so a restart whose new seqs run past ours is found before its batches are replayed onto old state.
    """

    stream: Stream
    kind: str  # "replay" | "snapshot" | "describe"
    start: int
    first: bool = False  # the stream's first contact: a late first reply is reason "first"
    phase: Phase = Phase.QUEUED
    deadline: float = 0.0  # no reply by then: timed out (each reply moves it on)
    give_up_at: float = 0.0  # not finished by then, replies or not: abandoned (never moves)
    attempts: int = 0
    describe_attempts: int = 0  # DESCRIBEs lost before it (counted apart: a replay keeps its own retries)
    got_any: bool = False  # a reply to the replay or snapshot request came
    failed: bool = False  # replay could not fill the gap / snapshot unusable
    superseded: bool = False  # the stream was reset meanwhile: discard the outcome
    new_epoch: int | None = None  # a reply came from a restarted publisher

    def replayed(self, seq: int, batch: KVEventBatch | None) -> str:
        """Take one replayed batch (None: undecodable, counted by the caller) into the stream's order:
        "deliver" (next_seq moved past it), "duplicate", or "skip" (held back, or the reply failed)."""
        st = self.stream
        first_reply = not self.got_any
        self.got_any = True
        if first_reply and seq > self.start:
            self.phase, self.failed = Phase.DRAINING, True  # the publisher no longer keeps next_seq
            return "skip"
        if batch is None:
            if st.next_seq is not None and seq == st.next_seq:
                st.next_seq += 1  # it will never decode: skip it
            return "skip"
        if self.first and st.next_seq is None:
            if batch.epoch is not None:
                st.epoch = batch.epoch
            st.next_seq = self.start
        if batch.epoch is not None and st.epoch is not None and batch.epoch != st.epoch:
            self.phase = Phase.DRAINING  # the publisher restarted meanwhile: resync when this reply ends
            self.new_epoch = batch.epoch
            return "skip"
        assert st.next_seq is not None
        if seq < st.next_seq:
            return "duplicate"
        if seq > st.next_seq:
            self.phase, self.failed = Phase.DRAINING, True  # a hole inside the ring (dropped batches)
            return "skip"
        st.next_seq = seq + 1
        return "deliver"

    def outcome(self, last: bytes) -> str:
        """What the end marker (its payload `last`) leads to: "superseded", "restart", "snapshot",
        "no-snapshot", "unrecoverable" (a Reset and a snapshot) or "drain" (the gap is filled)."""
        st = self.stream
        if self.superseded:
            return "superseded"
        if self.new_epoch is not None:
            return "restart"
        if self.kind == "snapshot":
            return "no-snapshot" if self.failed or len(last) != 8 else "snapshot"
        holes = not self.got_any and st.buffer and st.next_seq is not None and st.buffer[0].seq > st.next_seq
        if self.failed or holes or (self.first and not self.got_any):
            return "unrecoverable"
        return "drain"


class SourceState:
    """Sequencing state of one source: streams per dp_rank, the one in-flight request, when heard."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.name: str = source.name  # type: ignore[assignment]
        self.streams: dict[int | None, Stream] = {}
        self.queue: deque[Request] = deque()
        self.active: Request | None = None
        self.last_heard: float | None = None  # wall clock, for display
        self.heard_at: float | None = None  # the subscriber's monotonic clock, for staleness
        self.stale = False
        self.not_before = 0.0  # backoff: no new request before this time
        self.connects = 0  # connections the SUB made or accepted
        # Does the publisher answer KVE/DESCRIBE? None: not known yet; False: a DESCRIBE timed out
        # (vLLM, SGLang), so seqs alone find restarts until the next reconnect asks again.
        self.describes: bool | None = None
        self.failing = False  # its last replay/snapshot got no usable answer: retry nothing until one ends well
        self.framing: str | None = None  # the replay framing its replies use (zeromq.framing), once seen
        self.topic = b""  # the last live topic: what a 3-frame replay reply (no topic frame) is filed under

    def status(self, stale: bool) -> SourceStatus:
        """Where its first rank stands, every rank's next seq, when heard (wall clock), its framing."""
        streams = list(self.streams.items())  # one C-level copy: safe while the poll thread runs
        first = streams[0][1] if streams else None
        return SourceStatus(
            name=self.name,
            endpoint=self.source.endpoint,
            next_seq=first.next_seq if first else None,
            epoch=first.epoch if first else None,
            last_heard=self.last_heard,
            stale=stale,
            ranks={r: st.next_seq for r, st in streams},
            busy=any(st.busy for _, st in streams),
            replay_framing=self.framing,
        )

    def heard(self, wall: float, mono: float) -> None:
        """Something arrived from this source (live or on the DEALER)."""
        self.last_heard = wall
        self.heard_at = mono

    @property
    def can_describe(self) -> bool:
        """A DESCRIBE may be asked: a replay endpoint that has not been found mute."""
        return bool(self.source.replay_endpoint) and self.describes is not False

    def unverify(self) -> None:
        """The connection was re-made or the source was silent: epochs must be confirmed again."""
        for st in self.streams.values():
            st.verified = False
