"""KVE/DESCRIBE is rate-limited per peer (issue 28, part 4): a flood from one DEALER is mostly
refused and counted (stats and /metrics), another peer is still answered. Real sockets on
127.0.0.1; the limiter runs on an injected clock, so nothing waits on wall time."""

from __future__ import annotations

import time
import urllib.request

import pytest
import zmq

from kvevents.testing.zeromq import EPH, chain_events, dealer_socket
from kvevents.zeromq.metrics import forget_publisher, serve_publisher
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.ratelimit import PeerRateLimiter
from kvevents.zeromq.replay_server import (
    DESCRIBE_BURST,
    DESCRIBE_RATE_PER_S,
    ReplayServer,
    prepare_router_socket,
)
from kvevents.zeromq.wire import DESCRIBE_REQUEST

FLOOD = 1000


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def rig():
    """(publisher, ReplayServer on a ROUTER of ours with an injected clock, its endpoint, clock, context)."""
    ctx = zmq.Context()
    pub = Publisher(endpoint=EPH, bind=True, heartbeat_interval_s=0)
    for events in chain_events(1, 10):
        pub.publish(events)
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, 0)
    prepare_router_socket(sock)
    sock.bind("tcp://127.0.0.1:0")
    clock = Clock()
    svc = ReplayServer(pub, sock, clock=clock)
    yield pub, svc, sock.getsockopt_string(zmq.LAST_ENDPOINT), clock, ctx
    sock.close(0)
    pub.close(0)
    ctx.destroy(0)


def _pump(svc: ReplayServer, rounds: int = 20) -> None:
    for _ in range(rounds):
        if svc.sock.poll(5):
            svc.handle_requests()


def _flood(svc: ReplayServer, d: zmq.Socket, n: int) -> int:
    """Send n DESCRIBEs as fast as the ROUTER takes them, reading every reply; returns replies."""
    st = svc.pub.stats()
    base = st["describe_requests"] + st["rejected_describe_rate"]
    sent = replies = 0
    while sent < n:
        try:
            d.send_multipart([b"", DESCRIBE_REQUEST], zmq.NOBLOCK)
            sent += 1
        except zmq.Again:
            _pump(svc, 1)
        while d.poll(0):
            d.recv_multipart()
            replies += 1
    deadline = time.monotonic() + 10
    st = svc.pub.stats()
    while st["describe_requests"] + st["rejected_describe_rate"] < base + n and time.monotonic() < deadline:
        _pump(svc, 1)
        st = svc.pub.stats()
    while d.poll(200):
        d.recv_multipart()
        replies += 1
    return replies


def _answered(svc: ReplayServer, d: zmq.Socket) -> bool:
    d.send_multipart([b"", DESCRIBE_REQUEST])
    for _ in range(100):
        _pump(svc, 1)
        if d.poll(10):
            return b"newest_seq" in d.recv_multipart()[-1]
    return False


def test_a_describe_flood_from_one_peer_is_refused_and_counted(rig):
    pub, svc, ep, clock, ctx = rig
    flooder = dealer_socket(ctx, ep)
    replies = _flood(svc, flooder, FLOOD)
    st = pub.stats()
    assert replies == st["describe_requests"] == DESCRIBE_BURST  # the clock stood still: the burst only
    assert st["rejected_describe_rate"] == FLOOD - DESCRIBE_BURST
    assert st["rejected_requests"] == FLOOD - DESCRIBE_BURST
    other = dealer_socket(ctx, ep)
    assert _answered(svc, other), "another peer was not answered during the flood"
    assert not _answered(svc, flooder)  # still over its rate
    clock.now += 1.0  # a second later the flooder has DESCRIBE_RATE_PER_S answers again
    assert _flood(svc, flooder, 100) == int(DESCRIBE_RATE_PER_S)
    assert pub.stats()["rejected_describe_rate"] == FLOOD - DESCRIBE_BURST + 1 + 100 - int(DESCRIBE_RATE_PER_S)


def test_refused_describes_are_exported_as_a_metric(rig):
    pub, svc, ep, _clock, ctx = rig
    _flood(svc, dealer_socket(ctx, ep), 200)
    port = serve_publisher(pub, 0)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        forget_publisher(pub)
    line = next(x for x in text.splitlines() if x.startswith("kvevents_publisher_rejected_describe_rate_total{"))
    assert float(line.rsplit(" ", 1)[1]) == 200 - DESCRIBE_BURST


def test_the_publishers_own_router_limits_a_flood():
    """End to end on the publisher's service thread (wall clock): most of a fast flood is refused."""
    ctx = zmq.Context()
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0)
    try:
        ep = pub.replay_endpoint or ""
        flooder = dealer_socket(ctx, ep)
        t0 = time.monotonic()
        sent = 0
        while sent < 600 and time.monotonic() - t0 < 10:
            try:
                flooder.send_multipart([b"", DESCRIBE_REQUEST], zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                time.sleep(0.001)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            st = pub.stats()
            if st["describe_requests"] + st["rejected_describe_rate"] >= sent:
                break
            time.sleep(0.01)
        elapsed = time.monotonic() - t0
        st = pub.stats()
        assert st["describe_requests"] + st["rejected_describe_rate"] == sent == 600
        assert st["describe_requests"] <= DESCRIBE_BURST + DESCRIBE_RATE_PER_S * elapsed + 1
        other = dealer_socket(ctx, ep)
        other.send_multipart([b"", DESCRIBE_REQUEST])
        assert other.poll(3000) and b"newest_seq" in other.recv_multipart()[-1]
    finally:
        pub.close(0)
        ctx.destroy(0)


def test_the_limiter_refills_at_its_rate_and_forgets_the_oldest_peer():
    clock = Clock()
    lim = PeerRateLimiter(2.0, 3, max_peers=2, clock=clock)
    assert [lim.allow(b"a") for _ in range(4)] == [True, True, True, False]
    clock.now += 0.5  # one token back
    assert [lim.allow(b"a") for _ in range(2)] == [True, False]
    clock.now += 100  # refills to the burst, not beyond
    assert sum(lim.allow(b"a") for _ in range(10)) == 3
    lim.allow(b"b")
    lim.allow(b"c")  # a third identity: the oldest (a) is forgotten
    assert len(lim) == 2 and lim.allow(b"a")
    with pytest.raises(ValueError):
        PeerRateLimiter(0, 1)
