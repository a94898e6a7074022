"""ZeroMQ subscriber: many publishers, per-(source, dp_rank) sequencing and repair.

Gaps are filled by replay over a DEALER, duplicates dropped, live batches buffered while a
replay is in flight; restarts and unrecoverable gaps become a `Reset` followed by snapshot
deliveries (or a counted clean start). Drive it with `poll()` or run it on its own thread.

Restarts are found without an epoch in the batch (schemas/README.md, "Restarts"): a seq that goes
backwards, or a KVE/DESCRIBE epoch that changed, asked on first contact, after the SUB reconnects
or a source comes back from stale, and before every gap replay. A publisher without a replay
endpoint (plain vLLM, SGLang) has only the first signal.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence, Union

import zmq

from kvevents.errors import DecodeError
from kvevents.events import KVEventBatch, decode_batch
from kvevents.transport.repair import RepairMixin
from kvevents.transport.security import CurveClient, apply_client
from kvevents.transport.streams import Item, SourceState as _Src, Stream
from zmq.utils.monitor import recv_monitor_message
from kvevents.transport.wire import SEQ, check_endpoint

__all__ = ["Source", "parse_source", "Delivery", "Reset", "SourceStatus", "Subscriber", "START_MODES"]

# Where a stream begins on first contact. oldest: replay from seq 0 (the publisher's kept history);
# snapshot: Reset("first") and the publisher's KVE/SNAPSHOT, then the batches after it (no snapshot:
# a counted clean start); now: the first live batch, without replay and without counting a loss.
START_MODES: tuple[str, ...] = ("oldest", "snapshot", "now")

log = logging.getLogger("kvevents.subscriber")

_COUNTERS = (
    "live", "replayed", "snapshot_batches", "heartbeats", "duplicates", "gaps", "replays_requested",
    "replay_timeouts", "unrecoverable_gaps", "restarts", "resets", "snapshots_requested", "snapshots_applied",
    "snapshot_failures", "losses", "bad_payloads", "bad_frames", "stale_buffered", "buffer_overflows",
    "stale_sources", "callback_errors", "loop_errors", "describes_requested", "describe_timeouts", "reconnects",
    "stale_returns", "dropped_ranks",
)


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
            raise ValueError(f"source {self.name or self.endpoint!r}: start must be one of {', '.join(START_MODES)}, got {self.start!r}")
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


Output = Union[Delivery, Reset]


class Subscriber(RepairMixin):
    """Receives from many publishers; outputs Delivery and Reset objects in per-stream order."""

    def __init__(
        self,
        sources: Sequence[Source | str],
        *,
        topic: str = "",
        on_delivery: Callable[[Delivery], object] | None = None,
        on_reset: Callable[[Reset], object] | None = None,
        stale_after_s: float = 5.0,
        request_timeout_s: float = 2.0,
        max_attempts: int = 3,
        max_buffer: int = 100000,
        log_every: int = 100,
        hwm: int = 100000,
        metrics_port: int | None = None,
        context: zmq.Context | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_ranks: int = 64,
        start: str = "oldest",
    ) -> None:
        """`clock` (monotonic seconds) times requests, backoff and staleness; tests may inject one.
        `max_ranks`: dp ranks tracked per source; batches of further ranks are counted
        (`dropped_ranks`) and dropped, so a publisher cannot make a stream (and a repair) per rank.
        `start`: where each stream begins on first contact (START_MODES; a Source may override it)."""
        if not sources:
            raise ValueError("Subscriber: at least one source is needed")
        if start not in START_MODES:
            raise ValueError(f"Subscriber: start must be one of {', '.join(START_MODES)}, got {start!r}")
        self.start_mode = start
        srcs = [s if isinstance(s, Source) else Source(s) for s in sources]
        names = [s.name for s in srcs]
        if len(set(names)) != len(names):
            raise ValueError(f"Subscriber: source names must be unique, got {names}")
        if metrics_port is not None and not 0 <= metrics_port <= 65535:
            raise ValueError(f"Subscriber: metrics_port must be in 0..65535, got {metrics_port}")
        self.topic = topic
        self.on_delivery = on_delivery
        self.on_reset = on_reset
        self.stale_after_s = stale_after_s
        self.request_timeout_s = request_timeout_s
        self.max_attempts = max(1, max_attempts)
        self.max_buffer = max_buffer
        self.log_every = max(1, log_every)
        self.hwm = hwm
        self._ctx = context or zmq.Context.instance()
        self._srcs = [_Src(s) for s in srcs]
        self._by_sock: dict[zmq.Socket, tuple[_Src, bool]] = {}
        self._poller: zmq.Poller | None = None
        self._counters = dict.fromkeys(_COUNTERS, 0)
        self._out: list[Output] = []
        self.clock = clock
        self.max_ranks = max_ranks
        self._started_at = clock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False
        self._metrics_port = metrics_port
        if metrics_port is not None:
            from kvevents import metrics

            try:
                self._metrics_port = metrics.serve_subscriber(self, metrics_port, ",".join(names))  # type: ignore[arg-type]
            except OSError as exc:  # nothing is open yet: no socket or thread to release
                raise ValueError(f"metrics port {metrics_port}: {exc}") from None

    # ------------------------------------------------------------------ public API
    @property
    def metrics_port(self) -> int | None:
        """The port serving /metrics: the metrics_port given, or the free one picked for 0."""
        return self._metrics_port

    def start(self) -> "Subscriber":
        """Run on a background thread, calling on_delivery / on_reset (on_delivery is required).

        The sockets are opened here, so a bad endpoint is a ValueError now, not a thread error later.
        """
        if self.on_delivery is None:
            raise ValueError("Subscriber.start: on_delivery is required in thread mode (or drive poll())")
        if self._closed:
            raise ValueError("Subscriber.start: the subscriber is stopped")
        self._open()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kvevents-subscriber", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread (if any) and close every socket."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("subscriber thread did not stop within %.1fs", timeout)
                return
        self._close()

    def __enter__(self) -> "Subscriber":
        return self.start() if self.on_delivery is not None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def poll(self, timeout_s: float = 0.0) -> list[Output]:
        """Wait up to timeout_s for messages; return what became deliverable (in order).

        Not while `start()`'s thread runs (it polls): a ValueError then.
        """
        if self._closed:
            raise ValueError("Subscriber.poll: the subscriber is stopped")
        if self._thread is not None and threading.current_thread() is not self._thread:
            raise ValueError("Subscriber.poll: start() runs the poll loop on its own thread; use on_delivery")
        return self._poll(timeout_s)

    def _poll(self, timeout_s: float) -> list[Output]:
        self._open()
        assert self._poller is not None
        now = self.clock()
        wait = timeout_s
        for s in self._srcs:
            if s.active is not None:
                wait = min(wait, max(0.0, s.active.deadline - now))
            elif s.queue:
                wait = min(wait, max(0.0, s.not_before - now))
        ready = self._poller.poll(int(wait * 1000)) if wait > 0 else self._poller.poll(0)
        for sock, _ in ready:
            src, is_sub = self._by_sock.get(sock, (None, True))
            if src is None:
                continue
            if src.monitor is not None and (is_sub or sock is src.monitor):
                self._read_monitor(src)  # a reconnect is noticed before the new connection's data
                if not is_sub:
                    continue
            for _ in range(2000):
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                except zmq.ZMQError:
                    break
                if is_sub:
                    self._on_live(src, frames)
                elif sock is src.dealer:
                    self._on_reply(src, frames)
                else:
                    break
        now = self.clock()
        for s in self._srcs:
            if s.active is not None and now >= s.active.deadline:
                self._on_timeout(s)
            if s.active is None:
                self._pump(s)
            self._check_stale(s, now)
        out, self._out = self._out, []
        return out

    def status(self) -> dict[str, SourceStatus]:
        """Per source: where its first rank stands, when it was last heard (wall clock), staleness."""
        now = self.clock()
        out = {}
        for s in self._srcs:
            streams = list(s.streams.items())  # one C-level copy: safe while the poll thread runs
            ranks = {r: st.next_seq for r, st in streams}
            first = streams[0][1] if streams else None
            out[s.name] = SourceStatus(
                name=s.name,
                endpoint=s.source.endpoint,
                next_seq=first.next_seq if first else None,
                epoch=first.epoch if first else None,
                last_heard=s.last_heard,
                stale=self._is_stale(s, now),
                ranks=ranks,
                busy=any(st.busy for _, st in streams),
            )
        return out

    def counters(self) -> dict[str, int]:
        return dict(self._counters)

    # ------------------------------------------------------------------ sockets
    def _open(self) -> None:
        """Open every SUB (and check the replay endpoints); a bad endpoint is a ValueError, nothing stays open."""
        if self._poller is not None:
            return
        self._poller = zmq.Poller()
        for s in self._srcs:
            sub = self._ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.RCVHWM, self.hwm)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RECONNECT_IVL, 100)
            sub.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)  # ZeroMQ retries forever, backing off
            sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
            apply_client(sub, s.source.curve)
            s.sub = sub
            self._by_sock[sub] = (s, True)
            self._poller.register(sub, zmq.POLLIN)
            if s.source.replay_endpoint and not s.source.endpoint.startswith("inproc://"):
                # connection events: a reconnect may be a restarted publisher, to be asked DESCRIBE
                s.monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED)
                self._by_sock[s.monitor] = (s, False)
                self._poller.register(s.monitor, zmq.POLLIN)
            what, ep = "endpoint", s.source.endpoint
            try:
                if s.source.bind:
                    sub.bind(ep)
                else:
                    sub.connect(ep)
                if s.source.replay_endpoint:  # checked now; the DEALER itself is made at the first request
                    what, ep = "replay endpoint", s.source.replay_endpoint
                    probe = self._ctx.socket(zmq.DEALER)
                    probe.setsockopt(zmq.LINGER, 0)
                    apply_client(probe, s.source.curve)
                    try:
                        probe.connect(ep)
                    finally:
                        probe.close(0)
            except zmq.ZMQError as exc:
                self._unopen()
                raise ValueError(f"source {s.name!r}: cannot use {what} {ep!r}: {exc}") from None

    def _unopen(self) -> None:
        """Undo a failed _open: close what was opened, keep the subscriber as it was."""
        for s in self._srcs:
            self._drop_dealer(s)
            self._drop_monitor(s)
            if s.sub is not None:
                s.sub.close(0)
                s.sub = None
        self._by_sock.clear()
        self._poller = None

    def _new_dealer(self, s: _Src) -> zmq.Socket:
        """A fresh DEALER (a timed-out request's late replies die with the old one)."""
        self._drop_dealer(s)
        d = self._ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.setsockopt(zmq.RCVHWM, 0)
        d.setsockopt(zmq.RECONNECT_IVL, 100)
        d.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
        apply_client(d, s.source.curve)
        try:
            d.connect(s.source.replay_endpoint)  # type: ignore[arg-type]
        except zmq.ZMQError:
            d.close(0)
            raise
        s.dealer = d
        self._by_sock[d] = (s, False)
        assert self._poller is not None
        self._poller.register(d, zmq.POLLIN)
        return d

    def _drop_monitor(self, s: _Src) -> None:
        if s.monitor is not None:
            if s.sub is not None and not s.sub.closed:
                s.sub.disable_monitor()
            s.monitor.close(0)
            s.monitor = None

    def _read_monitor(self, s: _Src) -> None:
        """Drain connection events: every connection after the first is a reconnect."""
        mon = s.monitor
        assert mon is not None
        while True:
            try:
                recv_monitor_message(mon, zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            s.connects += 1
            if s.connects > 1:
                self._counters["reconnects"] += 1
                s.describes = None if s.describes is False else s.describes  # ask a new process again
                s.unverify()

    def _drop_dealer(self, s: _Src) -> None:
        if s.dealer is not None:
            if self._poller is not None:
                self._poller.unregister(s.dealer)
            self._by_sock.pop(s.dealer, None)
            s.dealer.close(0)
            s.dealer = None

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._metrics_port is not None:
            from kvevents import metrics

            metrics.forget_subscriber(self)
        for s in self._srcs:
            self._drop_dealer(s)
            self._drop_monitor(s)
            if s.sub is not None:
                s.sub.close(0)
                s.sub = None
        self._by_sock.clear()

    def _run(self) -> None:
        errors = 0
        while not self._stop.is_set():
            try:
                items = self.poll(0.05)
                errors = 0
            except Exception:  # noqa: BLE001 - the thread must not die silently, nor spin on an error
                errors += 1
                self._counters["loop_errors"] += 1
                if errors % self.log_every == 1 or self.log_every == 1:
                    log.exception("subscriber loop error (%d in a row, logged once per %d)", errors, self.log_every)
                self._stop.wait(min(5.0, 0.05 * 2 ** min(errors - 1, 7)))  # back off: 50 ms .. 5 s
                continue
            for item in items:
                try:
                    if isinstance(item, Delivery):
                        self.on_delivery(item)  # type: ignore[misc]
                    elif self.on_reset is not None:
                        self.on_reset(item)
                except Exception:  # noqa: BLE001 - a consumer bug must not stop the feed
                    self._counters["callback_errors"] += 1
                    log.exception("subscriber callback failed")
        self._close()

    # ------------------------------------------------------------------ live path
    def _bad(self, what: str, detail: str, key: str = "bad_payloads") -> None:
        n = self._counters[key] = self._counters[key] + 1
        if n % self.log_every == 1 or self.log_every == 1:
            log.warning("%s (%d so far, logged once per %d): %s", what, n, self.log_every, detail)

    def _on_live(self, s: _Src, frames: list[bytes]) -> None:
        now = time.time()
        s.heard(now, self.clock())
        if s.stale:  # back from a silence: the publisher may be a new process
            s.stale = False
            self._counters["stale_returns"] += 1
            log.info("source %s: heard again after being stale", s.name)
            s.unverify()
        if len(frames) != 3 or len(frames[1]) != 8:
            return self._bad(f"source {s.name}: malformed live message", f"{len(frames)} frames", "bad_frames")
        topic_b, seq_b, payload = frames
        try:
            batch = decode_batch(payload)
        except DecodeError as exc:
            return self._bad(f"source {s.name}: undecodable payload", str(exc))
        seq = SEQ.unpack(seq_b)[0]
        rank = batch.data_parallel_rank
        st = s.streams.get(rank)
        if st is None:
            if len(s.streams) >= self.max_ranks:
                return self._bad(f"source {s.name}: more than {self.max_ranks} dp ranks", f"rank {rank}", "dropped_ranks")
            # first contact: "now" takes the first live batch as the start, no loss counted
            st = s.streams[rank] = Stream(rank, clean_start=(s.source.start or self.start_mode) == "now")
        if not batch.events:
            self._counters["heartbeats"] += 1
        restart = (st.epoch is not None and batch.epoch is not None and batch.epoch != st.epoch) or (
            st.last_live_seq is not None and seq < st.last_live_seq
        )
        item = Item(seq, topic_b, payload, batch, now)
        if restart:
            self._counters["restarts"] += 1
            self._restart(s, st, batch.epoch, "restart", seq)
        st.last_live_seq = seq
        if st.busy:
            if len(st.buffer) >= self.max_buffer:
                self._counters["buffer_overflows"] += 1
                st.buffer.clear()  # replay will have to cover it again
            st.buffer.append(item)
            return
        self._sequence(s, st, item)

    def _sequence(self, s: _Src, st: Stream, it: Item) -> None:
        """Apply one live item to a non-busy stream: deliver, drop as duplicate, or start a repair."""
        if it.batch.epoch is not None and st.epoch is not None and it.batch.epoch != st.epoch:
            self._counters["stale_buffered"] += 1
            return
        if not st.verified and s.can_describe:  # confirm the epoch before applying anything more
            self._request(s, st, "describe", 0)
            st.buffer.append(it)
            return
        if st.next_seq is None:
            if it.batch.epoch is not None or not st.verified:
                st.epoch = it.batch.epoch
            if st.clean_start or it.seq == 0 or not s.source.replay_endpoint:
                if it.seq > 0 and not st.clean_start:
                    self._counters["losses"] += 1  # joined late with no replay: what came before is lost
                st.clean_start = False
                st.next_seq = it.seq
            elif (s.source.start or self.start_mode) == "snapshot":  # first contact: the publisher's state
                self._emit_reset(s, st, "first")
                self._request(s, st, "snapshot", 0)
                st.buffer.append(it)
                return
            else:
                self._request(s, st, "replay", 0, first=True)
                st.buffer.append(it)
                return
        if it.seq < st.next_seq:
            self._counters["duplicates"] += 1
            return
        if it.seq > st.next_seq:
            self._counters["gaps"] += 1
            if s.source.replay_endpoint:
                self._request(s, st, "replay", st.next_seq)
                st.buffer.append(it)
                return
            self._counters["unrecoverable_gaps"] += 1
            self._counters["losses"] += 1
            self._emit_reset(s, st, "gap")
            st.next_seq = it.seq
        self._deliver(s, st, it, "live")
        st.next_seq = it.seq + 1

    def _deliver(self, s: _Src, st: Stream, it: Item, kind: str, seq: int | None = None) -> None:
        self._counters[{"live": "live", "replay": "replayed", "snapshot": "snapshot_batches"}[kind]] += 1
        self._out.append(
            Delivery(
                s.name, it.seq if seq is None else seq, it.batch, it.payload, it.topic.decode("utf-8", "replace"),
                kind, st.rank, st.epoch if it.batch.epoch is None else it.batch.epoch, s.source.endpoint,
                it.received_at,
            )
        )

    def _emit_reset(self, s: _Src, st: Stream, reason: str) -> None:
        self._counters["resets"] += 1
        self._out.append(Reset(s.name, st.rank, reason, st.epoch))

    def _restart(self, s: _Src, st: Stream, epoch: int | None, reason: str, seq: int) -> None:
        """The publisher restarted: tell the consumer, forget the stream, resync by snapshot."""
        st.buffer.clear()
        st.busy = False
        st.last_live_seq = None
        s.queue = deque(r for r in s.queue if r.stream is not st)
        st.epoch = epoch
        st.next_seq = None
        if s.active is not None and s.active.stream is st:
            s.active.aborting = True
            s.active.superseded = True
        self._emit_reset(s, st, reason)
        if s.source.replay_endpoint and seq > 0:
            self._request(s, st, "snapshot", 0)
        else:
            if seq > 0:
                self._counters["losses"] += 1
            st.clean_start = True

    def _drain(self, s: _Src, st: Stream) -> None:
        """Re-feed live items buffered during a repair; a new gap starts the next repair."""
        st.busy = False
        items, st.buffer = st.buffer, []
        for it in items:
            if st.busy:
                st.buffer.append(it)
            else:
                self._sequence(s, st, it)

    # ------------------------------------------------------------------ staleness
    def _is_stale(self, s: _Src, now: float) -> bool:
        ref = s.heard_at if s.heard_at is not None else self._started_at
        return now - ref > self.stale_after_s

    def _check_stale(self, s: _Src, now: float) -> None:
        stale = self._is_stale(s, now)
        if stale and not s.stale:
            self._counters["stale_sources"] += 1
            log.warning("source %s: nothing heard for %.1fs (stale)", s.name, self.stale_after_s)
        s.stale = stale
