"""A record log published again (`kvevents replay`): through a real zeromq Publisher, new seqs, the
original payload bytes, at the recorded pace or faster, once or in a loop.

The publisher takes the recorded stream's topic and epoch, so its heartbeats and snapshots agree
with the republished payloads.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

from kvevents.errors import DecodeError
from kvevents.recordlog.format import Record
from kvevents.recordlog.reader import Damage
from kvevents.recordlog.replay import paced, select_records

__all__ = ["count_by_source", "first_record", "publisher_config", "Republisher"]


def _ignore(d: Damage) -> None:
    """on_damage for a second look at a log (the first read reported its damage)."""


def count_by_source(path: str, **sel: Any) -> tuple[int, dict[str, int]]:
    """(records selected, {source: records}) of a log, damage ignored."""
    n = 0
    by: dict[str, int] = {}
    for r in select_records(path, on_damage=_ignore, **sel):
        n += 1
        by[r.source] = by.get(r.source, 0) + 1
    return n, by


def first_record(path: str, sel: dict[str, Any], source: Optional[str]) -> Optional[Record]:
    """The first selected record (of `source`, if given), or None."""
    recs = select_records(path, on_damage=_ignore, **sel)
    try:
        return next((r for r in recs if source is None or r.source == source), None)
    finally:
        recs.close()  # type: ignore[attr-defined]


def publisher_config(
    first: Optional[Record],
    to: str,
    replay_endpoint: Optional[str],
    topic: Optional[str],
    heartbeat_s: float,
    bind: Optional[bool],
    curve: tuple[Optional[str], Optional[str]] = (None, None),
) -> Any:  # PublisherConfig
    """The republishing publisher: the recorded topic unless `topic` is given, the recorded epoch
    when it is a valid one (else a fresh one); `curve` is (secret key file, allow dir)."""
    from kvevents.zeromq.publisher import PublisherConfig

    if topic is None:
        topic = first.topic if first is not None else ""
    epoch = first.epoch if first is not None and first.epoch is not None and 0 <= first.epoch < 2**63 else None
    return PublisherConfig(
        endpoint=to,
        replay_endpoint=replay_endpoint,
        topic=topic,
        heartbeat_interval_s=heartbeat_s,
        bind=bind,
        epoch=epoch,
        curve_secret_key_file=curve[0],
        curve_allow_dir=curve[1],
    )


class Republisher:
    """Publishes the selected records of a log through `publisher`; `sent`, `skipped` (payloads
    that do not decode) and `loops` (passes begun) stay readable after an interrupt."""

    def __init__(
        self,
        publisher: Any,
        path: str,
        sel: dict[str, Any],
        source: Optional[str] = None,
        rate: Optional[float] = None,
        loop: bool = False,
    ) -> None:
        self.publisher, self.path, self.sel, self.source = publisher, path, sel, source
        self.rate, self.loop = rate, loop
        self.sent = self.skipped = self.loops = 0

    def _records(self, on_damage: Callable[[Damage], None]) -> Iterator[Record]:
        recs = select_records(self.path, on_damage=on_damage, **self.sel)
        if self.source is None:
            return recs
        return (r for r in recs if r.source == self.source)

    def run(
        self,
        on_damage: Callable[[Damage], None],
        on_progress: Callable[[int], None] = lambda done: None,
        on_pass_end: Callable[[], None] = lambda: None,
        on_skip: Callable[[Record, Exception], None] = lambda record, exc: None,
    ) -> None:
        """One pass (every pass with `loop`, until interrupted); `on_damage` hears the first pass's
        damage, `on_progress(records done)` at a pass's start and every 64 records."""
        again = True
        while again:
            again = self.loop
            self.loops += 1
            on_progress(0)
            for i, r in enumerate(paced(self._records(on_damage if self.loops == 1 else _ignore), self.rate)):
                try:  # publish_payload: heartbeats/snapshots then carry this payload's epoch and rank
                    self.publisher.publish_payload(r.payload)
                    self.sent += 1
                except DecodeError as exc:
                    self.skipped += 1
                    on_skip(r, exc)
                if i % 64 == 0:
                    on_progress(i + 1)
            on_pass_end()
