"""ZeroMQ subscriber: many publishers, per-(source, dp_rank) sequencing and repair.

Gaps are filled by replay over a DEALER, duplicates dropped, live batches buffered while a
replay is in flight; restarts and unrecoverable gaps become a `Reset` followed by snapshot
deliveries (or a counted clean start). Drive it with `poll()` or run it on its own thread.

Each SUB and replay DEALER is monitored: a connection dropped in its handshake, or a failed CURVE
handshake, names the likely misconfiguration in `status()` (`problem`, kvevents.zeromq.handshake);
what each source publishes (page size, hash chain) is learned from its first stored blocks
(kvevents.published).

Restarts are found without an epoch in the batch (schemas/README.md, "Restarts"): a seq that goes
backwards, or a KVE/DESCRIBE epoch that changed, asked on first contact, after the SUB reconnects
or a source comes back from stale, and before every gap replay. A publisher without a replay
endpoint (plain vLLM, SGLang) has only the first signal.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Sequence

import zmq
from zmq.utils.monitor import recv_monitor_message

from kvevents.feed import (
    START_MODES,
    Delivery,
    FeedLoop,
    Output,
    Reset,
    SourceStatus,
)
from kvevents.published import PublishedWatch
from kvevents.zeromq.framing import Reply
from kvevents.zeromq.handshake import LIVE, MONITOR_EVENTS, REPLAY, HandshakeWatch
from kvevents.zeromq.security import apply_client
from kvevents.zeromq.sequencer import DropDealer, Send, Sequencer
from kvevents.zeromq.source import Source, parse_source

__all__ = ["Source", "parse_source", "Delivery", "Reset", "SourceStatus", "Subscriber", "START_MODES", "Output"]

log = logging.getLogger("kvevents.zeromq.subscriber")


def _checked_sources(sources: Sequence[Source | str], start: str, metrics_port: int | None) -> list[Source]:
    """The Subscriber's sources as Source objects, after its arguments are checked (ValueError)."""
    if not sources:
        raise ValueError("Subscriber: at least one source is needed")
    if start not in START_MODES:
        raise ValueError(f"Subscriber: start must be one of {', '.join(START_MODES)}, got {start!r}")
    srcs = [s if isinstance(s, Source) else Source(s) for s in sources]
    names = [str(s.name) for s in srcs]
    if len(set(names)) != len(names):
        raise ValueError(f"Subscriber: source names must be unique, got {names}")
    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        raise ValueError(f"Subscriber: metrics_port must be in 0..65535, got {metrics_port}")
    return srcs


class Subscriber:
    """Receives from many publishers; outputs Delivery and Reset objects in per-stream order.

    A thin socket loop (a SUB per source, a DEALER per source for repair requests, a monitor of
    the SUB's connections) around a `kvevents.zeromq.sequencer.Sequencer`, which decides.
    """

    def __init__(
        self,
        sources: Sequence[Source | str],
        *,
        topic: str = "",
        on_delivery: Callable[[Delivery], object] | None = None,
        on_reset: Callable[[Reset], object] | None = None,
        stale_after_s: float = 5.0,
        request_timeout_s: float = 2.0,
        request_budget_s: float = 10.0,
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
        `request_timeout_s`: the longest wait for each reply; `request_budget_s`: the longest a replay
        or snapshot may take in all, however it trickles (then it is abandoned and the resync goes on).
        `max_ranks`: dp ranks tracked per source; batches of further ranks are counted
        (`dropped_ranks`) and dropped, so a publisher cannot make a stream (and a repair) per rank.
        `start`: where each stream begins on first contact (START_MODES; a Source may override it)."""
        srcs = _checked_sources(sources, start, metrics_port)
        self.topic = topic
        self.on_delivery = on_delivery
        self.on_reset = on_reset
        self.stale_after_s = stale_after_s
        self.hwm = hwm
        self.clock = clock
        self.log_every = max(1, log_every)
        self.sequencer = Sequencer(
            srcs, clock=clock, request_timeout_s=request_timeout_s, request_budget_s=request_budget_s,
            max_attempts=max_attempts,
            max_buffer=max_buffer, max_ranks=max_ranks, start=start, stale_after_s=stale_after_s,
            log_every=log_every,
        )  # fmt: skip
        self._sources = {str(s.name): s for s in srcs}
        self._init_sockets(context)
        self._metrics_port = metrics_port
        if metrics_port is not None:
            self._metrics_port = self._serve_metrics(metrics_port)

    def _init_sockets(self, context: zmq.Context | None) -> None:
        """No socket is open yet: `_open` makes them (a SUB, a DEALER and their monitors per source)."""
        self._ctx = context or zmq.Context.instance()
        self._subs: dict[str, zmq.Socket] = {}
        self._dealers: dict[str, zmq.Socket] = {}
        self._monitors: dict[str, zmq.Socket] = {}
        self._dealer_monitors: dict[str, zmq.Socket] = {}
        self._handshakes = HandshakeWatch()
        self._published = PublishedWatch()
        self._by_sock: dict[zmq.Socket, tuple[str, str]] = {}  # socket -> (source name, "sub"|"dealer"|"monitor")
        self._poller: zmq.Poller | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False

    def _serve_metrics(self, port: int) -> int:
        """Serve /metrics on `port` (0: a free one) and return it; ValueError when it cannot be bound."""
        from kvevents.zeromq import metrics

        try:
            return metrics.serve_subscriber(self, port, ",".join(self._sources))  # type: ignore[arg-type]
        except OSError as exc:  # nothing is open yet: no socket or thread to release
            raise ValueError(f"metrics port {port}: {exc}") from None

    # ------------------------------------------------------------------ public API
    @property
    def metrics_port(self) -> int | None:
        """The port serving /metrics: the metrics_port given, or the free one picked for 0."""
        return self._metrics_port

    @property
    def start_mode(self) -> str:
        return self.sequencer.start_mode

    def start(self) -> Subscriber:
        """Run on a background thread, calling on_delivery / on_reset (on_delivery is required).

        The sockets are opened here, so a bad endpoint is a ValueError now, not a thread error later.
        """
        if self.on_delivery is None:
            raise ValueError("Subscriber.start: on_delivery is required in thread mode (or drive poll())")
        if self._closed:
            raise ValueError("Subscriber.start: the subscriber is stopped")
        self._open()
        if self._thread is None:
            loop = FeedLoop(
                self.poll, self.on_delivery, self.on_reset, stop=self._stop, counters=self.sequencer.counters,
                logger=log, name="kvevents-subscriber", log_every=self.log_every, on_exit=self._close,
            )  # fmt: skip
            self._thread = loop.start()
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

    def __enter__(self) -> Subscriber:
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

    def offer(self, name: str, reply: Reply) -> None:
        """One reply to a replay of source `name` made apart from this subscriber (a relay's warm
        start reads the engine's ring before its SUB joins): its batch is sequenced as a live one
        and its framing is the source's. Before start() only (the sequencer is then the caller's);
        what it makes deliverable comes out of the next poll."""
        if name not in self._sources:
            raise ValueError(f"Subscriber.offer: no source named {name!r}")
        if self._thread is not None or self._closed:
            raise ValueError("Subscriber.offer: only before start()")
        self.sequencer.on_offered(name, reply)

    def status(self) -> dict[str, SourceStatus]:
        """Per source: where its first rank stands, when it was last heard (wall clock), staleness,
        what it publishes (page size, hash chain) and a likely misconfiguration its sockets saw."""
        out = self.sequencer.status()
        for name, st in out.items():
            self._published.fill(st).problem = self._handshakes.problem(name)
        return out

    def counters(self) -> dict[str, int]:
        return dict(self.sequencer.counters)

    def open_sockets(self) -> int:
        """How many sockets are open now (SUBs, DEALERs, monitors): 0 once stopped."""
        return len(self._subs) + len(self._dealers) + len(self._monitors) + len(self._dealer_monitors)

    # ------------------------------------------------------------------ the loop
    def _poll(self, timeout_s: float) -> list[Output]:
        self._open()
        assert self._poller is not None
        seq = self.sequencer
        wait = seq.wait_s(timeout_s)
        ready = self._poller.poll(int(wait * 1000)) if wait > 0 else self._poller.poll(0)
        out: list[Output] = []
        for sock, _ in ready:
            name, kind = self._by_sock.get(sock, ("", ""))
            if not name:
                continue
            if name in self._monitors and kind in ("sub", "monitor"):
                self._read_monitor(name)  # a reconnect is noticed before the new connection's data
                if kind == "monitor":
                    continue
            if kind == "dealer-monitor":
                self._read_dealer_monitor(name)
                continue
            for _ in range(2000):
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.ZMQError:  # Again: drained
                    break
                if kind == "sub":
                    seq.on_live(name, frames, time.time())
                elif self._dealers.get(name) is sock:
                    seq.on_reply(name, frames)
                else:
                    break
            out += self._run_commands()
        seq.tick()
        out += self._run_commands()
        self._published.observe_all(out)
        return out

    def _run_commands(self) -> list[Output]:
        """Carry out the sequencer's socket commands, in order; return its outputs."""
        out, cmds = self.sequencer.take()
        for cmd in cmds:
            if isinstance(cmd, Send):
                dealer = self._dealers.get(cmd.source) or self._new_dealer(cmd.source)
                try:
                    dealer.send_multipart([b"", cmd.body], zmq.NOBLOCK)
                except zmq.ZMQError as exc:  # the request times out and is retried
                    log.debug("source %s: request not sent: %s", cmd.source, exc)
            elif isinstance(cmd, DropDealer):
                self._drop_dealer(cmd.source)
        return out

    # ------------------------------------------------------------------ sockets
    def _open(self) -> None:
        """Open every SUB (and check the replay endpoints); a bad endpoint is a ValueError, nothing stays open."""
        if self._poller is not None:
            return
        self._poller = zmq.Poller()
        for name, src in self._sources.items():
            sub = self._ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.RCVHWM, self.hwm)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RECONNECT_IVL, 100)
            sub.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)  # ZeroMQ retries forever, backing off
            sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
            apply_client(sub, src.curve)
            self._subs[name] = sub
            self._by_sock[sub] = (name, "sub")
            self._poller.register(sub, zmq.POLLIN)
            if not src.endpoint.startswith("inproc://"):
                # connection events: a reconnect may be a restarted publisher, to be asked DESCRIBE;
                # handshake events: a likely misconfiguration (kvevents.zeromq.handshake)
                mon = self._monitors[name] = sub.get_monitor_socket(MONITOR_EVENTS)
                self._by_sock[mon] = (name, "monitor")
                self._poller.register(mon, zmq.POLLIN)
                self._handshakes.watch(name, LIVE, src.endpoint, src.curve is not None)
            what, ep = "endpoint", src.endpoint
            try:
                if src.bind:
                    sub.bind(ep)
                else:
                    sub.connect(ep)
                if src.replay_endpoint:  # checked now; the DEALER itself is made at the first request
                    what, ep = "replay endpoint", src.replay_endpoint
                    probe = self._ctx.socket(zmq.DEALER)
                    probe.setsockopt(zmq.LINGER, 0)
                    apply_client(probe, src.curve)
                    try:
                        probe.connect(ep)
                    finally:
                        probe.close(0)
            except zmq.ZMQError as exc:
                self._close_sockets()
                self._poller = None
                raise ValueError(f"source {name!r}: cannot use {what} {ep!r}: {exc}") from None

    def _new_dealer(self, name: str) -> zmq.Socket:
        """A fresh DEALER (a timed-out request's late replies die with the old one)."""
        self._drop_dealer(name)
        src = self._sources[name]
        d = self._ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.setsockopt(zmq.RCVHWM, 0)
        d.setsockopt(zmq.RECONNECT_IVL, 100)
        d.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
        apply_client(d, src.curve)
        mon = None if src.replay_endpoint.startswith("inproc://") else d.get_monitor_socket(MONITOR_EVENTS)  # type: ignore[union-attr]
        try:
            d.connect(src.replay_endpoint)  # type: ignore[arg-type]
        except zmq.ZMQError:
            if mon is not None:
                d.disable_monitor()
                mon.close(0)
            d.close(0)
            raise
        self._dealers[name] = d
        self._by_sock[d] = (name, "dealer")
        assert self._poller is not None
        self._poller.register(d, zmq.POLLIN)
        if mon is not None:
            self._dealer_monitors[name] = mon
            self._by_sock[mon] = (name, "dealer-monitor")
            self._poller.register(mon, zmq.POLLIN)
            self._handshakes.watch(name, REPLAY, str(src.replay_endpoint), src.curve is not None)
        return d

    def _drop_dealer(self, name: str) -> None:
        d = self._dealers.pop(name, None)
        mon = self._dealer_monitors.pop(name, None)
        if mon is not None:
            self._read_dealer_monitor(name, mon)  # what it saw before it goes
            if self._poller is not None:
                self._poller.unregister(mon)
            self._by_sock.pop(mon, None)
            if d is not None and not d.closed:
                d.disable_monitor()
            mon.close(0)
        if d is not None:
            if self._poller is not None:
                self._poller.unregister(d)
            self._by_sock.pop(d, None)
            d.close(0)

    def _read_monitor(self, name: str) -> None:
        """Drain the SUB's events: a connection made or accepted tells the sequencer (a publisher
        with a replay endpoint may be a new process); every event goes to the handshake watch."""
        mon = self._monitors[name]
        replay = bool(self._sources[name].replay_endpoint)
        while True:
            try:
                msg = recv_monitor_message(mon, zmq.NOBLOCK)
            except zmq.ZMQError:  # Again: drained
                return
            event = int(msg["event"])
            self._handshakes.event(name, LIVE, event, int(msg["value"]))
            if replay and event & (zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED):
                self.sequencer.on_connect(name)

    def _read_dealer_monitor(self, name: str, mon: zmq.Socket | None = None) -> None:
        """Drain the replay DEALER's events into the handshake watch."""
        mon = mon or self._dealer_monitors.get(name)
        while mon is not None:
            try:
                msg = recv_monitor_message(mon, zmq.NOBLOCK)
            except zmq.ZMQError:  # Again: drained
                return
            self._handshakes.event(name, REPLAY, int(msg["event"]), int(msg["value"]))

    def _close_sockets(self) -> None:
        for name in list(self._dealers):
            self._drop_dealer(name)
        for name, mon in list(self._monitors.items()):
            sub = self._subs.get(name)
            if sub is not None and not sub.closed:
                sub.disable_monitor()
            mon.close(0)
        self._monitors.clear()
        for sub in self._subs.values():
            sub.close(0)
        self._subs.clear()
        self._by_sock.clear()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._metrics_port is not None:
            from kvevents.zeromq import metrics

            metrics.forget_subscriber(self)
        self._close_sockets()
