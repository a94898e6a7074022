"""What any transport hands a consumer: Delivery and Reset in per-(source, dp_rank) seq order,
per-source status, the EventFeed protocol the ZeroMQ Subscriber and the JetStream feed implement,
and the one callback dispatch they share."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Union

from kvevents.events import KVEventBatch

log = logging.getLogger("kvevents.feed")

__all__ = ["Delivery", "Reset", "SourceStatus", "Output", "START_MODES", "dispatch"]

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
