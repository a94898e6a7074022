"""Publisher wire compatibility: live frames, strict vLLM / SGLang decoders, publish API, snapshots=False."""

from __future__ import annotations

import msgspec
import pytest

from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch
from kvevents.testing.zeromq import EPH, chain_events, dealer_socket, recv_all, stored, sub_socket, wait_joined
from kvevents.zeromq.publisher import Publisher, PublisherConfig, publish_steps
from kvevents.zeromq.wire import DESCRIBE_REQUEST, END_SEQ, SNAPSHOT_REQUEST, pack_seq
from tests.helpers.strict_decoders import VllmBatch, VllmStored

# ------------------------------------------------------------------ live wire


@pytest.mark.parametrize("epoch_in_batch", [False, True])
def test_live_frames_seq_epoch_and_topic(ctx, epoch_in_batch):
    p = Publisher(endpoint=EPH, topic="kv@w0", heartbeat_interval_s=0, epoch_in_batch=epoch_in_batch)
    s = sub_socket(ctx, p.endpoint)
    try:
        wait_joined(p, s)
        first = p.stats()["next_seq"]
        seqs = [p.publish(evs, ts=1700000000.5) for evs in chain_events(10, 3)]
        assert seqs == [first, first + 1, first + 2]
        for seq in seqs:
            topic, seq_b, payload = s.recv_multipart()
            assert topic == b"kv@w0" and len(seq_b) == 8 and int.from_bytes(seq_b, "big") == seq
            raw = msgspec.msgpack.decode(payload)
            assert raw[0] == 1700000000.5 and raw[2] == 0
            assert raw[3:] == ([p.epoch] if epoch_in_batch else [])  # opt-in 4th element only
            assert 0 <= p.epoch < 2**63
    finally:
        s.close(0)
        p.close()


def test_seq_starts_at_zero_and_epochs_differ():
    a = Publisher(endpoint=EPH, heartbeat_interval_s=0)
    b = Publisher(endpoint=EPH, heartbeat_interval_s=0)
    try:
        assert a.publish([]) == 0 and a.publish([stored(1)]) == 1
        assert a.epoch != b.epoch
    finally:
        a.close()
        b.close()


class _LegacyStored(msgspec.Struct, array_like=True, tag="BlockStored"):
    """vLLM <= 0.23's positional BlockStored: lora_name at [7] (later elements ignored)."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None


class _SGLangStored(msgspec.Struct, array_like=True, tag="BlockStored"):
    """SGLang <= 0.5.19's positional BlockStored: an optional map {"cache_salt": ...} at [7]."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    extras: dict[str, str] | None = None


class _LegacyRemoved(msgspec.Struct, array_like=True, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class _LegacyCleared(msgspec.Struct, array_like=True, tag="AllBlocksCleared"):
    pass


class _LegacyBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_LegacyStored | _LegacyRemoved | _LegacyCleared]
    data_parallel_rank: int | None = None


class _SGLangBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_SGLangStored | _LegacyRemoved | _LegacyCleared]
    data_parallel_rank: int | None = None


EVENTS = [
    AllBlocksCleared(),
    BlockStored([-(2**63), 2**63 - 1], None, [1, 2, 3, 4], 2, None, None, None, cache_salt="t"),
    BlockRemoved([5], "GPU"),
]


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_payloads_decode_with_strict_external_decoders(ctx, encoding):
    p = Publisher(endpoint=EPH, heartbeat_interval_s=0, event_encoding=encoding)
    s = sub_socket(ctx, p.endpoint)
    try:
        wait_joined(p, s)
        p.publish(EVENTS)
        payload = s.recv_multipart()[2]
    finally:
        s.close(0)
        p.close()
    if encoding == "map":
        b = msgspec.msgpack.decode(payload, type=VllmBatch)  # strict: exactly 3 elements
        assert isinstance(b.events[1], VllmStored) and b.events[1].medium is None and b.events[1].lora_name is None
    else:  # the salted store takes SGLang's legacy layout
        b = msgspec.msgpack.decode(payload, type=_SGLangBatch)
        assert isinstance(b.events[1], _SGLangStored) and b.events[1].extras == {"cache_salt": "t"}
    assert b.events[1].block_hashes == [-(2**63), 2**63 - 1]
    names = [
        type(e).__name__.strip("_").replace("Vllm", "").replace("Legacy", "").replace("SGLang", "") for e in b.events
    ]
    assert names == ["Cleared", "Stored", "Removed"]
    assert decode_batch(payload).events == EVENTS


def test_unsalted_array_payloads_decode_with_a_strict_vllm_legacy_decoder(ctx):
    p = Publisher(endpoint=EPH, heartbeat_interval_s=0, event_encoding="array")
    s = sub_socket(ctx, p.endpoint)
    events = [BlockStored([1, 2], None, [1, 2], 1, None, "GPU", "adapter-1"), BlockRemoved([2], "GPU")]
    try:
        wait_joined(p, s)
        p.publish(events)
        payload = s.recv_multipart()[2]
    finally:
        s.close(0)
        p.close()
    b = msgspec.msgpack.decode(payload, type=_LegacyBatch)
    assert isinstance(b.events[0], _LegacyStored) and b.events[0].lora_name == "adapter-1"
    assert decode_batch(payload).events == events


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_live_payload_bytes_equal_encode_batch(ctx, encoding):
    from kvevents.events import KVEventBatch, encode_batch

    p = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0, event_encoding=encoding, epoch=77)
    try:
        p.publish(EVENTS, ts=5)  # an int ts is still a float64 on the wire
        d = dealer_socket(ctx, p.replay_endpoint)
        d.send_multipart([b"", pack_seq(0)])
        got = recv_all(d)[0][3]
        assert got == encode_batch(KVEventBatch(5.0, EVENTS, 0), event_encoding=encoding)
        d.close(0)
    finally:
        p.close()


def test_publish_rejects_non_events_without_consuming_a_seq(pub):
    with pytest.raises(ValueError):
        pub.publish([object()])  # type: ignore[list-item]
    assert pub.publish([]) == 0


def test_publish_payload_republishes_bytes_and_updates_view(ctx, pub):
    from kvevents.events import KVEventBatch, encode_batch

    raw = encode_batch(KVEventBatch(1.0, [stored(7)], 0))
    with_epoch = encode_batch(KVEventBatch(2.0, [stored(8)], 0, 123))
    assert pub.publish_payload(raw) == 0 and pub.publish_payload(with_epoch) == 1
    assert pub.stats()["live_blocks"] == 2 and pub.describe()["epoch"] == 123
    d = dealer_socket(ctx, pub.replay_endpoint)
    d.send_multipart([b"", pack_seq(0)])
    msgs = recv_all(d)
    assert msgs[0][3] == raw  # exact bytes kept
    assert msgs[1][3] == encode_batch(KVEventBatch(2.0, [stored(8)], 0))  # the default wire stays 3 elements
    d.close(0)
    with pytest.raises(ValueError):
        pub.publish_payload(b"\xc1garbage")


def test_publish_steps_helper(pub):
    class Engine:
        def __init__(self):
            self.q = [[stored(1)], []]

        def take_events(self):
            return self.q.pop(0)

    e = Engine()
    assert publish_steps(e, pub) == 0
    assert publish_steps(e, pub) is None


# ------------------------------------------------------------------ snapshots=False (vLLM feature parity)


def test_snapshots_config_defaults_on_and_no_view_without_a_replay_endpoint():
    assert PublisherConfig().snapshots is True and PublisherConfig(snapshots=False).snapshots is False
    for snapshots in (True, False):
        p = Publisher(endpoint=EPH, heartbeat_interval_s=0, snapshots=snapshots)  # no replay endpoint
        try:
            p.publish([stored(1), stored(2, 1)])
            assert not p._keep_view and p.stats()["live_blocks"] == 0
        finally:
            p.close()


def test_snapshots_off_replay_and_describe_answer_snapshot_is_rejected(ctx):
    p = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0, snapshots=False)
    d = dealer_socket(ctx, p.replay_endpoint)
    try:
        seqs = [p.publish(evs) for evs in chain_events(1, 5, page=16)]
        p.publish([BlockRemoved([1], "GPU")])
        assert p.stats()["live_blocks"] == 0  # no view is kept
        d.send_multipart([b"", pack_seq(1)])
        msgs = recv_all(d)
        assert [m[2] for m in msgs] == [pack_seq(s) for s in seqs[1:]] + [pack_seq(5), END_SEQ]
        assert decode_batch(msgs[0][3]).events == chain_events(1, 5, page=16)[1]
        before = p.stats()["rejected_requests"]
        d.send_multipart([b"", SNAPSHOT_REQUEST])
        assert not d.poll(300)  # no reply at all
        st = p.stats()
        assert st["rejected_requests"] == before + 1 and st["snapshot_requests"] == 0
        d.send_multipart([b"", DESCRIBE_REQUEST])  # the ROUTER still serves the others
        assert d.poll(2000)
        info = msgspec.msgpack.decode(d.recv_multipart()[1])
        assert info["page_size"] == 16 and info["newest_seq"] == 5 and info["oldest_replayable_seq"] == 0
        d.send_multipart([b"", pack_seq(5)])
        assert [m[2] for m in recv_all(d)] == [pack_seq(5), END_SEQ]
    finally:
        d.close(0)
        p.close()


def test_snapshots_off_live_frames_are_the_same_bytes(ctx):
    """snapshots=False changes nothing on the live stream: same frames as with the view."""
    got = {}
    for snapshots in (True, False):
        p = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0, epoch=9, snapshots=snapshots)
        s = sub_socket(ctx, p.endpoint)
        try:
            wait_joined(p, s)
            first = p.stats()["next_seq"]
            batches = [EVENTS, *chain_events(1, 20), [BlockRemoved([3, 4], "GPU")], []]
            seqs = [p.publish(evs, ts=2.5) for evs in batches]
            frames = [s.recv_multipart() for _ in batches if s.poll(2000)]
            assert [f[1] for f in frames] == [pack_seq(q) for q in seqs]
            got[snapshots] = [(f[0], int.from_bytes(f[1], "big") - first, f[2]) for f in frames]
            assert p.stats()["live_blocks"] == (2 + 20 - 2 if snapshots else 0)
        finally:
            s.close(0)
            p.close()
    assert got[True] == got[False] and len(got[True]) == 23


def test_publish_and_publish_payload_on_two_threads_never_mix_stream_ids():
    """Each batch carries its own caller's rank and epoch (the ids switch under the publish lock)."""
    import threading

    from kvevents.events import KVEventBatch, encode_batch

    p = Publisher(
        endpoint=EPH,
        replay_endpoint=EPH,
        heartbeat_interval_s=0,
        epoch_in_batch=True,
        buffer_steps=50000,
        snapshots=False,
    )
    other = encode_batch(KVEventBatch(1.0, [stored(99)], 9, 4242))
    n = 8000
    try:
        t = threading.Thread(target=lambda: [p.publish_payload(other) for _ in range(n)])
        t.start()
        for _ in range(n):
            p.publish([stored(1)])
        t.join()
        mine = other_seen = 0
        for _, _, payload in p.ring_items():
            b = decode_batch(payload)
            if b.events[0].block_hashes == [1]:
                mine += 1
                assert (b.data_parallel_rank, b.epoch) == (0, p.epoch)
            else:
                other_seen += 1
                assert (b.data_parallel_rank, b.epoch) == (9, 4242)
        assert mine == other_seen == n
    finally:
        p.close()
