"""What any transport hands a consumer: Delivery and Reset in per-(source, dp_rank) seq order,
per-source status, the EventFeed protocol the ZeroMQ Subscriber and the JetStream feed implement,
the one callback dispatch they share, and the one feed thread loop (`FeedLoop`) that runs them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, Union, runtime_checkable

from kvevents.events import KVEventBatch

log = logging.getLogger("kvevents.feed")

__all__ = [
    "Delivery",
    "Reset",
    "SourceStatus",
    "Output",
    "EventFeed",
    "DeliveryKind",
    "ResetReason",
    "DELIVERY_KINDS",
    "RESET_REASONS",
    "START_MODES",
    "FeedLoop",
    "backoff_s",
    "dispatch",
]

#: How a batch reached the consumer: live from the stream, re-sent by a replay, or rebuilt by a
#: snapshot (snapshot batches all carry the seq S they cover). The same strings in JSON and logs.
DeliveryKind = Literal["live", "replay", "snapshot"]
DELIVERY_KINDS: tuple[DeliveryKind, ...] = ("live", "replay", "snapshot")
#: Why a stream's state is dropped: the publisher restarted, a gap could not be repaired, or the
#: stream is being joined (start mode snapshot).
ResetReason = Literal["restart", "gap", "first"]
RESET_REASONS: tuple[ResetReason, ...] = ("restart", "gap", "first")

# Where a stream begins on first contact. oldest: replay from seq 0 (the publisher's kept history);
# snapshot: Reset("first") and the publisher's KVE/SNAPSHOT, then the batches after it (no snapshot:
# a counted clean start); now: the first live batch, without replay and without counting a loss.
START_MODES: tuple[str, ...] = ("oldest", "snapshot", "now")


@dataclass(slots=True, eq=False)
class Delivery:
    """One batch for the consumer, in per-(source, dp_rank) seq order; iterates as (source, seq, batch)."""

    source: str
    seq: int
    batch: KVEventBatch
    payload: bytes = b""
    topic: str = ""
    kind: DeliveryKind = "live"  # snapshot batches all carry seq S
    dp_rank: int | None = None
    epoch: int | None = None
    endpoint: str = ""
    received_at: float = 0.0

    def __iter__(self) -> Iterator[object]:
        yield self.source
        yield self.seq
        yield self.batch


@dataclass(slots=True)
class Reset:
    """Drop every block of (source, dp_rank); snapshot deliveries (if any) follow."""

    source: str
    dp_rank: int | None
    reason: ResetReason
    epoch: int | None = None


@dataclass(slots=True)
class SourceStatus:
    """Where one source stands: its first rank's next seq and epoch, last heard, stale, per-rank seqs;
    what it publishes, as far as seen; and a likely misconfiguration."""

    name: str
    endpoint: str
    next_seq: int | None
    epoch: int | None
    last_heard: float | None
    stale: bool
    ranks: dict[int | None, int | None] = field(default_factory=dict)  # dp_rank -> next_seq
    busy: bool = False  # a replay or snapshot is in flight
    replay_framing: str | None = None  # "4-frame" | "3-frame" (zeromq/framing.py) once a reply was seen
    page_size: int | None = None  # its first BlockStored's block_size (kvevents.published)
    hash_chain: str | None = None  # contract | vllm-sha256 | vllm-sha256_cbor | other, from its first chain head
    problem: str | None = None  # a likely misconfiguration its sockets saw, one line (kvevents.zeromq.handshake)


Output = Union[Delivery, Reset]


@runtime_checkable
class EventFeed(Protocol):
    """What a consumer reads (RouterService, the recorder): the ZeroMQ Subscriber or the JetStream feed.

    `start()` once, then `poll()` from one thread: every Delivery and Reset, in order, to apply as
    returned; `status()` (name -> SourceStatus) and `counters()` may be read from other threads;
    `stop()` releases everything.
    """

    def start(self) -> object: ...

    def stop(self) -> None: ...

    def poll(self, timeout_s: float = 0.0) -> Sequence[Output]: ...

    def status(self) -> Mapping[str, SourceStatus]: ...

    def counters(self) -> Mapping[str, int]: ...


def dispatch(
    items: list[Output], on_delivery: Callable[[Delivery], object], on_reset: Callable[[Reset], object] | None
) -> int:
    """Hand each output to its callback, in order; a callback that raises is logged and skipped
    (a consumer bug must not stop the feed). Returns how many raised."""
    errors = 0
    for item in items:
        try:
            if isinstance(item, Delivery):
                on_delivery(item)
            elif on_reset is not None:
                on_reset(item)
        except Exception:  # noqa: BLE001 - see above
            errors += 1
            log.exception("event feed callback failed")
    return errors


def backoff_s(errors: int) -> float:
    """Wait after `errors` failed polls in a row: 50 ms, doubling, at most 5 s."""
    return min(5.0, 0.05 * 2 ** min(max(errors, 1) - 1, 7))


class FeedLoop:
    """The one feed thread: poll, hand the outputs to the callbacks (`dispatch`), back off on errors.

    A poll that raises is counted (`loop_errors`), logged once per `log_every` in a row, and
    waited out (`backoff_s`), so a persistent failure neither kills the thread nor spins; a
    callback that raises is counted (`callback_errors`) and the rest go on. `stop` is the owner's
    event (setting it ends the loop); `on_exit` runs on the thread when it ends (e.g. closing
    sockets that thread used).
    """

    def __init__(
        self,
        poll: Callable[[float], Sequence[Output]],
        on_delivery: Callable[[Delivery], object],
        on_reset: Callable[[Reset], object] | None,
        *,
        stop: threading.Event,
        counters: MutableMapping[str, int],
        logger: logging.Logger = log,
        name: str = "kvevents-feed",
        log_every: int = 100,
        poll_s: float = 0.05,
        on_exit: Callable[[], object] | None = None,
    ) -> None:
        self.poll = poll
        self.on_delivery = on_delivery
        self.on_reset = on_reset
        self.stop = stop
        self.counters = counters
        self.logger = logger
        self.name = name
        self.log_every = max(1, log_every)
        self.poll_s = poll_s
        self.on_exit = on_exit
        self.errors = 0  # failed polls in a row

    def _count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def step(self) -> float:
        """One poll and its dispatch; returns the seconds to wait before the next (0 after a good poll)."""
        try:
            items = self.poll(self.poll_s)
        except Exception:  # noqa: BLE001 - the thread must not die silently, nor spin on an error
            self.errors += 1
            self._count("loop_errors")
            if self.errors % self.log_every == 1 or self.log_every == 1:
                self.logger.exception(
                    "%s loop error (%d in a row, logged once per %d)", self.name, self.errors, self.log_every
                )
            return backoff_s(self.errors)
        self.errors = 0
        failed = dispatch(list(items), self.on_delivery, self.on_reset)
        if failed:
            self._count("callback_errors", failed)
        return 0.0

    def run(self) -> None:
        """Step until `stop` is set, then `on_exit`."""
        try:
            while not self.stop.is_set():
                wait = self.step()
                if wait:
                    self.stop.wait(wait)
        finally:
            if self.on_exit is not None:
                self.on_exit()

    def start(self) -> threading.Thread:
        """Run on a new daemon thread (named `name`), returned."""
        thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        thread.start()
        return thread
