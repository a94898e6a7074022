"""The replay ROUTER under hostile peers (issue 18, items 1-3), over real sockets on 127.0.0.1.

Most tests drive a `ReplayServer` by hand on a ROUTER socket of their own (a publisher without a
replay endpoint lends its ring and counters), with an injected clock for the job deadlines, so
nothing waits on wall time; one test runs the publisher's own service thread end to end.
"""

from __future__ import annotations

import time
import tracemalloc

import pytest
import zmq

from kvevents.testing.zeromq import EPH, chain_events, dealer_socket
from kvevents.zeromq.metrics import PUBLISHER_METRICS
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.replay_server import (
    MAX_FRAME_BYTES,
    MAX_REQUEST_BYTES,
    PENALTY_S,
    ROUTER_COUNTERS,
    STALL_EVICT_S,
    ReplayServer,
    prepare_router_socket,
)
from kvevents.zeromq.wire import DESCRIBE_REQUEST, END_SEQ, SEQ, SNAPSHOT_REQUEST
from tests.helpers.clock import FakeClock as Clock

RING = 2000


@pytest.fixture
def rig():
    """(publisher with 2,000 batches of ~1.5 KB in its ring, ReplayServer on a ROUTER of ours
    (send queue of 10 messages per peer), its endpoint, clock, context)."""
    ctx = zmq.Context()
    pub = Publisher(
        endpoint=EPH,
        bind=True,
        heartbeat_interval_s=0,
        replay_jobs_per_peer=2,
        replay_max_jobs=8,
        replay_job_timeout_s=5.0,
    )
    for events in chain_events(1, RING, page=512):
        pub.publish(events)
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.SNDHWM, 10)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, 0)
    prepare_router_socket(sock)  # before the bind, as the publisher does
    sock.bind("tcp://127.0.0.1:0")
    clock = Clock()
    svc = ReplayServer(pub, sock, clock=clock)
    yield pub, svc, sock.getsockopt_string(zmq.LAST_ENDPOINT), clock, ctx
    sock.close(0)
    pub.close(0)
    ctx.destroy(0)


def _pump(svc: ReplayServer, rounds: int = 50) -> None:
    """Let the service read what is queued and send what it can (a few turns)."""
    for _ in range(rounds):
        if svc.sock.poll(5):
            svc.handle_requests()
        if svc.jobs:
            svc.step()


def _hog(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A DEALER that never reads (its receive queue holds one message, its kernel buffer 4 KB)."""
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.RCVHWM, 1)
    d.setsockopt(zmq.RCVBUF, 4096)
    d.connect(endpoint)
    return d


def _replay_answered(svc: ReplayServer, d: zmq.Socket, start: int, rounds: int = 400) -> list[int]:
    """Seqs a well-behaved peer receives for a replay from `start`, up to the end marker (or [] if none)."""
    d.send_multipart([b"", SEQ.pack(start)])
    seqs: list[int] = []
    for _ in range(rounds):
        _pump(svc, 1)
        while d.poll(0):
            frames = d.recv_multipart()
            if frames[-2] == END_SEQ:
                return seqs
            seqs.append(SEQ.unpack(frames[-2])[0])
    return []


def test_one_peer_cannot_hold_every_job_slot(rig):
    """Item 1: 64 replay-from-0 requests of one never-reading peer take its 2 slots, not all of them."""
    pub, svc, ep, _, ctx = rig
    hog = _hog(ctx, ep)
    for _ in range(64):
        hog.send_multipart([b"", SEQ.pack(0)])
    _pump(svc)
    assert svc.jobs == 2
    stats = pub.stats()
    assert stats["rejected_peer_cap"] == 62 and stats["replay_requests"] == 2
    good = dealer_socket(ctx, ep)
    assert _replay_answered(svc, good, RING - 5) == list(range(RING - 5, RING))
    good.send_multipart([b"", SNAPSHOT_REQUEST])
    _pump(svc)
    assert good.poll(1000), "the snapshot was refused"


def test_a_peer_that_does_not_drain_loses_its_jobs_at_the_deadline(rig):
    """Item 1: the deadline (injected clock) frees a never-reading peer's slots, counted."""
    pub, svc, ep, clock, ctx = rig
    hog = _hog(ctx, ep)
    hog.send_multipart([b"", SEQ.pack(0)])
    hog.send_multipart([b"", SEQ.pack(0)])
    for _ in range(200):
        _pump(svc, 1)
        if svc.blocked:
            break
    assert svc.jobs == 2 and svc.blocked  # its pipe is full: nothing moves
    clock.advance(4.9)
    _pump(svc)
    assert svc.jobs == 2 and pub.stats()["jobs_expired"] == 0
    clock.advance(0.2)
    _pump(svc)
    assert svc.jobs == 0
    assert pub.stats()["jobs_expired"] == 2 and pub.stats()["replays_served"] == 0
    hog.send_multipart([b"", SEQ.pack(0)])  # refused for a while: it did not drain the last ones
    _pump(svc)
    assert svc.jobs == 0 and pub.stats()["rejected_peer_cap"] == 1
    clock.advance(PENALTY_S)
    hog.send_multipart([b"", SEQ.pack(0)])  # then admitted again
    _pump(svc)
    assert svc.jobs == 1


def test_many_stalled_identities_yield_their_slots_to_a_newcomer(rig):
    """Item 1 with many identities: 4 never-reading peers fill all 8 slots; once they have taken
    nothing for STALL_EVICT_S, a new request takes the slots of the longest stalled one."""
    pub, svc, ep, clock, ctx = rig
    hogs = [_hog(ctx, ep) for _ in range(4)]
    for hog in hogs:
        hog.send_multipart([b"", SEQ.pack(0)])
        hog.send_multipart([b"", SEQ.pack(0)])
    for _ in range(100):
        _pump(svc, 1)
        if svc.jobs == 8:
            break
    for _ in range(5000):  # stream until every peer's pipe is full
        svc.step()
        if svc.blocked:
            break
    assert svc.jobs == 8 and svc.blocked
    good = dealer_socket(ctx, ep)
    clock.advance(STALL_EVICT_S / 2)
    good.send_multipart([b"", SEQ.pack(RING - 1)])
    _pump(svc)
    assert not good.poll(0) and pub.stats()["jobs_expired"] == 0  # refused: nobody stalled long enough
    clock.advance(STALL_EVICT_S)
    assert _replay_answered(svc, good, RING - 1) == [RING - 1]
    assert pub.stats()["jobs_expired"] == 2 and svc.jobs <= 8


def test_peers_are_served_in_turn(rig):
    """Item 1: a second peer's replay starts before the first peer's long replay has finished."""
    _, svc, ep, _, ctx = rig
    a, b = dealer_socket(ctx, ep), dealer_socket(ctx, ep)
    a.send_multipart([b"", SEQ.pack(0)])  # 2,000 batches: many slices
    assert a.poll(0) == 0
    _pump(svc, 1)
    b.send_multipart([b"", SEQ.pack(0)])
    got_a = got_b = 0
    a_done = False
    for _ in range(200):
        _pump(svc, 1)
        while a.poll(0):
            a_done = a.recv_multipart()[-2] == END_SEQ
            got_a += 1
        while b.poll(0):
            b.recv_multipart()
            got_b += 1
        if got_b:
            break
    assert got_b and not a_done and got_a < RING


def test_describe_is_answered_inline_and_never_held(rig):
    """Item 2: a DESCRIBE flood from a never-reading peer leaves no job behind; replay still works."""
    pub, svc, ep, _, ctx = rig
    hog = _hog(ctx, ep)
    sent = 0
    while sent < 5000:
        try:
            hog.send_multipart([b"", DESCRIBE_REQUEST], zmq.NOBLOCK)
            sent += 1
        except zmq.Again:
            _pump(svc, 1)
    deadline = time.monotonic() + 20
    read = ("describe_requests", "rejected_describe_rate")  # answered, or refused over the peer's rate
    while sum(pub.stats()[k] for k in read) < sent and time.monotonic() < deadline:
        _pump(svc, 1)
    stats = pub.stats()
    assert sum(stats[k] for k in read) == sent and svc.jobs == 0
    good = dealer_socket(ctx, ep)
    good.send_multipart([b"", DESCRIBE_REQUEST])
    _pump(svc)
    assert good.poll(1000) and b"newest_seq" in good.recv_multipart()[-1]
    assert _replay_answered(svc, good, RING - 1) == [RING - 1]


def test_a_request_of_many_frames_is_dropped_frame_by_frame(rig):
    """Item 3: a 2 MB request of 20,000 frames is counted and discarded without being kept whole."""
    pub, svc, ep, _, ctx = rig
    d = dealer_socket(ctx, ep)
    d.send_multipart([b""] + [b"x" * 100] * 20_000)
    d.send_multipart([b"", DESCRIBE_REQUEST])  # the next request of the same peer is served
    assert svc.sock.poll(2000)
    tracemalloc.start()
    try:
        for _ in range(2000):
            _pump(svc, 1)
            if d.poll(0):
                break
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert d.poll(0), "the DESCRIBE after the big request was not answered"
    assert pub.stats()["rejected_oversized"] == 1 and pub.stats()["rejected_requests"] == 1
    assert peak < 200_000, f"{peak} bytes traced while dropping a 2 MB request"


def test_long_bodies_are_refused_and_big_frames_never_arrive(rig):
    """Item 3: a body over MAX_REQUEST_BYTES is refused (counted); a frame over MAX_FRAME_BYTES
    drops the peer's connection inside ZeroMQ, unread."""
    pub, svc, ep, _, ctx = rig
    d = dealer_socket(ctx, ep)
    d.send_multipart([b"", b"y" * (MAX_REQUEST_BYTES + 1)])
    _pump(svc)
    assert pub.stats()["rejected_oversized"] == 1
    big = dealer_socket(ctx, ep)
    big.send_multipart([b"", b"z" * (MAX_FRAME_BYTES + 1)])
    assert svc.sock.poll(300) == 0  # never delivered
    assert pub.stats()["rejected_requests"] == 1


def test_the_service_thread_keeps_replay_open_under_a_hog():
    """Item 1 end to end: the publisher's own thread, a hog with 64 requests, a peer still served."""
    ctx = zmq.Context()
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0)
    try:
        for events in chain_events(1, 3000, page=64):
            pub.publish(events)
        hog = _hog(ctx, pub.replay_endpoint or "")
        for _ in range(64):
            hog.send_multipart([b"", SEQ.pack(0)])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # all 64 read (accepted or refused)
            stats = pub.stats()
            if stats["replay_requests"] + stats["rejected_requests"] >= 64:
                break
            time.sleep(0.01)
        good = dealer_socket(ctx, pub.replay_endpoint or "")
        good.send_multipart([b"", SEQ.pack(2998)])
        frames = []
        while good.poll(3000):
            frames.append(good.recv_multipart())
            if frames[-1][-2] == END_SEQ:
                break
        assert [SEQ.unpack(f[-2])[0] for f in frames[:-1]] == [2998, 2999]
        assert frames[-1][-2] == END_SEQ
    finally:
        pub.close(0)
        ctx.destroy(0)


def test_the_publisher_sets_the_request_limits_before_it_binds():
    """A frame over MAX_FRAME_BYTES never reaches the publisher's own ROUTER (the limit applies to
    its connections only if set before the bind)."""
    ctx = zmq.Context()
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0)
    try:
        big = dealer_socket(ctx, pub.replay_endpoint or "")
        big.send_multipart([b"", b"z" * (MAX_FRAME_BYTES + 1)])
        good = dealer_socket(ctx, pub.replay_endpoint or "")
        good.send_multipart([b"", DESCRIBE_REQUEST])
        assert good.poll(3000)  # served after the big one had its chance to arrive
        time.sleep(0.2)
        assert pub.stats()["rejected_requests"] == 0
    finally:
        pub.close(0)
        ctx.destroy(0)


def test_router_counters_are_in_stats_and_exported():
    pub = Publisher(endpoint=EPH, bind=True, heartbeat_interval_s=0)
    try:
        stats = pub.stats()
        for key in ROUTER_COUNTERS:
            assert stats[key] == 0 and key in PUBLISHER_METRICS
    finally:
        pub.close(0)


@pytest.mark.parametrize(
    "field, bad", [("replay_jobs_per_peer", 0), ("replay_max_jobs", 0), ("replay_job_timeout_s", 0)]
)
def test_bounds_are_validated(field, bad):
    with pytest.raises(ValueError):
        Publisher(endpoint=EPH, bind=True, **{field: bad})
