"""Publisher: endpoint rules, replay ROUTER, snapshot, describe, malformed requests, heartbeats,
epochs. Wire compatibility (live frames, strict external decoders) is in test_publisher_wire."""

from __future__ import annotations

import os
import time

import msgspec
import pytest
import zmq

from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch
from kvevents.testing.zeromq import EPH, chain_events, dealer_socket, recv_all, stored, sub_socket, wait_joined
from kvevents.zeromq.publisher import Publisher, PublisherConfig
from kvevents.zeromq.wire import (
    DESCRIBE_REQUEST,
    END_SEQ,
    SNAPSHOT_REQUEST,
    SNAPSHOT_SEQ,
    offset_endpoint,
    pack_seq,
    should_bind,
)

# ------------------------------------------------------------------ config and endpoint rules


def test_config_defaults_mirror_vllm():
    c = PublisherConfig()
    assert (c.endpoint, c.replay_endpoint, c.bind, c.topic) == (
        "tcp://127.0.0.1:5557",
        None,
        True,
        "",
    )  # the contract, "Transport in one page": the default binds loopback
    assert (c.buffer_steps, c.hwm, c.max_queue_size, c.heartbeat_interval_s) == (10000, 100000, 100000, 1.0)
    assert (c.dp_rank, c.event_encoding, c.metrics_port) == (0, "map", None)
    with pytest.raises(ValueError):
        PublisherConfig(event_encoding="json")
    with pytest.raises(ValueError):
        PublisherConfig(bogus=1)


def test_bind_rule():
    assert should_bind("tcp://*:5557")
    assert should_bind("tcp://0.0.0.0:5557")
    assert should_bind("tcp://[::]:5557")
    assert should_bind("ipc:///tmp/x")
    assert should_bind("inproc://x")
    assert not should_bind("tcp://127.0.0.1:5557")
    assert not should_bind("tcp://router.example:5557")
    assert should_bind("tcp://127.0.0.1:5557", True)
    assert not should_bind("tcp://*:5557", False)


def test_dp_rank_offsets():
    assert offset_endpoint("tcp://127.0.0.1:5557", 0) == "tcp://127.0.0.1:5557"
    assert offset_endpoint("tcp://127.0.0.1:5557", 3) == "tcp://127.0.0.1:5560"
    assert offset_endpoint("tcp://*:5557", 1) == "tcp://*:5558"
    assert offset_endpoint("inproc://kv", 2) == "inproc://kv_dp2"
    assert offset_endpoint("tcp://127.0.0.1:*", 2) == "tcp://127.0.0.1:*"
    with pytest.raises(ValueError):
        offset_endpoint("tcp://127.0.0.1:65535", 1)


def test_dp_rank_binds_offset_port_and_tags_batches(ctx):
    import socket

    with socket.socket() as probe:  # a port that was free a moment ago; rank 2 binds port + 2
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = port - 2
    try:
        p = Publisher(endpoint=f"tcp://127.0.0.1:{base}", bind=True, dp_rank=2, heartbeat_interval_s=0)
    except ValueError:
        pytest.skip("port raced")
    try:
        assert p.endpoint == f"tcp://127.0.0.1:{port}"
        s = sub_socket(ctx, p.endpoint)
        wait_joined(p, s)
        p.publish([stored(1)])
        batch = decode_batch(s.recv_multipart()[2])
        assert batch.data_parallel_rank == 2 and batch.epoch is None  # the epoch is in DESCRIBE
        s.close(0)
    finally:
        p.close()
    inp = Publisher(endpoint="inproc://kvtest", dp_rank=1, heartbeat_interval_s=0, context=ctx)
    assert inp.endpoint == "inproc://kvtest_dp1"
    inp.close()


def test_connect_mode_reaches_a_binding_consumer(ctx):
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    port = s.bind_to_random_port("tcp://127.0.0.1")
    p = Publisher(endpoint=f"tcp://127.0.0.1:{port}", heartbeat_interval_s=0)  # vLLM rule: connect
    try:
        wait_joined(p, s)
        seq = p.publish([stored(5)])
        topic, seq_b, payload = s.recv_multipart()
        assert seq_b == pack_seq(seq)
    finally:
        p.close()
        s.close(0)


# ------------------------------------------------------------------ replay ROUTER


def test_replay_reply_shape_exact(ctx, pub):
    payload_seqs = [pub.publish(evs) for evs in chain_events(1, 5)]
    d = dealer_socket(ctx, pub.replay_endpoint)
    d.send_multipart([b"", pack_seq(2)])
    msgs = recv_all(d)
    assert [m[2] for m in msgs] == [pack_seq(s) for s in payload_seqs[2:]] + [END_SEQ]
    for m in msgs[:-1]:
        assert len(m) == 4 and m[0] == b"" and m[1] == b""
        assert len(msgspec.msgpack.decode(m[3])) == 3  # exactly the live bytes: [ts, events, rank]
    assert msgs[-1] == [b"", b"", END_SEQ, b""]
    # beyond the newest: only the end marker
    d.send_multipart([b"", pack_seq(99)])
    assert recv_all(d) == [[b"", b"", END_SEQ, b""]]
    d.close(0)


def test_replay_router_identity_frames_with_raw_router_client(ctx, pub):
    pub.publish([stored(1)])
    r = ctx.socket(zmq.DEALER)
    r.setsockopt(zmq.LINGER, 0)
    r.setsockopt(zmq.IDENTITY, b"me")
    r.connect(pub.replay_endpoint)
    r.send_multipart([b"", pack_seq(0)])
    msgs = recv_all(r)
    assert len(msgs) == 2 and len(msgs[0]) == 4  # the ROUTER strips/adds identity; we see the rest
    r.close(0)


def test_replay_start_older_than_oldest_starts_at_oldest(ctx):
    p = Publisher(endpoint=EPH, replay_endpoint=EPH, buffer_steps=3, heartbeat_interval_s=0)
    try:
        for evs in chain_events(1, 6):
            p.publish(evs)
        d = dealer_socket(ctx, p.replay_endpoint)
        d.send_multipart([b"", pack_seq(0)])
        msgs = recv_all(d)
        assert [m[2] for m in msgs] == [pack_seq(3), pack_seq(4), pack_seq(5), END_SEQ]
        d.close(0)
    finally:
        p.close()


# ------------------------------------------------------------------ snapshot and describe


def test_snapshot_parents_first_copies_and_end_seq(ctx, pub):
    pub.publish([AllBlocksCleared(), BlockStored([1, 2], None, [1, 1, 2, 2], 2, None, "GPU", None)])
    pub.publish([BlockStored([3], 2, [3, 3], 2, None, "GPU", None)])
    pub.publish([BlockStored([1, 2], None, [1, 1, 2, 2], 2, None, "GPU", None)])  # a second copy
    pub.publish([BlockStored([9], None, [9, 9], 2, None, "CPU_PINNED", None)])
    pub.publish([BlockRemoved([3], "GPU")])
    pub.publish([BlockStored([3], 2, [3, 3], 2, None, "GPU", None)])  # re-added after its children? fine
    last = pub.publish([BlockStored([4], 3, [4, 4], 2, None, "GPU", None, cache_salt="s")])
    d = dealer_socket(ctx, pub.replay_endpoint)
    d.send_multipart([b"", SNAPSHOT_REQUEST])
    msgs = recv_all(d)
    assert msgs[-1] == [b"", b"", END_SEQ, pack_seq(last)]
    body = msgs[:-1]
    assert all(m[2] == SNAPSHOT_SEQ and len(m) == 4 for m in body)
    events = [e for m in body for e in decode_batch(m[3]).events]
    assert isinstance(events[0], AllBlocksCleared)
    seen: dict = {}
    for e in events[1:]:
        assert isinstance(e, BlockStored)
        for i, h in enumerate(e.block_hashes):
            parent = e.parent_block_hash if i == 0 else e.block_hashes[i - 1]
            if parent is not None and (e.medium, parent) in {("GPU", 1), ("GPU", 2), ("GPU", 3)}:
                assert seen.get((e.medium, parent)), f"parent {parent} after child {h}"
            seen[(e.medium, h)] = seen.get((e.medium, h), 0) + 1
    assert seen == {("GPU", 1): 2, ("GPU", 2): 2, ("GPU", 3): 1, ("GPU", 4): 1, ("CPU_PINNED", 9): 1}
    salted = [e for e in events[1:] if 4 in e.block_hashes]
    assert salted[0].cache_salt == "s" and salted[0].token_ids == [4, 4]
    d.close(0)


def test_snapshot_includes_batches_dropped_by_force_drop(ctx, pub):
    pub.publish([stored(1)])
    pub.force_drop(1)
    pub.publish([stored(2, 1)])
    assert pub.stats()["dropped_queue_full"] == 1
    d = dealer_socket(ctx, pub.replay_endpoint)
    d.send_multipart([b"", pack_seq(0)])
    assert [m[2] for m in recv_all(d)] == [pack_seq(0), END_SEQ]  # seq 1 is not replayable
    d.send_multipart([b"", SNAPSHOT_REQUEST])
    msgs = recv_all(d)
    hashes = sorted(h for m in msgs[:-1] for e in decode_batch(m[3]).events for h in getattr(e, "block_hashes", []))
    assert hashes == [1, 2] and msgs[-1][3] == pack_seq(1)
    d.close(0)


def test_describe(ctx, pub):
    d = dealer_socket(ctx, pub.replay_endpoint)
    d.send_multipart([b"", DESCRIBE_REQUEST])
    assert d.poll(2000)
    empty = msgspec.msgpack.decode(d.recv_multipart()[1])
    assert empty["newest_seq"] is None and empty["page_size"] is None
    for evs in chain_events(1, 3, page=16):
        pub.publish(evs)
    d.send_multipart([b"", DESCRIBE_REQUEST])
    assert d.poll(2000)
    frames = d.recv_multipart()
    assert len(frames) == 2 and frames[0] == b""
    info = msgspec.msgpack.decode(frames[1])
    assert info["schema_version"] == 1 and isinstance(info["hash_scheme"], str)
    assert info["page_size"] == 16 and info["epoch"] == pub.epoch and info["topic"] == ""
    assert info["dp_rank"] == 0 and info["newest_seq"] == 2 and info["oldest_replayable_seq"] == 0
    assert pub.describe()["newest_seq"] == 2
    d.close(0)


def test_malformed_requests_get_no_reply_and_live_continues(ctx, pub):
    s = sub_socket(ctx, pub.endpoint)
    wait_joined(pub, s)
    d = dealer_socket(ctx, pub.replay_endpoint)
    bad = [
        [b"", pack_seq(0), b"extra"],  # wrong frame count
        [b"", b"\x00\x00\x01"],  # 3-byte start
        [b"", b"KVE/UNKNOWN"],  # unknown command (not 8 bytes: those are starts)
        [os.urandom(37)],  # random bytes, no delimiter
        [b"x", pack_seq(0)],  # non-empty delimiter
    ]
    before = pub.stats()["rejected_requests"]
    for msg in bad:
        d.send_multipart(msg)
    huge = dealer_socket(ctx, pub.replay_endpoint)
    huge.send_multipart([b"", b"\x00" * 2000])  # over MAXMSGSIZE: ZeroMQ drops that peer
    for i in range(50):
        pub.publish([stored(100 + i)])
    got = 0
    while s.poll(200):
        s.recv_multipart()
        got += 1
    assert got == 50
    assert not d.poll(300) and not huge.poll(10)  # no reply to any of them
    huge.close(0)
    assert pub.stats()["rejected_requests"] - before >= 5
    d.close(0)
    d2 = dealer_socket(ctx, pub.replay_endpoint)  # the ROUTER still serves well-formed requests
    d2.send_multipart([b"", DESCRIBE_REQUEST])
    assert d2.poll(2000)
    d2.close(0)
    s.close(0)


def test_replay_served_in_slices_while_live_flows(ctx):
    p = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0, buffer_steps=20000)
    s = sub_socket(ctx, p.endpoint)
    try:
        wait_joined(p, s)
        big = [stored(i) for i in range(32)]
        for _ in range(20000):
            p.publish(big)
        d = dealer_socket(ctx, p.replay_endpoint)
        d.send_multipart([b"", pack_seq(0)])
        t0 = time.perf_counter()
        live_lat = []
        for i in range(50):
            t = time.perf_counter()
            p.publish([stored(10**6 + i)])
            live_lat.append(time.perf_counter() - t)
        assert max(live_lat) < 0.05  # never waits for the replay
        replies = recv_all(d, 5000)
        assert replies[-1][2] == END_SEQ and len(replies) > 20000
        assert time.perf_counter() - t0 < 10
        d.close(0)
    finally:
        s.close(0)
        p.close()


# ------------------------------------------------------------------ heartbeats, queue mode, close


def test_heartbeats_take_the_next_seq_when_idle(ctx):
    p = Publisher(endpoint=EPH, heartbeat_interval_s=0.05)
    s = sub_socket(ctx, p.endpoint)
    try:
        wait_joined(p, s)
        seq = p.publish([stored(1)])
        seqs = []
        while len(seqs) < 3 and s.poll(1000):
            _, seq_b, payload = s.recv_multipart()
            b = decode_batch(payload)
            if not b.events and int.from_bytes(seq_b, "big") > seq:
                seqs.append(int.from_bytes(seq_b, "big"))
        assert seqs[0] == seq + 1 and seqs == sorted(seqs) and len(set(seqs)) == 3
        assert p.stats()["heartbeats"] >= 3
    finally:
        s.close(0)
        p.close()


def test_queue_mode_accounts_every_seq(ctx):
    p = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0, max_queue_size=2, send_mode="queue")
    try:
        seqs = [p.publish(evs) for evs in chain_events(1, 2000)]
        assert seqs == list(range(2000))
        assert p.close(timeout=2.0) == 0
        st = p.stats()
        assert st["batches_published"] == 2000 and st["live_blocks"] == 2000  # the view saw dropped ones too
        assert st["ring_size"] + st["dropped_queue_full"] == 2000
    finally:
        p.close()


def test_close_reports_unsent_in_queue_mode():
    p = Publisher(endpoint=EPH, heartbeat_interval_s=0, send_mode="queue", max_queue_size=1000)
    p._lock.acquire()  # the sender cannot send while we hold the lock
    try:
        for evs in chain_events(1, 50):
            p._queue.put_nowait((0, 0.0, evs, None, (0, p.epoch)))  # type: ignore[union-attr]
            p._pending += 1  # what _publish counts with each put (close() reports the rest as unsent)
    finally:
        p._lock.release()
    unsent = p.close(timeout=0.0)
    assert 0 <= unsent <= 50
    with pytest.raises(ValueError):
        p.publish([])


def test_bad_endpoint_is_a_value_error():
    with pytest.raises(ValueError):
        Publisher(endpoint="bogus://x", heartbeat_interval_s=0)


def test_metrics_port_exposes_counters(pub):
    import urllib.request

    p = Publisher(endpoint=EPH, heartbeat_interval_s=0, metrics_port=0)  # 0: a free port
    port = p.metrics_port
    try:
        assert port
        p.publish([stored(1), stored(2)])
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        assert "kvevents_publisher_batches_total" in body and "kvevents_publisher_events_total" in body
    finally:
        p.close()


def test_large_snapshot_does_not_stall_live_publishing(ctx):
    p = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0)
    try:
        for b in range(500):  # 50k live blocks in chains of 100
            p.publish([BlockStored(list(range(b * 100 + 1, b * 100 + 101)), None, [1] * 200, 2, None, "GPU", None)])
        d = dealer_socket(ctx, p.replay_endpoint)
        d.send_multipart([b"", SNAPSHOT_REQUEST])
        worst = 0.0
        for i in range(200):
            t = time.perf_counter()
            p.publish([stored(10**7 + i)])
            worst = max(worst, time.perf_counter() - t)
            time.sleep(0.0005)
        msgs = recv_all(d, 5000)
        assert msgs[-1][2] == END_SEQ
        S = int.from_bytes(msgs[-1][3], "big")  # the view at the moment the request was served
        n = sum(len(e.block_hashes) for m in msgs[:-1] for e in decode_batch(m[3]).events if isinstance(e, BlockStored))
        assert S >= 499 and n == 50000 + (S - 499)
        assert worst < 0.05, f"a publish waited {worst * 1e3:.1f} ms during the snapshot"
        d.close(0)
    finally:
        p.close()


# ------------------------------------------------------------------ epoch, ports, request rule, encoding


def test_config_epoch_is_validated_and_used(ctx):
    with pytest.raises(ValueError):
        PublisherConfig(epoch=-1)
    with pytest.raises(ValueError):
        PublisherConfig(epoch=2**63)
    assert PublisherConfig().epoch is None
    p = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0, epoch=2**63 - 1, epoch_in_batch=True)
    try:
        assert p.epoch == 2**63 - 1 and p.describe()["epoch"] == 2**63 - 1
        with pytest.raises(AttributeError):
            p.epoch = 5  # type: ignore[misc]  # fixed for the publisher's lifetime: set it in the config
        p.publish([stored(1)])
        d = dealer_socket(ctx, p.replay_endpoint)
        d.send_multipart([b"", pack_seq(0)])
        assert decode_batch(recv_all(d)[0][3]).epoch == 2**63 - 1
        d.close(0)
    finally:
        p.close()
    q = Publisher(PublisherConfig(endpoint=EPH, heartbeat_interval_s=0, epoch=0))
    assert q.epoch == 0
    q.close()


def test_close_releases_ports_at_once(ctx):
    first = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0)
    ep, rep = first.endpoint, first.replay_endpoint  # ports the next publishers bind again at once
    s = sub_socket(ctx, ep)  # a connected peer must not keep the port busy
    first.close(timeout=0.2)
    try:
        for i in range(20):
            p = Publisher(endpoint=ep, replay_endpoint=rep, bind=True, heartbeat_interval_s=0)  # no retry
            p.publish([stored(i)])
            assert p.close(timeout=0.2) == 0
    finally:
        s.close(0)


def test_shared_context_is_not_terminated(ctx):
    p = Publisher(endpoint=EPH, heartbeat_interval_s=0, context=ctx)
    p.close()
    assert not ctx.closed
    ctx.socket(zmq.PUB).close(0)  # still usable


def test_any_eight_byte_request_is_a_replay_start(ctx, pub):
    from kvevents.zeromq.wire import COMMANDS

    assert all(len(c) != 8 for c in COMMANDS) and all(c.startswith(b"KVE/") for c in COMMANDS)
    pub.publish([stored(1)])
    d = dealer_socket(ctx, pub.replay_endpoint)
    d.send_multipart([b"", b"KVE/SNAP"])  # 8 bytes: a (huge) start, never a command
    assert recv_all(d) == [[b"", b"", END_SEQ, b""]]
    d.send_multipart([b"", b"\x00" * 8])
    assert [m[2] for m in recv_all(d)] == [pack_seq(0), END_SEQ]
    assert pub.stats()["replay_requests"] == 2 and pub.stats()["snapshot_requests"] == 0
    d.close(0)


def test_view_counts_copies_repeated_inside_one_event(ctx, pub):
    from kvevents.testing.zeromq import view_counts

    pub.publish([BlockStored([1, 2, 1], None, [1, 1, 2, 2, 1, 1], 2, None, "GPU", None)])
    assert view_counts(pub) == {("GPU", 1): 2, ("GPU", 2): 1}
    pub.publish([BlockRemoved([1], "GPU")])
    assert view_counts(pub) == {("GPU", 1): 1, ("GPU", 2): 1}
    pub.publish([BlockRemoved([1, 1, 2], "GPU")])
    assert view_counts(pub) == {}
