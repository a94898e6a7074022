"""What a subscriber consumes and produces: sources (publishers to follow) and the outputs it
delivers in per-(source, dp_rank) seq order (Delivery, Reset), plus per-source status."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Union

from kvevents.events import KVEventBatch
from kvevents.transport.security import CurveClient
from kvevents.transport.wire import check_endpoint

log = logging.getLogger("kvevents.subscriber")

__all__ = ["Source", "parse_source", "Delivery", "Reset", "SourceStatus", "Output", "START_MODES", "dispatch"]

# Where a stream begins on first contact. oldest: replay from seq 0 (the publisher's kept history);
# snapshot: Reset("first") and the publisher's KVE/SNAPSHOT, then the batches after it (no snapshot:
# a counted clean start); now: the first live batch, without replay and without counting a loss.
START_MODES: tuple[str, ...] = ("oldest", "snapshot", "now")


@dataclass(slots=True)
class Source:
    """One publisher: live endpoint, optional replay ROUTER endpoint, a name (default: the endpoint).

    `bind=True` binds the SUB socket instead of connecting (for publishers that connect).
    `curve`: this publisher's CURVE server key and our client keys (transport.security), for
    both its live and replay endpoints. `start`: one of START_MODES (None: the Subscriber's).
    """

    endpoint: str
    replay_endpoint: str | None = None
    name: str | None = None
    bind: bool = False
    curve: CurveClient | None = None
    start: str | None = None

    def __post_init__(self) -> None:
        if not self.endpoint:
            raise ValueError("Source: endpoint must not be empty")
        if self.start is not None and self.start not in START_MODES:
            raise ValueError(
                f"source {self.name or self.endpoint!r}: start must be one of {', '.join(START_MODES)}, got {self.start!r}"
            )
        if self.name is None:
            self.name = self.endpoint
        for what, ep in (("", self.endpoint), ("replay ", self.replay_endpoint)):
            if ep:  # a tcp port > 65535 would silently wrap in libzmq: refuse it here
                try:
                    check_endpoint(ep)
                except ValueError as exc:  # "source 'w': cannot use replay endpoint 'tcp://...': why"
                    raise ValueError(f"source {self.name!r}: cannot use {what}{exc}") from None


def parse_source(spec: str, *, require_name: bool = True) -> Source:
    """`NAME=ENDPOINT[,REPLAY_ENDPOINT]` (the CLI's --publisher) -> Source; ValueError naming the spec.

    With `require_name=False` a bare `ENDPOINT[,REPLAY]` is accepted and named after its endpoint.
    """
    usage = f"--publisher {spec!r}: expected NAME=ENDPOINT[,REPLAY_ENDPOINT], e.g. w0=tcp://127.0.0.1:5557,tcp://127.0.0.1:5558"
    name, sep, rest = spec.partition("=")
    if not sep or "://" in name:
        if require_name:
            raise ValueError(usage)
        name, rest = "", spec
    elif not name.strip():
        raise ValueError(usage)
    parts = [p.strip() for p in rest.split(",")]
    if len(parts) > 2 or not all(parts):
        raise ValueError(usage)
    for p in parts:
        if "://" not in p:
            raise ValueError(f"{usage} ({p!r} is not a ZeroMQ endpoint such as tcp://host:port or ipc://path)")
    return Source(parts[0], parts[1] if len(parts) > 1 else None, name.strip() or None)


@dataclass(slots=True, eq=False)
class Delivery:
    """One batch for the consumer, in per-(source, dp_rank) seq order; iterates as (source, seq, batch)."""

    source: str
    seq: int
    batch: KVEventBatch
    payload: bytes = b""
    topic: str = ""
    kind: str = "live"  # "live" | "replay" | "snapshot" (snapshot batches all carry seq S)
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
    reason: str  # "restart" | "gap" | "first"
    epoch: int | None = None


@dataclass(slots=True)
class SourceStatus:
    name: str
    endpoint: str
    next_seq: int | None
    epoch: int | None
    last_heard: float | None
    stale: bool
    ranks: dict[int | None, int | None] = field(default_factory=dict)  # dp_rank -> next_seq
    busy: bool = False  # a replay or snapshot is in flight
    replay_framing: str | None = None  # "4-frame" | "3-frame" (transport.framing) once a reply was seen


Output = Union[Delivery, Reset]


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
