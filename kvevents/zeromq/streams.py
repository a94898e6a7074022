"""Per-(source, dp_rank) sequencing state of the subscriber, and its repair requests."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kvevents.events import KVEventBatch

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


@dataclass(slots=True, eq=False)
class Request:
    """A replay (from `start`), snapshot or describe request; one in flight per source DEALER.

    A gap replay to a publisher that answers KVE/DESCRIBE asks DESCRIBE first (`describing`), so
    a restart whose new seqs run past ours is found before its batches are replayed onto old state.
    """

    stream: Stream
    kind: str  # "replay" | "snapshot" | "describe"
    start: int
    first: bool = False  # the stream's first contact: a late first reply is reason "first"
    describing: bool = False  # a DESCRIBE is in flight for this request
    deadline: float = 0.0
    attempts: int = 0
    got_any: bool = False
    aborting: bool = False  # ignore replies until the end marker
    failed: bool = False  # replay could not fill the gap / snapshot unusable
    superseded: bool = False  # the stream was reset meanwhile: discard the outcome
    new_epoch: int | None = None  # a reply came from a restarted publisher


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
