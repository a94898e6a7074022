"""What the bridge reports on a healthy first contact (issue 29, item 6): the engine's history it
replays is not a repaired gap. And a `--nats` URL of the wrong scheme is said to be one."""

from __future__ import annotations

import pytest

from kvevents.jetstream.bridge import Bridge
from kvevents.jetstream.link import NatsOptions
from kvevents.jetstream.replays import ReplayTally
from kvevents.testing.nats import nats_server_binary
from tests.helpers.jetstream import Engine
from tests.helpers.wait import wait_until


def test_history_then_gaps_then_history_again() -> None:
    t = ReplayTally()
    for _ in range(3):
        t.delivery("w0", 0, "replay")  # first contact: the engine's kept history
    t.delivery("w0", 0, "live")
    t.delivery("w0", 0, "replay")  # after live batches: a gap filled
    t.delivery("w0", 1, "replay")  # another rank's first contact
    t.reset("w0", None)  # a restart: every rank starts over
    t.delivery("w0", 0, "replay")
    t.delivery("w0", 0, "snapshot")
    assert t.counts == {"history_batches_replayed": 5, "gap_batches_replayed": 1}


@pytest.mark.parametrize("url", ["http://127.0.0.1:4222", "https://h:4222", "nats://a:1,HTTP://b:2"])
def test_a_url_of_another_scheme_is_named(url: str) -> None:
    with pytest.raises(ValueError, match=r"is not a NATS scheme: use nats://HOST:4222"):
        NatsOptions(url).servers()


def test_nats_schemes_are_taken() -> None:
    urls = "nats://a:1,tls://b:2,ws://c:3,wss://d:4,NATS://e:5"
    assert NatsOptions(urls).servers() == urls.split(",")


@pytest.mark.skipif(nats_server_binary() is None, reason="nats-server not installed (the test extra has it)")
def test_a_healthy_first_contact_repairs_no_gap(nats_server) -> None:
    e = Engine("w0", 7)
    e.step(40)  # history the bridge replays when it first connects
    b = Bridge([e.source], "KV", NatsOptions(nats_server.url), snapshot_every_s=3600, request_timeout_s=0.5)
    try:
        b.start()
        assert b.wait_connected(10)
        wait_until("history forwarded", lambda: b.counters().get("history_batches_replayed", 0) >= 40)
        e.step(20)
        wait_until("live forwarded", lambda: b.counters().get("live_published", 0) >= 60)
        c = b.counters()
        assert c["gap_batches_replayed"] == 0 and c["subscriber_gaps"] == 0
        assert c["subscriber_replayed"] == c["history_batches_replayed"] >= 40
    finally:
        b.stop()
        e.close()
