"""Logs from live streams: a recording of a feed (`kvevents record`), a publisher's replay buffer
pulled into a log, and a stored stream read until it is caught up (`kvevents fetch`).

The feed is any kvevents feed (a zeromq Subscriber, a JetStreamFeed): poll / start / stop /
counters, deliveries and resets to a Recorder. The caller prints; callbacks say what happened,
and a recording words its plan and its summary from what the log holds (not the feed's counters:
history the feed replayed and the recorder left out is not in the log).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from kvevents.errors import DecodeError
from kvevents.events import decode_batch
from kvevents.feed import Delivery, Reset
from kvevents.recordlog.record import Recorder
from kvevents.recordlog.writer import RecordWriter

__all__ = ["LiveRecording", "begin_with_snapshots", "FetchResult", "fetch_replay", "drain_feed", "SNAPSHOT_TIMEOUT_S"]

SNAPSHOT_TIMEOUT_S = 2.0  # a publisher with snapshots=False never answers KVE/SNAPSHOT


def begin_with_snapshots(
    rec: Recorder,
    sources: Sequence[Any],
    on_missing: Callable[[str, Exception], None],
    timeout: float = SNAPSHOT_TIMEOUT_S,
) -> None:
    """--from snapshot: each source with a replay endpoint starts with its KVE/SNAPSHOT; one that
    does not answer is told to `on_missing(name, error)` and recorded from its oldest kept batch."""
    from kvevents.zeromq.engine_requests import EngineRequestError, snapshot
    from kvevents.zeromq.security import client_context

    for s in sources:
        if not s.replay_endpoint:
            continue
        try:
            payloads, seq = snapshot(s.replay_endpoint, timeout=timeout, context=client_context(s.curve))
        except EngineRequestError as exc:
            on_missing(str(s.name), exc)
            continue
        rec.begin_with_snapshot(str(s.name), payloads, seq, endpoint=s.endpoint)


class LiveRecording:
    """A feed recorded through a Recorder into its writer: `open()`, `wait(...)`, `close()`.

    `acks_first`: the feed acknowledges what it delivered (a durable JetStream consumer), so it
    stops before the recorder: all it acknowledged has then been written.
    """

    def __init__(
        self,
        feed: Any,
        recorder: Recorder,
        writer: RecordWriter,
        *,
        sources: Sequence[Any] = (),
        duration: Optional[float] = None,
        acks_first: bool = False,
        on_no_snapshot: Callable[[str, Exception], None] = lambda name, exc: None,
        snapshot_timeout_s: float = SNAPSHOT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.feed, self.recorder, self.writer = feed, recorder, writer
        self.sources, self.duration, self.acks_first = sources, duration, acks_first
        self.on_no_snapshot, self.snapshot_timeout_s = on_no_snapshot, snapshot_timeout_s
        self.clock = clock
        self.t0 = clock()
        self.deadline: Optional[float] = None
        self.removed_empty = False  # close() removed the file it created: nothing was written to it

    def open(self) -> None:
        """Open the feed's sockets (a bad endpoint raises here), take the snapshots (--from
        snapshot), then start the feed; the recording window starts once the snapshots are in."""
        rec = self.recorder
        for item in self.feed.poll(0):
            (rec.on_reset if isinstance(item, Reset) else rec.on_delivery)(item)
        if rec.start == "snapshot":
            begin_with_snapshots(rec, self.sources, self.on_no_snapshot, self.snapshot_timeout_s)
        self.t0 = self.clock()
        self.deadline = None if self.duration is None else self.t0 + self.duration
        self.feed.start()

    def wait(
        self,
        on_tick: Callable[[int], None] = lambda batches: None,
        on_silence: Callable[[], None] = lambda: None,
        on_skip: Callable[[Optional[str]], None] = lambda reason: None,
        silence_s: float = 3.0,
    ) -> None:
        """Until the recorder is done (count reached, a write failed) or the duration is up:
        `on_tick(batches)` every 0.1 s, `on_silence()` once when nothing came for `silence_s`,
        `on_skip(reason)` once when a delivery could not be stored."""
        rec = self.recorder
        hinted = skip_told = False
        while not rec.done.is_set():
            wait = 0.1 if self.deadline is None else min(0.1, self.deadline - self.clock())
            if wait <= 0:
                break
            rec.done.wait(wait)
            on_tick(rec.batches)
            if not hinted and self.nothing_received() and self.clock() - self.t0 >= silence_s:
                hinted = True
                on_silence()
            if rec.skipped and not skip_told:
                skip_told = True
                on_skip(rec.skip_reason)

    def close(self) -> None:
        """Stop the feed and the recorder (no write after this), close the writer; a file the writer
        created and nothing was written to is removed (so the next run need not --force it)."""
        if self.acks_first:
            self.feed.stop()  # all it acknowledges to a durable consumer has been written
        self.recorder.stop()  # no write after this, even from a callback still running
        self.feed.stop()
        self.writer.close()
        if getattr(self.writer, "created", False) and self.writer.records == 0:
            try:
                os.remove(self.writer.path)
                self.removed_empty = True
            except FileNotFoundError:
                self.removed_empty = True

    def summary(self, start: str, interrupted: bool = False, *, zeromq: bool = True) -> list[str]:
        """What was recorded, from what the log holds (by kind), then what the feed repaired and
        what was left out (`--from start`; a zeromq feed started "now" skips the history itself):
        one short line each."""
        rec, c = self.recorder, self.feed.counters()
        n = len(self.sources) or 1
        lines = []
        if self.removed_empty:
            lines.append(
                f"recorded nothing from {n} source(s) in {self.elapsed():.2f}s: no file left at {self.writer.path}"
            )
        else:
            size = os.path.getsize(self.writer.path)  # the whole file, header included, as `log inspect` says
            lines.append(
                f"recorded {rec.batches} batches in {self.elapsed():.2f}s -> {self.writer.path} ({size} bytes)"
            )
            held = [f"{rec.written[k]} {k}" for k in ("snapshot", "replay", "live") if rec.written[k]]
            resets = rec.written["reset"]
            lines.append(
                "the log holds "
                + (", ".join(held) + " batches" if held else "no batches")
                + (f" and {resets} reset marker{'s' if resets != 1 else ''}" if resets else "")
            )
        repairs = f"feed: gaps {c.get('gaps', 0)} ({c.get('unrecoverable_gaps', 0)} not repaired), losses {c.get('losses', 0)}"
        if rec.history_dropped:
            repairs += f"; left out {rec.history_dropped} from before the start (--from {start})"
        elif start == "now" and zeromq:
            repairs += "; history before the first live batch left out (--from now)"
        lines.append(repairs)
        if rec.skipped:
            lines.append(f"skipped {rec.skipped} that could not be stored")
        if interrupted:
            lines[0] += " (interrupted)"
        return lines

    def elapsed(self) -> float:
        """Seconds since the recording window opened (before open(): since construction)."""
        return self.clock() - self.t0

    def nothing_received(self) -> bool:
        """Neither a delivery nor a snapshot reached the recorder."""
        return self.recorder.received == 0 and self.recorder.snapshots_taken == 0


@dataclass(frozen=True)
class FetchResult:
    """What `fetch_replay` wrote: the batch count and the first / last seq (None: none)."""

    batches: int
    first_seq: Optional[int]
    last_seq: Optional[int]


def fetch_replay(
    endpoint: str, since: int, output: str, name: str, *, timeout: float = 3.0, curve: Any = None
) -> FetchResult:
    """Every batch a publisher's replay endpoint keeps from seq `since`, into a new record log
    (kind "replay", source `name`); on a failure before the first batch no file is left behind."""
    from kvevents.zeromq.engine_requests import replay
    from kvevents.zeromq.security import client_context

    n = 0
    first: Optional[int] = None
    last: Optional[int] = None
    w = RecordWriter(output, durability="buffered")
    try:
        for topic, seq, payload in replay(endpoint, since, timeout=timeout, context=client_context(curve)):
            try:
                b = decode_batch(payload)
                epoch, rank = b.epoch, b.data_parallel_rank
            except DecodeError:
                epoch = rank = None
            w.write(
                payload,
                source=name,
                endpoint=endpoint,
                topic=topic.decode("utf-8", "replace"),
                seq=seq,
                epoch=epoch,
                dp_rank=rank,
                kind="replay",
            )
            first = seq if first is None else first
            last = seq
            n += 1
    except BaseException:
        w.close()
        if n == 0:
            os.remove(output)  # nothing fetched: leave no empty log behind
        raise
    w.close()
    return FetchResult(n, first, last)


@dataclass(frozen=True)
class DrainResult:
    """What `drain_feed` read: batches and resets, and whether the feed caught up in time."""

    batches: int
    resets: int
    synced: bool


def drain_feed(
    feed: Any,
    on_delivery: Callable[[Delivery], object],
    on_reset: Callable[[Reset], object],
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    on_tick: Callable[[], object] = lambda: None,
) -> DrainResult:
    """Read a stored stream (a JetStreamFeed) until it is caught up (`synced`) and quiet; stops
    unsynced after `timeout` s. A feed error is raised. `on_tick()` after every poll (progress)."""
    n = resets = 0
    t0 = clock()
    while True:
        items = feed.poll(0.1)
        on_tick()
        for it in items:
            if isinstance(it, Delivery):
                n += 1
                on_delivery(it)
            else:
                resets += 1
                on_reset(it)
        if feed.error is not None:
            raise feed.error
        if feed.synced and not items:
            return DrainResult(n, resets, True)
        if clock() - t0 > timeout and not feed.synced:
            return DrainResult(n, resets, False)
