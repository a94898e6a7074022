"""The EventFeed contract (kvevents/feed.py; what RouterService consumes), one suite run over every
implementation: the ZeroMQ `Subscriber` and the JetStream `JetStreamFeed` (a real nats-server and
a bridge). Real publishers on 127.0.0.1 fed by simulated engines; the consumer applies what it is
handed as RouterService does and checks the order rules as it goes.

The rules: per source, deliveries come once each in engine seq order (live and replayed ones with
consecutive seqs, a snapshot's batches all at its seq S and the next delivery at S + 1); a Reset
drops the source and what follows rebuilds it; a publisher restart is a Reset; what the consumer
holds equals the engine's cache; `status()` and `counters()` describe the stream; `stop()` may be
called twice and ends the feed's thread; `poll()` after it is a ValueError.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import pytest

from kvevents.consumers.indexer import BlockIndex
from kvevents.feed import Delivery, Reset, SourceStatus
from kvevents.jetstream.bridge import Bridge
from kvevents.jetstream.feed import JetStreamFeed
from kvevents.jetstream.link import NatsOptions
from kvevents.zeromq.subscriber import Subscriber
from tests.helpers.jetstream import Engine
from tests.helpers.wait import wait_until

_streams = itertools.count(1)


class Consumer:
    """Applies a feed's output as RouterService does, checking the order rules per source."""

    def __init__(self) -> None:
        self.index = BlockIndex()
        self.lock = threading.Lock()
        self.next: dict[str, int | None] = {}  # source -> the seq the next delivery must carry
        self.applied: dict[str, int] = {}  # source -> last seq applied since its last reset
        self.resets: list[Reset] = []
        self.kinds: Counter[str] = Counter()

    def take(self, items: Sequence[Delivery | Reset]) -> None:
        for item in items:
            if isinstance(item, Delivery):
                self.on_delivery(item)
            else:
                self.on_reset(item)

    def on_reset(self, r: Reset) -> None:
        assert isinstance(r, Reset) and r.reason in ("first", "gap", "restart"), r
        with self.lock:
            rank = r.dp_rank if isinstance(r.dp_rank, int) and r.dp_rank >= 0 else 0
            self.index.drop_source(r.source, rank)
            self.resets.append(r)
            self.next[r.source] = None
            self.applied.pop(r.source, None)

    def on_delivery(self, d: Delivery) -> None:
        assert isinstance(d, Delivery) and d.kind in ("live", "replay", "snapshot"), d
        assert d.payload and d.batch is not None
        with self.lock:
            want = self.next.get(d.source)
            if d.kind == "snapshot":  # every batch of one snapshot carries its seq S
                assert want is None or want == d.seq + 1, (d.source, d.seq, want)
            else:
                assert want is None or d.seq == want, f"{d.source}: seq {d.seq} delivered, {want} expected"
            self.next[d.source] = d.seq + 1
            self.index.apply(d.source, d.batch)
            self.applied[d.source] = d.seq
            self.kinds[d.kind] += 1

    def holds(self, engine: Engine) -> bool:
        """Applied the engine's last seq and holds exactly its cache."""
        with self.lock:
            return self.applied.get(engine.name, -1) >= engine.last_seq() and (
                +self.index.copies(engine.name) == engine.truth()
            )


class ZeroMQRig:
    """Engines' publishers read directly by one Subscriber."""

    thread_names = ("kvevents-subscriber",)

    def attach(self, engine: Engine) -> None:
        """Nothing stands between a publisher and the Subscriber."""

    def feed(self, engines: Sequence[Engine], **callbacks: Any) -> Subscriber:
        return Subscriber([e.source for e in engines], request_timeout_s=0.5, **callbacks)

    def close(self) -> None:
        """Nothing to stop."""


class JetStreamRig:
    """Engines' publishers forwarded by a bridge into a JetStream stream of this test's own."""

    thread_names = ("kvevents-jetstream",)

    def __init__(self, url: str) -> None:
        self.nats = NatsOptions(url)
        self.stream = f"FEED{next(_streams)}"
        self.bridges: list[Bridge] = []

    def attach(self, engine: Engine) -> None:
        b = Bridge([engine.source], self.stream, self.nats, snapshot_every_s=0.3, request_timeout_s=0.5).start()
        self.bridges.append(b)
        assert b.wait_connected(10), "the bridge never reached nats-server"

    def feed(self, engines: Sequence[Engine], **callbacks: Any) -> JetStreamFeed:
        return JetStreamFeed(self.nats, self.stream, reorder_wait_s=0.3, **callbacks)

    def close(self) -> None:
        for b in self.bridges:
            b.stop()


@pytest.fixture(params=["zeromq", pytest.param("jetstream", marks=pytest.mark.nats)])
def rig(request: pytest.FixtureRequest) -> Iterator[ZeroMQRig | JetStreamRig]:
    r: ZeroMQRig | JetStreamRig
    r = ZeroMQRig() if request.param == "zeromq" else JetStreamRig(request.getfixturevalue("shared_nats_server").url)
    yield r
    r.close()


@pytest.fixture
def engine(rig: ZeroMQRig | JetStreamRig) -> Iterator[Engine]:
    e = Engine("w0", 31)
    rig.attach(e)
    e.step(20)
    yield e
    e.close()


def _pump(feed: Any, consumer: Consumer) -> Callable[[], None]:
    return lambda: consumer.take(feed.poll(0.02))


def test_poll_hands_each_batch_once_in_seq_order_and_the_consumer_holds_the_cache(rig, engine) -> None:
    feed = rig.feed([engine])
    c = Consumer()
    try:
        wait_until("the feed caught up", lambda: c.holds(engine), _pump(feed, c))
        engine.step(30)  # more while the feed runs
        wait_until("the feed caught up again", lambda: c.holds(engine), _pump(feed, c))
        for _ in range(5):  # nothing more, nothing twice
            c.take(feed.poll(0.02))
        assert c.holds(engine) and c.applied["w0"] == engine.last_seq()
        assert set(c.kinds) <= {"live", "replay", "snapshot"} and c.kinds["live"] > 0
        assert all(r.reason == "first" for r in c.resets)  # no gap, no restart here
    finally:
        feed.stop()


def test_status_and_counters_describe_the_stream(rig, engine) -> None:
    feed = rig.feed([engine])
    c = Consumer()
    try:
        wait_until("the feed caught up", lambda: c.holds(engine), _pump(feed, c))
        engine.step(1)  # a live batch: JetStreamFeed sets last_heard from live batches only, not snapshots
        wait_until("the feed caught up", lambda: c.holds(engine), _pump(feed, c))
        st = feed.status()["w0"]
        assert isinstance(st, SourceStatus) and st.name == "w0"
        assert st.next_seq == engine.last_seq() + 1 and st.epoch == engine.pub.epoch
        assert st.last_heard is not None and st.stale is False and st.busy is False
        counters = feed.counters()
        assert counters and all(isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in counters.items())
        assert counters.get("restarts", 0) == 0
    finally:
        feed.stop()


def test_a_publisher_restart_is_a_reset_then_the_new_process_state(rig, engine) -> None:
    feed = rig.feed([engine])
    c = Consumer()
    again = None
    try:
        wait_until("the feed caught up", lambda: c.holds(engine), _pump(feed, c))
        endpoint, replay = engine.pub.endpoint, engine.pub.replay_endpoint
        engine.close()
        again = Engine("w0", 32, endpoint=endpoint, replay=replay)  # the same addresses, a new epoch
        assert again.pub.epoch != engine.pub.epoch
        again.step(25)
        wait_until("the feed followed the new process", lambda: c.holds(again), _pump(feed, c), timeout=20)
        assert [r.reason for r in c.resets if r.reason != "first"] == ["restart"]
        assert feed.counters().get("restarts", 0) >= 1 and feed.status()["w0"].epoch == again.pub.epoch
    finally:
        feed.stop()
        if again is not None:
            again.close()


def test_stop_is_idempotent_and_poll_after_stop_is_a_value_error(rig, engine) -> None:
    feed = rig.feed([engine])
    c = Consumer()
    wait_until("a first delivery", lambda: bool(c.applied), _pump(feed, c))
    feed.stop()
    feed.stop()
    with pytest.raises(ValueError):
        feed.poll(0.0)


def test_start_calls_back_in_order_and_stop_ends_the_thread(rig, engine) -> None:
    c = Consumer()
    feed = rig.feed([engine], on_delivery=c.on_delivery, on_reset=c.on_reset)
    assert feed.start() is feed
    try:
        wait_until("the callbacks caught up", lambda: c.holds(engine))
        engine.step(10)
        wait_until("the callbacks caught up again", lambda: c.holds(engine))
        assert any(t.name in rig.thread_names for t in threading.enumerate())
    finally:
        feed.stop()
    assert not any(t.name in rig.thread_names and t.is_alive() for t in threading.enumerate())
