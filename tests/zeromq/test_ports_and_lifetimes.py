"""Ports and lifetimes of the ZeroMQ transport: busy metrics ports, tcp port range (library and
CLI), queue-mode close, metrics names and the metrics servers' lifetime, and the contract's
consumer rule ("Transport in one page") "a late replayed store never resurrects a removed block"."""

from __future__ import annotations

import re
import socket
import threading
import time
import urllib.request
from contextlib import closing

import pytest
import zmq

from kvevents.events import BlockRemoved
from kvevents.testing.zeromq import EPH, apply, collect, free_tcp_endpoint, recv_all, stored, view_counts
from kvevents.zeromq import metrics
from kvevents.zeromq.publisher import Publisher, PublisherConfig
from kvevents.zeromq.subscriber import Delivery, Reset, Source, Subscriber
from kvevents.zeromq.wire import SNAPSHOT_REQUEST, check_endpoint, pack_seq
from tests.helpers.cli import invoke


def _listening() -> tuple[socket.socket, int]:
    """A socket listening on a free port (held: nothing else can take it), and that port."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, s.getsockname()[1]


def _can_listen(port: int) -> bool:
    """Another server could take the port now (SO_REUSEADDR, as HTTP servers set: TIME_WAIT is fine)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        s.listen(1)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _threads(part: str) -> set[threading.Thread]:
    return {t for t in threading.enumerate() if part in t.name and t.is_alive()}


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()


# ------------------------------------------------------------------ 1. a busy metrics port


def test_busy_metrics_port_releases_the_thread_and_both_ports():
    probe = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0)
    live, replay = probe.endpoint, probe.replay_endpoint  # freed by close(): reused below
    probe.close()
    busy, port = _listening()
    before = _threads("kvevents-pub")
    with closing(busy):
        with pytest.raises(ValueError, match=f"metrics port {port}"):
            Publisher(endpoint=live, replay_endpoint=replay, bind=True, heartbeat_interval_s=0.05, metrics_port=port)
        time.sleep(0.1)
        assert _threads("kvevents-pub") <= before  # service (and sender) threads are gone
        assert port not in metrics.serving_ports()
    ctx = zmq.Context()
    try:
        for ep in (live, replay):  # both zmq ports are free again
            s = ctx.socket(zmq.PUB)
            s.setsockopt(zmq.LINGER, 0)
            s.bind(ep)
            s.close()
    finally:
        ctx.term()


def test_busy_metrics_port_of_a_subscriber_is_a_value_error():
    busy, port = _listening()
    with closing(busy):
        with pytest.raises(ValueError, match=f"metrics port {port}"):
            Subscriber([free_tcp_endpoint()], metrics_port=port)
        assert port not in metrics.serving_ports()
    with pytest.raises(ValueError, match="metrics_port"):
        Subscriber([free_tcp_endpoint()], metrics_port=70000)


# ------------------------------------------------------------------ 2. tcp ports past 65535


@pytest.mark.parametrize(
    "endpoint",
    ["tcp://127.0.0.1:5557", "tcp://127.0.0.1:*", "tcp://*:0", "tcp://[::1]:65535", "ipc:///tmp/kve", "inproc://kve"],
)
def test_check_endpoint_accepts(endpoint):
    assert check_endpoint(endpoint) == endpoint


@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp://127.0.0.1:99999",
        "tcp://127.0.0.1:65536",
        "tcp://127.0.0.1:abc",
        "tcp://127.0.0.1:",
        "tcp://nohost",
        "tcp://:5557",
        "tcp://127.0.0.1:-1",
        "udp://127.0.0.1:5557",
        "bogus",
        "ipc://",
        "",
    ],
)
def test_check_endpoint_refuses_naming_the_endpoint(endpoint):
    with pytest.raises(ValueError, match=re.escape(repr(endpoint))):
        check_endpoint(endpoint)


def test_publisher_refuses_a_port_libzmq_would_wrap():
    with pytest.raises(ValueError, match="99999"):
        Publisher(endpoint="tcp://127.0.0.1:99999", bind=True, heartbeat_interval_s=0)
    with pytest.raises(ValueError, match="70000"):
        PublisherConfig(endpoint=EPH, replay_endpoint="tcp://127.0.0.1:70000")
    with pytest.raises(ValueError, match="exceeds 65535"):  # the rank's offset port would wrap
        PublisherConfig(endpoint="tcp://127.0.0.1:65535", dp_rank=1)
    with pytest.raises(ValueError, match="exceeds 65535"):
        PublisherConfig(endpoint=EPH, replay_endpoint="tcp://127.0.0.1:65534", dp_rank=2)
    assert PublisherConfig(endpoint="tcp://127.0.0.1:65534", dp_rank=1).dp_rank == 1


def test_source_refuses_a_port_libzmq_would_wrap():
    with pytest.raises(ValueError, match="99999"):
        Source("tcp://127.0.0.1:99999")
    with pytest.raises(ValueError, match="replay endpoint"):
        Source("tcp://127.0.0.1:5557", "tcp://127.0.0.1:65536")


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["serve", "--endpoint", "tcp://127.0.0.1:99999", "--duration", "0.3"], "99999"),
        (["serve", "--endpoint", "tcp://127.0.0.1:abc", "--duration", "0.3"], "'abc'"),
        (["serve", "--endpoint", "tcp://127.0.0.1:65535", "--duration", "0.3"], "65536"),  # the default replay port
        (
            [
                "serve",
                "--endpoint",
                "tcp://127.0.0.1:65530",
                "--workers",
                "8",
                "--replay-endpoint",
                "",
                "--duration",
                "0.3",
            ],
            "exceeds 65535",
        ),
        (["tail", "tcp://127.0.0.1:99999", "--duration", "0.3"], "99999"),
        (["tail", "tcp://127.0.0.1:5557", "--replay", "tcp://127.0.0.1:70000", "--duration", "0.3"], "70000"),
    ],
)
def test_cli_refuses_a_port_libzmq_would_wrap(args, expect):
    r = invoke(*args)
    code, out, err = r.returncode, r.stdout, r.stderr
    assert code == 2 and expect in err and "collide" not in err
    assert err.count("\n") == 1 and "Traceback" not in err and "kvevents serve:" not in out


# ------------------------------------------------------------------ 3. queue mode: close vs the sender


class _GatedEncoder:
    """Wraps BatchEncoder: the first encode waits for `gate` (the sender holds a batch meanwhile)."""

    def __init__(self, enc) -> None:
        self.enc = enc
        self.entered = threading.Event()
        self.gate = threading.Event()

    def encode(self, *args):
        if not self.entered.is_set():
            self.entered.set()
            self.gate.wait(10)
        return self.enc.encode(*args)


def test_queue_mode_close_never_lets_the_sender_use_closed_sockets():
    p = Publisher(endpoint=EPH, heartbeat_interval_s=0, send_mode="queue")
    enc = p._enc = _GatedEncoder(p._enc)
    sender = p._sender
    assert sender is not None
    try:
        for i in range(5):
            p.publish([stored(i + 1)])
        assert enc.entered.wait(5)  # the sender holds batch 0, batches 1..4 wait in the queue
        unsent = p.close(timeout=0.2)
        assert unsent == 5  # exact: the batch in the sender's hands was not sent either
    finally:
        enc.gate.set()
    sender.join(5)
    assert not sender.is_alive()
    st = p.stats()
    assert st["send_errors"] == 0 and st["ring_size"] == 0 and st["bytes_sent"] == 0  # no send after close


def test_queue_mode_close_flushes_everything_and_reports_zero():
    p = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0, send_mode="queue")
    for i in range(300):
        p.publish([stored(i + 1)])
    assert p.close(timeout=5.0) == 0
    st = p.stats()
    assert st["ring_size"] == 300 and st["send_errors"] == 0 and st["queue_depth"] == 0


# ------------------------------------------------------------------ 4./5. metrics names and servers


_REQUIRED = (  # the issue list: batches, events, dropped, queue depth, replay/snapshot served + rejected, bytes
    "kvevents_publisher_batches_total",
    "kvevents_publisher_events_total",
    "kvevents_publisher_dropped_total",
    "kvevents_publisher_queue_depth",
    "kvevents_publisher_replay_requests_total",
    "kvevents_publisher_replays_served_total",
    "kvevents_publisher_snapshot_requests_total",
    "kvevents_publisher_snapshots_served_total",
    "kvevents_publisher_rejected_requests_total",
    "kvevents_publisher_bytes_sent_total",
)


def _value(body: str, name: str, endpoint: str) -> float:
    m = re.search(rf'^{name}{{[^}}]*endpoint="{re.escape(endpoint)}"[^}}]*}} (\S+)$', body, re.M)
    assert m, f"{name} for {endpoint} not exported"
    return float(m.group(1))


def test_metrics_export_every_publisher_counter():
    p = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0, metrics_port=0)  # 0: a free port
    port = p.metrics_port
    assert port
    d = zmq.Context.instance().socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    try:
        p.publish([stored(1)])
        p.publish([stored(2, 1)])
        d.connect(p.replay_endpoint)
        d.send_multipart([b"", pack_seq(0)])
        assert len(recv_all(d)) == 3
        d.send_multipart([b"", SNAPSHOT_REQUEST])
        assert recv_all(d)
        d.send_multipart([b"", b"KVE/UNKNOWN"])  # not 8 bytes: 8 would be a replay start
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and p.stats()["rejected_requests"] < 1:
            time.sleep(0.01)
        body = _scrape(port)
        for name in _REQUIRED:
            assert f"\n{name}{{" in body, name
        for _key, (name, _doc, _kind) in metrics.PUBLISHER_METRICS.items():
            assert f"\n{name}{{" in body, name
        ep = p.endpoint
        assert _value(body, "kvevents_publisher_replays_served_total", ep) == 1
        assert _value(body, "kvevents_publisher_snapshots_served_total", ep) == 1
        assert _value(body, "kvevents_publisher_rejected_requests_total", ep) == 1
        assert _value(body, "kvevents_publisher_batches_total", ep) == 2
    finally:
        d.close(0)
        p.close()


def test_metrics_server_stops_with_its_last_user():
    before = _threads("serve_forever")
    a = Publisher(endpoint=EPH, heartbeat_interval_s=0, metrics_port=0)
    port = a.metrics_port
    b = Publisher(endpoint=EPH, heartbeat_interval_s=0, metrics_port=port)
    started = _threads("serve_forever") - before
    try:
        assert len(started) == 1 and b.metrics_port == port  # one server per port, shared
        a.close()
        assert "kvevents_publisher_batches_total" in _scrape(port)  # b still uses it
    finally:
        a.close()
        b.close()
    assert not any(t.is_alive() for t in started)  # no serve_forever thread left
    assert _can_listen(port)
    assert port not in metrics.serving_ports()
    c = Publisher(endpoint=EPH, heartbeat_interval_s=0, metrics_port=port)  # the port serves again
    try:
        assert "kvevents_publisher_batches_total" in _scrape(port)
    finally:
        c.close()
    assert _can_listen(port)


def test_subscriber_metrics_server_stops_with_the_subscriber():
    before = _threads("serve_forever")
    sub = Subscriber([free_tcp_endpoint()], metrics_port=0)
    port = sub.metrics_port
    assert port
    started = _threads("serve_forever") - before
    try:
        assert "kvevents_subscriber_live_batches_total" in _scrape(port)
    finally:
        sub.stop()
    assert len(started) == 1 and not any(t.is_alive() for t in started)
    assert _can_listen(port)


# ------------------------------------------------------------------ 6. the contract, the consumer rules ("Transport in one page"): no resurrection


def test_late_replayed_store_never_resurrects_a_block_a_live_remove_dropped():
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0)
    sub = Subscriber([Source(pub.endpoint, pub.replay_endpoint, "w")], request_timeout_s=0.5)
    try:
        items = _join(sub, pub)
        dup0 = sub.counters()["duplicates"]
        pub.drop_live(1)
        s_store = pub.publish([stored(42)])  # never sent live: only replay has it
        s_remove = pub.publish([BlockRemoved([42], "GPU")])  # live: reveals the gap
        items += collect(sub, lambda it: any(isinstance(d, Delivery) and d.seq == s_remove for d in it))
        items += sub.poll(0.2)  # the live copy of s_remove, buffered during the replay, comes as a duplicate
        state: dict = {}
        order = []
        for it in items:
            if isinstance(it, Reset):
                state.clear()
            else:
                apply(state, it.batch)
                order.append((it.seq, it.kind))
        assert (s_store, "replay") in order and order.index((s_store, "replay")) < order.index(
            next(o for o in order if o[0] == s_remove)
        )
        assert [s for s, _ in order].count(s_remove) == 1  # applied once: the live duplicate was dropped
        assert sub.counters()["duplicates"] > dup0 and sub.counters()["gaps"] >= 1
        assert state == {} == view_counts(pub)  # healed, empty, equal to the publisher's view
    finally:
        sub.stop()
        pub.close()


def _join(sub: Subscriber, pub: Publisher) -> list:
    """Poll until the subscriber is in sync (PUB drops until the subscription lands): marker delivered."""
    items: list = []
    for _ in range(200):
        pub.publish([])
        items += sub.poll(0.02)
        if any(isinstance(d, Delivery) for d in items):
            break
    marker = pub.publish([])
    return items + collect(sub, lambda it: any(isinstance(d, Delivery) and d.seq == marker for d in it))


def test_parse_source_named_and_bare() -> None:
    from kvevents.zeromq.subscriber import parse_source

    s = parse_source("w1=tcp://127.0.0.1:5557,tcp://127.0.0.1:5558")
    assert (s.name, s.endpoint, s.replay_endpoint) == ("w1", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558")
    bare = parse_source("tcp://127.0.0.1:5557", require_name=False)
    assert (bare.name, bare.endpoint, bare.replay_endpoint) == ("tcp://127.0.0.1:5557",) * 2 + (None,)
    for bad in ("tcp://127.0.0.1:5557", "=tcp://x:1", "w=", "w=localhost:5557", "w=tcp://a:1,tcp://b:2,tcp://c:3"):
        with pytest.raises(ValueError, match="NAME=ENDPOINT"):
            parse_source(bad)
    with pytest.raises(ValueError, match="cannot use"):
        parse_source("w=tcp://127.0.0.1:70000")
