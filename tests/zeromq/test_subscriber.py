"""Subscriber: replay for late joiners and gaps, restarts, unrecoverable gaps, snapshots, staleness."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from kvevents.events import BlockRemoved, KVEventBatch, encode_batch
from kvevents.testing.zeromq import EPH, apply, chain_events, collect, free_tcp_endpoint, stored, view_counts
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.subscriber import Delivery, Reset, Source, Subscriber
from kvevents.zeromq.wire import pack_seq


def _pub(**kw) -> Publisher:
    kw.setdefault("endpoint", EPH)
    kw.setdefault("replay_endpoint", EPH)
    kw.setdefault("heartbeat_interval_s", 0.05)
    return Publisher(**kw)


def _sub(pub: Publisher, name: str = "w0", **kw) -> Subscriber:
    kw.setdefault("request_timeout_s", 0.5)
    return Subscriber([Source(pub.endpoint, pub.replay_endpoint, name)], **kw)


def _seqs(items, kind=None):
    return [d.seq for d in items if isinstance(d, Delivery) and (kind is None or d.kind == kind)]


def _has_seq(n):
    return lambda items: any(s >= n for s in _seqs(items))  # snapshot deliveries carry seq S


def _state(items) -> dict:
    st: dict = {}
    for it in items:
        if isinstance(it, Reset):
            st.clear()
        else:
            apply(st, it.batch)
    return st


def _settle(sub, pub, items, timeout=5.0):
    """Publish a marker batch and poll until it is delivered (everything before it is applied)."""
    marker = pub.publish([])
    return items + collect(sub, lambda it: any(s >= marker for s in _seqs(it)), timeout)


def test_late_subscriber_gets_everything_from_seq_zero():
    pub = _pub(heartbeat_interval_s=0)
    for evs in chain_events(1, 40):
        pub.publish(evs)
    sub = _sub(pub)
    try:
        items = []
        deadline = time.monotonic() + 5
        while not _seqs(items, "live") and time.monotonic() < deadline:
            pub.publish([stored(1000)])  # live traffic reveals the publisher to the subscriber
            items += sub.poll(0.02)
        seqs = _seqs(items)
        assert seqs == list(range(len(seqs)))  # contiguous from 0, no duplicates
        kinds = [d.kind for d in items if isinstance(d, Delivery)]
        assert kinds[:40] == ["replay"] * 40 and "live" in kinds
        assert not any(isinstance(i, Reset) for i in items)
        d = items[0]
        src, seq, batch = d
        assert (src, seq, d.epoch, d.dp_rank, d.endpoint) == ("w0", 0, pub.epoch, 0, pub.endpoint)
        st = sub.status()["w0"]
        assert st.next_seq == seqs[-1] + 1 and st.epoch == pub.epoch and not st.stale
        assert sub.counters()["replays_requested"] >= 1
    finally:
        sub.stop()
        pub.close()


def test_dropped_live_frames_heal_by_replay():
    pub = _pub()
    sub = _sub(pub)
    try:
        items = collect(sub, lambda it: len(_seqs(it)) >= 1)  # a heartbeat joins us
        pub.drop_live(5)
        for evs in chain_events(1, 10):
            pub.publish(evs)
        items = _settle(sub, pub, items)
        seqs = _seqs(items)
        assert seqs == list(range(seqs[0], seqs[-1] + 1))
        assert len(_seqs(items, "replay")) >= 5
        c = sub.counters()
        assert c["gaps"] >= 1 and c["unrecoverable_gaps"] == 0 and c["resets"] == 0
        assert _state(items) == view_counts(pub)
    finally:
        sub.stop()
        pub.close()


def test_tiny_hwm_losses_heal_by_replay():
    pub = _pub(hwm=1, heartbeat_interval_s=0)
    sub = _sub(pub, hwm=1)
    try:
        items = []
        deadline = time.monotonic() + 3
        while not _seqs(items) and time.monotonic() < deadline:
            pub.publish([])
            items += sub.poll(0.02)
        big = [stored(i) for i in range(8)]
        for _ in range(3000):  # the subscriber is not reading: its pipe overflows
            pub.publish(big)
        items = _settle(sub, pub, items, timeout=10)
        seqs = _seqs(items)
        assert seqs == list(range(seqs[0], seqs[-1] + 1))
        assert sub.counters()["unrecoverable_gaps"] == 0
    finally:
        sub.stop()
        pub.close()


def test_restarted_publisher_resets_and_resyncs_by_snapshot():
    a = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0.05)
    ep, rep = a.endpoint, a.replay_endpoint  # the restart binds the same ports again
    sub = Subscriber([Source(ep, rep, "w0")], request_timeout_s=0.5)
    b = None
    try:
        for evs in chain_events(1, 10):
            a.publish(evs)
        items = collect(sub, _has_seq(9))
        a.close()
        b = Publisher(endpoint=ep, replay_endpoint=rep, bind=True, heartbeat_interval_s=0.05)  # close freed them
        assert b.epoch != a.epoch
        b.drop_live(20)  # the subscriber cannot see the start of b's stream: only a snapshot helps
        for evs in chain_events(500, 20):
            b.publish(evs)
        b.publish([BlockRemoved([505], "GPU")])
        items = _settle(sub, b, items)
        resets = [i for i in items if isinstance(i, Reset)]
        assert resets and resets[0].reason == "restart" and resets[0].source == "w0"
        after = items[items.index(resets[0]) + 1 :]
        assert [d.kind for d in after if isinstance(d, Delivery)][0] == "snapshot"
        assert _state(items) == view_counts(b) and len(view_counts(b)) == 19
        c = sub.counters()
        assert c["restarts"] >= 1 and c["snapshots_applied"] >= 1
        assert sub.status()["w0"].epoch == b.epoch
    finally:
        sub.stop()
        a.close()
        if b is not None:
            b.close()


def test_forced_drop_is_unrecoverable_and_healed_by_snapshot():
    pub = _pub()
    sub = _sub(pub)
    try:
        items = collect(sub, lambda it: len(_seqs(it)) >= 1)
        for evs in chain_events(1, 5):
            pub.publish(evs)
        pub.force_drop(2)  # as if the queue were full: seq consumed, never replayable
        for evs in chain_events(100, 5):
            pub.publish(evs)
        items = _settle(sub, pub, items)
        assert pub.stats()["dropped_queue_full"] == 2
        resets = [i for i in items if isinstance(i, Reset)]
        assert [r.reason for r in resets] == ["gap"]
        assert any(d.kind == "snapshot" for d in items if isinstance(d, Delivery))
        assert sub.counters()["unrecoverable_gaps"] == 1
        assert _state(items) == view_counts(pub)
        assert (101, 102) and ("GPU", 101) in _state(items)  # a dropped batch's blocks arrived by snapshot
    finally:
        sub.stop()
        pub.close()


def test_gap_without_replay_endpoint_is_a_counted_loss():
    pub = _pub(replay_endpoint=None)
    sub = Subscriber([Source(pub.endpoint, None, "w0")])
    try:
        items = collect(sub, lambda it: len(_seqs(it)) >= 1)
        pub.drop_live(3)
        for evs in chain_events(1, 6):
            pub.publish(evs)
        items = _settle(sub, pub, items)
        assert [i.reason for i in items if isinstance(i, Reset)] == ["gap"]
        assert sub.counters()["losses"] >= 1
    finally:
        sub.stop()
        pub.close()


def test_bad_payloads_are_counted_and_skipped(ctx=None):
    ctx = zmq.Context.instance()
    raw = ctx.socket(zmq.PUB)
    raw.setsockopt(zmq.LINGER, 0)
    raw.bind("tcp://127.0.0.1:*")
    ep = raw.getsockopt_string(zmq.LAST_ENDPOINT)
    sub = Subscriber([Source(ep, None, "raw")], log_every=1000)
    try:
        good = lambda s: [b"", pack_seq(s), encode_batch(KVEventBatch(1.0, [stored(s)], 0, 7))]  # noqa: E731
        items: list = []
        deadline = time.monotonic() + 3
        while not items and time.monotonic() < deadline:
            raw.send_multipart(good(0))
            items += sub.poll(0.02)
        raw.send_multipart([b"", pack_seq(1), b"\xc1\xc1 not msgpack"])
        raw.send_multipart([b"", b"\x01", b"short seq"])
        raw.send_multipart([b"", pack_seq(2), encode_batch(KVEventBatch(1.0, [stored(2)], 0, 7))])
        items += collect(sub, _has_seq(2))
        c = sub.counters()
        assert c["bad_payloads"] == 1 and c["bad_frames"] == 1
        assert sub.status()["raw"].next_seq == 3
    finally:
        sub.stop()
        raw.close(0)


def test_publisher_without_snapshots_makes_an_unrecoverable_gap_a_counted_clean_start():
    """snapshots=False (vLLM's feature set): the snapshot request times out, the consumer drops the
    source's state, counts a loss and goes on with the live stream."""
    pub = _pub(snapshots=False)
    sub = _sub(pub, request_timeout_s=0.2, max_attempts=1)
    try:
        items = collect(sub, lambda it: len(_seqs(it)) >= 1)
        pub.force_drop(1)  # seq consumed, never replayable
        for evs in chain_events(1, 4):
            pub.publish(evs)
        items = _settle(sub, pub, items)
        c = sub.counters()
        assert [i.reason for i in items if isinstance(i, Reset)] == ["gap"]
        assert c["unrecoverable_gaps"] == 1 and c["snapshot_failures"] == 1 and c["losses"] >= 1
        assert not any(d.kind == "snapshot" for d in items if isinstance(d, Delivery))
        assert pub.stats()["rejected_requests"] >= 1
        later = pub.publish(chain_events(50, 1)[0])
        items = collect(sub, lambda it: later in _seqs(it))
        assert later in _seqs(items)
    finally:
        sub.stop()
        pub.close()


def test_unreachable_replay_times_out_retries_then_starts_clean():
    ctx = zmq.Context.instance()
    dead_replay = free_tcp_endpoint()  # nothing listens there
    raw = ctx.socket(zmq.PUB)
    raw.setsockopt(zmq.LINGER, 0)
    raw.bind("tcp://127.0.0.1:*")
    ep = raw.getsockopt_string(zmq.LAST_ENDPOINT)
    sub = Subscriber([Source(ep, dead_replay, "raw")], request_timeout_s=0.1, max_attempts=2)
    try:
        items: list = []
        seq = 5
        deadline = time.monotonic() + 8
        while not _seqs(items) and time.monotonic() < deadline:
            raw.send_multipart([b"", pack_seq(seq), encode_batch(KVEventBatch(1.0, [stored(seq)], 0, 9))])
            seq += 1
            items += sub.poll(0.02)
        c = sub.counters()
        assert c["replay_timeouts"] >= 2 and c["snapshot_failures"] == 1 and c["losses"] >= 1
        assert [i.reason for i in items if isinstance(i, Reset)] == ["first"]
        assert _seqs(items) == list(range(_seqs(items)[0], _seqs(items)[-1] + 1))
    finally:
        sub.stop()
        raw.close(0)


def test_heartbeats_keep_source_fresh_and_silence_makes_it_stale():
    pub = _pub(heartbeat_interval_s=0.05)
    sub = _sub(pub, stale_after_s=0.3)
    try:
        collect(sub, lambda it: len(_seqs(it)) >= 3)
        t0 = sub.status()["w0"].last_heard
        time.sleep(0.2)
        sub.poll(0.1)
        st = sub.status()["w0"]
        assert st.last_heard > t0 and not st.stale and sub.counters()["heartbeats"] >= 3
        pub.close()
        deadline = time.monotonic() + 3
        while not sub.counters()["stale_sources"] and time.monotonic() < deadline:
            sub.poll(0.05)
        assert sub.status()["w0"].stale and sub.counters()["stale_sources"] == 1
    finally:
        sub.stop()
        pub.close()


def test_many_sources_in_thread_mode_with_callbacks():
    pubs = [_pub(dp_rank=0), _pub(dp_rank=0)]
    got: dict[str, list[int]] = {"a": [], "b": []}
    lock = threading.Lock()
    done = threading.Event()

    def on_delivery(d: Delivery) -> None:
        with lock:
            got[d.source].append(d.seq)
            if all(len(v) >= 12 for v in got.values()):
                done.set()

    sub = Subscriber(
        [
            Source(pubs[0].endpoint, pubs[0].replay_endpoint, "a"),
            Source(pubs[1].endpoint, pubs[1].replay_endpoint, "b"),
        ],
        on_delivery=on_delivery,
        request_timeout_s=0.5,
    )
    try:
        with sub:
            for evs in chain_events(1, 10):
                for p in pubs:
                    p.publish(evs)
            assert done.wait(5)
        with lock:
            for seqs in got.values():
                assert seqs == list(range(len(seqs)))
    finally:
        for p in pubs:
            p.close()


def test_source_and_subscriber_validation():
    with pytest.raises(ValueError):
        Subscriber([])
    with pytest.raises(ValueError):
        Subscriber([Source("tcp://127.0.0.1:1", name="x"), Source("tcp://127.0.0.1:2", name="x")])
    with pytest.raises(ValueError):
        Subscriber(["tcp://127.0.0.1:1"]).start()  # thread mode needs on_delivery
    with pytest.raises(ValueError):  # refused when the Source is made (check_endpoint), before any poll
        Subscriber(["bogus://nowhere"]).poll(0)
    assert Source("tcp://127.0.0.1:1").name == "tcp://127.0.0.1:1"


def test_subscriber_metrics_port():
    import urllib.request

    pub = _pub()
    sub = _sub(pub, metrics_port=0)  # 0: a free port, which sub.metrics_port names
    port = sub.metrics_port
    try:
        assert port
        collect(sub, lambda it: len(_seqs(it)) >= 2)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        assert "kvevents_subscriber_heartbeats_total" in body and "kvevents_subscriber_live_batches_total" in body
    finally:
        sub.stop()
        pub.close()


@pytest.mark.parametrize("epoch_in_batch", [True, False])
def test_republished_payloads_keep_their_stream_identity(epoch_in_batch):
    """publish_payload keeps the recorded epoch/rank; heartbeats follow it, so no false restarts."""
    pub = _pub(heartbeat_interval_s=0.03, dp_rank=3, epoch_in_batch=epoch_in_batch)  # replaying a rank-3 recording
    sub = _sub(pub)
    try:
        collect(sub, lambda it: len(_seqs(it)) >= 1)
        for i in range(5):
            last = pub.publish_payload(encode_batch(KVEventBatch(1.0, [stored(i)], 3, 4242)))
            time.sleep(0.04)  # heartbeats in between
        items = collect(sub, lambda it: any(s > last + 1 for s in _seqs(it)))
        c = sub.counters()
        assert pub.describe()["epoch"] == 4242
        if epoch_in_batch:
            assert c["restarts"] == 1  # once: from our own epoch to the recorded one, then stable
            assert {d.epoch for d in items if isinstance(d, Delivery)} == {4242}
        else:  # no epoch on the wire: one continuous stream, nothing to restart from
            assert c["restarts"] == 0 and c["resets"] == 0
            assert {d.dp_rank for d in items if isinstance(d, Delivery)} == {3}
    finally:
        sub.stop()
        pub.close()


@pytest.mark.parametrize(
    "args", [("tcp://nonsense",), ("bogus://x",), ("tcp://127.0.0.1:5557", "tcp://127.0.0.1:notaport")]
)
def test_a_malformed_endpoint_is_refused_when_the_source_is_made(args):
    with pytest.raises(ValueError, match="cannot use"):
        Source(*args)


@pytest.mark.parametrize(
    "source",  # well-formed endpoints that ZeroMQ itself refuses (connect to a wildcard, bind a foreign host)
    [
        Source("tcp://*:5557"),
        Source("tcp://no-such-host.invalid:5557", bind=True),
        Source("tcp://127.0.0.1:5557", "tcp://127.0.0.1:*"),
    ],
)
def test_start_with_a_bad_endpoint_raises_at_once(caplog, source):
    ok = Source(free_tcp_endpoint(), None, "ok")
    sub = Subscriber([ok, source], on_delivery=lambda d: None)
    with caplog.at_level("WARNING", logger="kvevents.zeromq.subscriber"):
        with pytest.raises(ValueError, match="cannot use"):
            sub.start()
        time.sleep(0.2)
    assert sub._thread is None and not caplog.records  # no thread left logging in the background
    assert sub.open_sockets() == 0  # nothing left open
    sub.stop()


class _Broken(Subscriber):
    """A subscriber whose poll always fails: the thread must back off, and log rarely."""

    def poll(self, timeout_s: float = 0.0):
        raise RuntimeError("persistent failure")


def test_thread_backs_off_on_a_persistent_error(caplog):
    sub = _Broken([free_tcp_endpoint()], on_delivery=lambda d: None, log_every=100)
    with caplog.at_level("ERROR", logger="kvevents.zeromq.subscriber"):
        sub.start()
        time.sleep(1.0)
        sub.stop()
    n = sub.counters()["loop_errors"]
    assert 1 <= n <= 6  # 50, 100, 200, 400 ms ... not one every 50 ms (20 in a second)
    assert len([r for r in caplog.records if "loop error" in r.getMessage()]) == 1


def test_poll_is_refused_while_the_thread_runs():
    pub = _pub(heartbeat_interval_s=0)
    sub = _sub(pub, on_delivery=lambda d: None)
    try:
        sub.start()
        with pytest.raises(ValueError, match="own thread"):
            sub.poll(0)
    finally:
        sub.stop()
        pub.close()


def test_staleness_and_request_deadlines_follow_the_injected_clock():
    """A fake monotonic clock: a source goes stale and a replay request times out with no sleep."""
    now = [1000.0]
    pub = _pub(heartbeat_interval_s=0)
    sub = Subscriber(
        [Source(pub.endpoint, "tcp://127.0.0.1:9", "w0")],
        stale_after_s=5.0,
        request_timeout_s=2.0,
        max_attempts=1,
        clock=lambda: now[0],
    )
    try:
        assert not sub.status()["w0"].stale
        now[0] += 6.0
        sub.poll(0)
        assert sub.status()["w0"].stale and sub.counters()["stale_sources"] == 1
        while not sub.counters()["describes_requested"]:  # first contact asks DESCRIBE of a dead port
            pub.publish([stored(1)])
            sub.poll(0.02)
        assert sub.counters()["describe_timeouts"] == 0
        now[0] += 1.5  # DESCRIBE gives up after 1 s of the injected clock
        sub.poll(0)
        assert sub.counters()["describe_timeouts"] == 1
    finally:
        sub.stop()
        pub.close()


def test_a_raising_callback_is_counted_and_the_feed_goes_on():
    pub = _pub(heartbeat_interval_s=0)
    got: list = []

    def on_delivery(d):
        got.append(d.seq)
        if len(got) == 1:
            raise RuntimeError("consumer bug")

    sub = _sub(pub, on_delivery=on_delivery)
    try:
        sub.start()
        deadline = time.monotonic() + 5
        while len(got) < 3 and time.monotonic() < deadline:
            pub.publish([stored(len(got) + 1)])
            time.sleep(0.02)
        assert len(got) >= 3 and sub.counters()["callback_errors"] == 1
    finally:
        sub.stop()
        pub.close()
