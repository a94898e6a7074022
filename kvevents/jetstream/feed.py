"""A consumer source reading a kvevents JetStream stream: the Subscriber interface, over NATS.

Cold start: the newest complete, matching and (with a sign key) authentic snapshot of every
(source, dp_rank), then the stream from the earliest position their batches after S can sit at
(what is stored by pull, the tail by push: `consuming`), ordered by engine seq (`StreamOrder`).
Every message passes `gate.Gate` first: with `sign_key`, unsigned or badly signed messages are
counted per reason and dropped. Runs
nats-py on its own loop thread; `poll()` (or the `start()` thread with callbacks) hands out
Delivery and Reset objects like `kvevents.zeromq.subscriber.Subscriber`, so RouterService and the
recorder take either.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import Counter, deque
from typing import Any, Callable, Mapping, Sequence

from kvevents.feed import Delivery, FeedLoop, Reset, SourceStatus
from kvevents.jetstream.backlog import BACKLOG_BYTES, BACKLOG_ITEMS, Backlog
from kvevents.jetstream.consuming import StreamReader, read_durable, wait_for_event
from kvevents.jetstream.gate import Gate, pick_snapshots
from kvevents.jetstream.link import (
    ROOT,
    LoopThread,
    NatsOptions,
    NatsUnavailable,
    check_token,
    close,
    connect,
    live_subject,
    parse_subject,
)
from kvevents.jetstream.messages import CaughtUp, QueueItem, Refilled, Snapshots, Stop, StoredMsg
from kvevents.jetstream.order import LiveMsg, Refill, Snapshot, SnapshotAssembler, StreamOrder
from kvevents.jetstream.pacing import SNAPSHOT_BATCHES_PER_POLL, SnapshotPacer
from kvevents.jetstream.positions import positions_from_records, start_from
from kvevents.jetstream.reread import read_all, read_subject, stream_info
from kvevents.jetstream.signing import SignKey
from kvevents.published import PublishedWatch

__all__ = ["JetStreamFeed", "JetStreamSource", "pick_snapshots", "positions_from_records"]

log = logging.getLogger("kvevents.jetstream")

RELEASE_WAIT_S = 5.0  # how long a stopping durable feed's connection waits for its acks and naks
_LOG_BAD_EVERY = 100  # bad messages are logged the first time and once per this many after


class JetStreamFeed:
    """Delivery / Reset objects from a kvevents JetStream stream; the Subscriber's interface.

    Drive `poll()` from one thread (or `start()` with `on_delivery`); `status()` may be read from
    others. `sources` keeps only those source names; `reorder_wait_s` is how long a batch stored
    out of order is waited for before it counts as a gap; `resync_timeout_s` how long a source
    waits for a snapshot before starting clean (a counted loss). `durable` names a pull consumer
    acknowledged once deliveries are consumed (a restart goes on after the last ack; `resume`
    positions, e.g. from `positions_from_records`, drop what a log already holds), made only once
    the cold start's snapshots were consumed (a run stopped before that leaves none); `start_time`
    reads the live batches stored since then instead of a snapshot and its tail. `sign_key`: the
    bus's key (None reads unsigned messages: anyone who may publish can forge); `max_sources`
    sources and `max_ranks` dp ranks per source are tracked, messages of further ones counted
    (`sources_refused`, `ranks_refused`) and dropped. `backlog`: (messages, bytes) read ahead of
    `poll()` at most (kvevents.jetstream.backlog); past them the server is held back.
    `snapshot_batches_per_poll`: the cold start's snapshots go out a few per `poll()`, about this many
    batches (kvevents.jetstream.pacing), so a fleet's snapshots are never all decoded at once.
    """

    def __init__(
        self,
        nats: NatsOptions,
        stream: str,
        *,
        on_delivery: Callable[[Delivery], object] | None = None,
        on_reset: Callable[[Reset], object] | None = None,
        sources: Sequence[str] | None = None,
        stale_after_s: float = 5.0,
        reorder_wait_s: float = 2.0,
        resync_timeout_s: float = 60.0,
        on_unreachable: Callable[[str], object] | None = None,
        give_up_after_s: float | None = None,
        durable: str | None = None,
        start_time: float | None = None,
        resume: Mapping[tuple[str, int], tuple[int | None, int]] | None = None,
        clock: Callable[[], float] = time.time,
        sign_key: SignKey | None = None,
        max_sources: int = 4096,
        max_ranks: int = 64,
        backlog: tuple[int, int] = (BACKLOG_ITEMS, BACKLOG_BYTES),
        snapshot_batches_per_poll: int = SNAPSHOT_BATCHES_PER_POLL,
    ) -> None:
        check_token("stream", stream)
        if durable is not None:
            check_token("durable consumer name", durable)
        nats.servers()
        self.nats = nats
        self.stream = stream
        self.on_delivery = on_delivery
        self.on_reset = on_reset
        self.only = set(sources) if sources else None
        self.stale_after_s = stale_after_s
        self.on_unreachable = on_unreachable
        self.give_up_after_s = give_up_after_s
        self.clock = clock
        self.sign_key = sign_key
        self.order = StreamOrder(
            reorder_wait_s=reorder_wait_s, resync_timeout_s=resync_timeout_s, max_sources=max_sources,
            max_ranks=max_ranks, clock=clock,
        )  # fmt: skip
        self._gate = Gate(sign_key, self._bad)
        self.durable = durable
        self.start_time = start_time  # read live batches stored since then (unix time), no snapshots
        start_from(self.order, start_time, resume)
        self._pacer = SnapshotPacer(snapshot_batches_per_poll)
        self._sync_when_paced = False  # the pick said synced: marked once its snapshots are all out
        self._init_state(clock, backlog)

    def _init_state(self, clock: Callable[[], float], backlog: tuple[int, int]) -> None:
        """Nothing read or connected yet: the queue between the NATS side and the poll side, empty."""
        self._handled: deque[tuple[int, Any]] = deque()  # durable mode: (stream seq, msg) not yet acknowledged
        self._asm = SnapshotAssembler()
        self._q: Backlog[QueueItem] = Backlog(*backlog)  # bounded: the NATS side waits for room
        self._lt: LoopThread | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._released = threading.Event()  # set by stop() once its acks are out (durable mode)
        self._snapshots_in = False  # the cold start's pick (Snapshots) reached the poll side
        # durable mode: the poll after the one that handed the last snapshot out began (they were consumed)
        self._snapshots_out = threading.Event()
        self._synced = threading.Event()
        self._sync_target: int | None = None
        self._connected = threading.Event()
        self._error: BaseException | None = None
        self._started_at = clock()
        self._counters_extra: dict[str, int] = {"messages": 0, "bad_messages": 0}
        self._reads: Counter[str] = Counter()  # the NATS side's: catch-up messages and new consumers
        self._js: Any = None  # the NATS side's JetStream context (refills use it)
        self._last_sseq = 0  # the highest stream seq handled on the poll side
        self._refills_out = 0  # Refills asked of the NATS side and not back yet
        self.cold_start_s: float | None = None
        self._published = PublishedWatch()

    @property
    def read_to(self) -> int:
        """The newest stream seq read so far (progress against the stream's last seq)."""
        return self._last_sseq

    # ------------------------------------------------------------------ Subscriber interface
    def start(self) -> JetStreamFeed:
        """Connect in the background; with on_delivery set, also deliver on a thread (as Subscriber.start)."""
        self._open()
        if self.on_delivery is not None and self._thread is None:
            loop = FeedLoop(
                self.poll, self.on_delivery, self.on_reset, stop=self._stop, counters=self._counters_extra,
                logger=log, name="kvevents-jetstream",
            )  # fmt: skip
            self._thread = loop.start()
        return self

    def stop(self, timeout: float = 3.0) -> None:
        """Stop the delivery thread and the NATS connection. Durable mode: consumed messages are
        acked (none if the thread is still inside a callback after `timeout`), and the rest, read but
        not consumed, are nak'ed, so the next run gets them at once, in order, not after ack_wait."""
        self._stop.set()
        self._q.put(Stop())
        consumed = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            consumed = not self._thread.is_alive()
        if self._lt is not None and self.durable is not None:
            try:
                if consumed:
                    self._ack_consumed(wait=True)
                self._give_back()
            except Exception as exc:  # noqa: BLE001 - unacknowledged: redelivered after ack_wait, dropped as duplicates
                log.warning("jetstream durable %s: acks at stop failed: %r", self.durable, exc)
        self._released.set()  # the NATS side may close its connection now
        if self._lt is not None:
            self._lt.stop(timeout)
            self._lt = None

    def __enter__(self) -> JetStreamFeed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def poll(self, timeout_s: float = 0.0) -> list[Delivery | Reset]:
        """Wait up to timeout_s for stored messages; return what became deliverable, in order."""
        if self._stop.is_set():
            raise ValueError("JetStreamFeed.poll: the source is stopped")
        self._open()
        self._ack_consumed()
        if self._snapshots_in and not self._pacer.pending:
            self._snapshots_out.set()
        deadline = time.monotonic() + timeout_s
        got = 0
        while not self._pacer.pending:  # stored messages wait until the snapshots before them are out
            wait = deadline - time.monotonic()
            try:
                item = self._q.get(wait if wait > 0 and not got else 0)
            except queue.Empty:
                break
            if isinstance(item, Stop):
                break
            self._handle(item)
            got += 1
            if got >= 5000:
                break
        if self._pacer.pending and self._pacer.hand_out(self.order.snapshot) and self._sync_when_paced:
            self._mark_synced()
        self.order.tick()
        for r in self.order.take_refills():
            self._ask_refill(r)
        out = self.order.take()
        self._published.observe_all(out)  # each source's page size and hash chain, for status()
        return out

    def status(self) -> dict[str, SourceStatus]:
        now = self.clock()
        out: dict[str, SourceStatus] = {}
        where = f"{self.nats.redacted()} {ROOT}.{self.stream}."  # once: a fleet has thousands of sources
        for (source, rank), st in list(self.order.streams.items()):
            s = out.get(source)
            if s is None:
                heard = st.last_heard
                s = out[source] = SourceStatus(
                    name=source,
                    endpoint=where + source,
                    next_seq=st.next_seq,
                    epoch=st.epoch,
                    last_heard=heard,
                    stale=now - (heard if heard is not None else self._started_at) > self.stale_after_s,
                )
            s.ranks[rank] = st.next_seq
            s.busy = s.busy or st.next_seq is None
        return {name: self._published.fill(s) for name, s in out.items()}

    def counters(self) -> dict[str, int]:
        out = dict(self._counters_extra)
        out.update(self.order.counters)
        out.update(self._reads)
        q = self._q
        out.update(backlog_waits=q.waits, backlog_peak_messages=q.peak_items, backlog_peak_bytes=q.peak_bytes)
        return out

    # ------------------------------------------------------------------ extras
    @property
    def synced(self) -> bool:
        """True once everything stored when the source started has been read (and no repair's
        re-read is out)."""
        return self._synced.is_set() and not self._refills_out

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    @property
    def error(self) -> BaseException | None:
        return self._error

    # ------------------------------------------------------------------ the poll side
    def _handle(self, item: QueueItem) -> None:
        if isinstance(item, CaughtUp):
            self._mark_synced()
        elif isinstance(item, Snapshots):
            self._take_snapshots(item)
        elif isinstance(item, StoredMsg):
            self._take_message(item)
        elif isinstance(item, Refilled):
            self._take_refilled(item)

    def _take_snapshots(self, item: Snapshots) -> None:
        for why in item.bad:
            self._bad("bad_snapshot_messages", why)
        for counter, why in item.refused:
            self._bad(counter, why)
        self._pacer.add(s for s in item.chosen.values() if self.only is None or s.source in self.only)
        self._snapshots_in = True
        self._sync_target = item.last_seq
        self._sync_when_paced = item.last_seq == 0 or item.synced
        if self._sync_when_paced and not self._pacer.pending:
            self._mark_synced()

    def _take_message(self, msg: StoredMsg) -> None:
        sseq = msg.stream_seq
        self._counters_extra["messages"] += 1
        self._last_sseq = max(self._last_sseq, sseq)
        if msg.ack is not None:
            self._handled.append((sseq, msg.ack))
        m = self._gate.check(msg.subject, msg.headers, msg.data, sseq)
        # stored before this feed started: old batches of a source with a newer snapshot are expected
        self.order.catching_up = self._sync_target is None or sseq <= self._sync_target
        if m is not None and (self.only is None or m.source in self.only):
            if m.kind == "live":
                self.order.live(LiveMsg(m.source, m.rank, m.seq, m.epoch, msg.data, sseq, self.clock(), msg.subject))
            elif m.kind == "part":
                self._gate.part(self._asm, m, msg.data)
            else:
                snap = self._gate.end(self._asm, m, sseq)
                if snap is not None:
                    self.order.snapshot(snap)
        if self._sync_target is not None and sseq >= self._sync_target:
            self._mark_synced()

    def _take_refilled(self, item: Refilled) -> None:
        """A repair's re-read: its live batches go through the gate and the ordering again."""
        r = item.refill
        self._refills_out = max(0, self._refills_out - 1)
        self._counters_extra["refill_messages"] = self._counters_extra.get("refill_messages", 0) + len(item.msgs)
        self.order.catching_up = True  # old batches, read again
        for msg in item.msgs:
            m = self._gate.check(msg.subject, msg.headers, msg.data, msg.stream_seq)
            if m is not None and m.kind == "live" and (m.source, m.rank) == (r.source, r.rank):
                self.order.live(
                    LiveMsg(m.source, m.rank, m.seq, m.epoch, msg.data, msg.stream_seq, self.clock(), msg.subject)
                )
        self.order.refilled(r.source, r.rank)

    def _ask_refill(self, r: Refill) -> None:
        """Have the NATS side read (source, rank)'s live subject again, up to what was handled."""
        self._counters_extra["refills"] = self._counters_extra.get("refills", 0) + 1
        self._refills_out += 1
        if self._lt is None or self._js is None:
            self._q.put(Refilled(r, ()))
            return
        self._lt.submit(self._refill(r, self._last_sseq))

    async def _refill(self, r: Refill, upto: int) -> None:
        msgs: list[StoredMsg] = []
        try:
            msgs = await read_subject(
                self._js, live_subject(self.stream, r.source, r.rank), start_seq=r.start, upto_seq=upto
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the repair falls back to the next snapshot
            log.warning("jetstream stream %s: re-reading %s rank %d failed: %s", self.stream, r.source, r.rank, exc)
        self._q.put(Refilled(r, tuple(msgs)))

    def _bad(self, counter: str, why: str) -> None:
        """Count a message that cannot be used; log the first, then one per _LOG_BAD_EVERY."""
        n = self._counters_extra[counter] = self._counters_extra.get(counter, 0) + 1
        if n % _LOG_BAD_EVERY == 1:
            log.warning("jetstream stream %s: message skipped (%s; %d %s so far)", self.stream, why, n, counter)

    def _ack_consumed(self, wait: bool = False) -> None:
        """Durable mode, once the last poll's output is consumed (next poll, stop): acknowledge the handled
        messages whose batches went out; one held for ordering (and any after it) waits, so a restart re-reads it."""
        if not self._handled or self._lt is None:
            return
        floor = self.order.lowest_pending_stream_seq()
        futs = []
        while self._handled and (floor is None or self._handled[0][0] < floor):
            _, msg = self._handled.popleft()
            futs.append(self._lt.submit(msg.ack()))
        if wait:
            for f in futs:
                f.result(2.0)

    def _give_back(self) -> None:
        """Durable mode, at stop: nak every message read and not acked (handled, or still queued)."""
        assert self._lt is not None
        msgs = [m for _, m in self._handled]
        self._handled.clear()
        while True:
            try:
                item = self._q.get(0)
            except queue.Empty:
                break
            if isinstance(item, StoredMsg) and item.ack is not None:
                msgs.append(item.ack)
        for f in [self._lt.submit(m.nak()) for m in msgs]:
            f.result(2.0)

    def _mark_synced(self) -> None:
        if not self._synced.is_set():
            self.cold_start_s = self.clock() - self._started_at
            self._synced.set()

    # ------------------------------------------------------------------ the NATS side
    def _open(self) -> None:
        if self._lt is None and not self._stop.is_set():
            self._started_at = self.clock()
            self._lt = LoopThread("kvevents-jetstream-feed")
            self._lt.submit(self._feed())

    async def _feed(self) -> None:
        from nats.js.api import ConsumerConfig, DeliverPolicy
        from nats.js.errors import NotFoundError

        nc = None
        try:
            nc = await connect(
                self.nats,
                on_unreachable=self.on_unreachable,
                give_up_after_s=self.give_up_after_s,
                stop=self._stop.is_set,
            )
            js = self._js = nc.jetstream()
            info = await stream_info(js, self.stream)
            self._connected.set()
            subjects = info.state.subjects or {}
            last = int(info.state.last_seq or 0)
            resumed = False
            if self.durable is not None:
                try:
                    await js.consumer_info(self.stream, self.durable)
                    resumed = True  # our own position survives: no snapshot, go on after the last ack
                except NotFoundError:
                    pass
            chosen: dict[tuple[str, int], Snapshot] = {}
            if self.start_time is not None:
                import datetime as dt

                when = dt.datetime.fromtimestamp(self.start_time, dt.timezone.utc)
                self._q.put(Snapshots({}, last, last == 0))
                cfg = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=when)
                return await self._reader(nc, js).read(cfg, self._synced.is_set)
            bad: list[str] = []
            refused: list[tuple[str, str]] = []
            if not resumed and any(s.endswith(".snap") for s in subjects):
                chosen = await self._read_snapshots(js, bad.append, lambda c, w: refused.append((c, w)))
            live = {(p[0], p[1]) for p in map(parse_subject, subjects) if p is not None and not p[2]}
            if self.only is not None:
                live = {k for k in live if k[0] in self.only}
                chosen = {k: v for k, v in chosen.items() if k[0] in self.only}
            if chosen and live <= set(chosen):
                start = min(s.start for s in chosen.values())
                cfg = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, start))
            else:  # a source without a stored snapshot: read all that is kept (it may start at seq 0)
                start = int(info.state.first_seq or 1)
                cfg = ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
            self._q.put(Snapshots(chosen, last, last < start or resumed, tuple(bad), tuple(refused)))
            if self.durable is not None:
                if chosen and not await self._snapshots_consumed():
                    return
                return await read_durable(js, self.stream, cfg, self.durable, self._q, self._stop.is_set)
            await self._reader(nc, js).read(cfg, self._synced.is_set)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # noqa: BLE001 - reported through .error
            self._error = exc
            (log.debug if isinstance(exc, NatsUnavailable) else log.warning)("jetstream source stopped: %s", exc)
        finally:
            if nc is not None:
                if self.durable is not None:  # the stopping side acks and naks on this connection first
                    await wait_for_event(self._released, RELEASE_WAIT_S)
                await close(nc)

    async def _snapshots_consumed(self) -> bool:
        """Durable mode: the consumer (our position) is made only once the cold start's snapshots
        were consumed, so a run stopped or killed before that leaves none behind and the next run
        takes the snapshots again instead of going on without them. False: stopped first."""
        while not self._snapshots_out.is_set():
            if self._stop.is_set():
                return False
            await wait_for_event(self._snapshots_out, 0.1)
        return True

    def _reader(self, nc: Any, js: Any) -> StreamReader:
        return StreamReader(nc, js, self.stream, self._q, self._stop.is_set, self._reads)

    async def _read_snapshots(
        self, js: Any, on_bad: Callable[[str], object], on_refused: Callable[[str, str], object]
    ) -> dict[tuple[str, int], Snapshot]:
        """Every stored snapshot message (a few per source), then the newest usable one of each
        (`on_bad` / `on_refused` hear why a message was skipped)."""
        stored = await read_all(js, f"{ROOT}.{self.stream}.*.*.snap", stop=self._stop.is_set)
        msgs = [(m.subject, m.headers, m.data, m.stream_seq) for m in stored]
        return pick_snapshots(msgs, on_bad, sign_key=self.sign_key, on_refused=on_refused)


JetStreamSource = JetStreamFeed  # the old name, kept for one release
