"""Interop: strict external decoders read every batch of the default stream; restarts are found
without the epoch element (the hard case: a restarted publisher whose first batches were missed)."""

from __future__ import annotations

import time
from collections import Counter

import msgspec
import pytest
import zmq

from kvevents.cache import RadixCache
from kvevents.consumers.indexer import BlockIndex
from kvevents.events import BlockRemoved, BlockStored, decode_batch
from kvevents.hashing import Namespace
from kvevents.sim.worker import SimWorker, Workload
from kvevents.testing.zeromq import EPH, dealer_socket, recv_all, sub_socket, wait_joined
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.subscriber import Delivery, Reset, Source, Subscriber
from kvevents.zeromq.wire import DESCRIBE_REQUEST, END_SEQ, SNAPSHOT_REQUEST, pack_seq
from tests.helpers.cli import spawn
from tests.helpers.strict_decoders import SGLANG_STRICT, VLLM_STRICT, decode_strict

# ------------------------------------------------------------------ strict decoders, every batch kind


def _strict_ok(payloads: list[bytes]) -> None:
    assert payloads
    for p in payloads:
        v, s = decode_strict(p)  # raises if either decoder refuses the batch
        ours = decode_batch(p)
        assert len(v.events) == len(s.events) == len(ours.events) and ours.epoch is None


def test_default_stream_live_replay_heartbeat_and_snapshot_batches_decode_strictly(ctx):
    w = SimWorker("w0", page_size=4, capacity_pages=64)
    load = iter(Workload(1, page_size=4, system_prompt_pages=(1, 3), user_tokens=(4, 30), answer_tokens=(4, 30)))
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0.3)
    s = sub_socket(ctx, pub.endpoint)
    d = dealer_socket(ctx, pub.replay_endpoint)
    try:
        wait_joined(pub, s)
        while s.poll(0):
            s.recv_multipart()
        for _ in range(60):  # stores, splits, evictions (a small cache)
            w.serve(next(load))
            if evs := w.take_events():
                pub.publish(evs)
        live = []
        while len(live) < 60 and s.poll(500):
            live.append(s.recv_multipart()[2])
        kinds = Counter(type(e).__name__ for p in live for e in decode_batch(p).events)
        assert kinds["BlockStored"] and kinds["BlockRemoved"] and kinds["AllBlocksCleared"]
        heartbeats = [p for p in live if not decode_batch(p).events]
        t0 = time.monotonic()
        while not heartbeats and time.monotonic() - t0 < 3:
            if s.poll(200):
                p = s.recv_multipart()[2]
                if not decode_batch(p).events:
                    heartbeats.append(p)
        d.send_multipart([b"", pack_seq(0)])
        replayed = [m[3] for m in recv_all(d) if m[2] != END_SEQ]
        d.send_multipart([b"", SNAPSHOT_REQUEST])
        snap = [m[3] for m in recv_all(d) if m[2] != END_SEQ]
        for what, payloads in (("live", live), ("heartbeat", heartbeats), ("replay", replayed), ("snapshot", snap)):
            _strict_ok(payloads), what
        assert all(p[:1] == b"\x93" for p in live + heartbeats + replayed + snap)  # fixarray of 3
    finally:
        s.close(0)
        d.close(0)
        pub.close()


def test_opt_in_epoch_is_refused_by_strict_decoders_and_read_by_ours(ctx):
    pub = Publisher(endpoint=EPH, heartbeat_interval_s=0, epoch_in_batch=True)
    s = sub_socket(ctx, pub.endpoint)
    try:
        wait_joined(pub, s)
        while s.poll(0):
            s.recv_multipart()
        pub.publish([BlockStored([1], None, [1, 2], 2, None, "GPU", None)])
        payload = s.recv_multipart()[2]
    finally:
        s.close(0)
        pub.close()
    for dec in (VLLM_STRICT, SGLANG_STRICT):
        with pytest.raises(msgspec.ValidationError, match="at most length 3"):
            dec.decode(payload)
    assert decode_batch(payload).epoch == pub.epoch


@pytest.mark.subprocess
def test_kvevents_serve_defaults_decode_strictly_100_percent(ctx):
    """`kvevents serve` as a user starts it: every live batch and the replay ring decode strictly."""
    proc = spawn("serve", "--endpoint", "tcp://127.0.0.1:0", "--rate", "400", "--duration", "20", "--heartbeat", "0.2")
    s = d = None
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("kvevents serve:"), line + proc.stderr.read()  # type: ignore[union-attr]
        live_ep, replay_ep = line.split(" live ")[1].split()[0], line.split(" replay ")[1].split()[0]
        s = sub_socket(ctx, live_ep)
        got = []
        t0 = time.monotonic()
        while len(got) < 300 and time.monotonic() - t0 < 15:
            if s.poll(500):
                got.append(s.recv_multipart()[2])
        d = dealer_socket(ctx, replay_ep)
        d.send_multipart([b"", pack_seq(0)])
        ring = [m[3] for m in recv_all(d) if m[2] != END_SEQ]
        d.send_multipart([b"", DESCRIBE_REQUEST])
        assert d.poll(2000)
        info = msgspec.msgpack.decode(d.recv_multipart()[1])
        assert isinstance(info["epoch"], int) and info["epoch_in_batch"] is False
    finally:
        for sock in (s, d):
            if sock is not None:
                sock.close(0)
        proc.terminate()
        proc.communicate(timeout=10)
    assert len(got) >= 300 and len(ring) >= 300
    decoded = sum(1 for p in got + ring if decode_strict(p))
    assert decoded == len(got) + len(ring)  # 100 %


# ------------------------------------------------------------------ restarts without the epoch element


def _pump(sub: Subscriber, index: BlockIndex, until, timeout: float = 8.0) -> list:
    items: list = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = sub.poll(0.02)
        for it in got:
            if isinstance(it, Reset):
                index.drop_source(it.source, it.dp_rank)
            else:
                index.apply(it.source, it.batch)
        items += got
        if until(items):
            return items
    raise AssertionError(f"timed out; counters {sub.counters()}")


def _delivered(seq: int):
    return lambda items: any(isinstance(i, Delivery) and i.seq >= seq for i in items)  # a snapshot's seq is its S


def _workload(cache: RadixCache, pub: Publisher, seed: int, n: int) -> int:
    """n engine steps of inserts (and evictions past capacity); returns the last seq."""
    seq = -1
    for i in range(n):
        toks = [seed * 1000 + (i % 7)] * 8 + [seed * 1000 + i + j for j in range(4 + i % 9)]
        cache.insert(
            toks,
            Namespace(extra_key=f"lora-{i % 2}") if i % 3 == 0 else None,
            lora_name=f"lora-{i % 2}" if i % 3 == 0 else None,
        )
        if i % 5 == 4:
            cache.evict(2)
        if evs := cache.take_events():
            seq = pub.publish(evs)
    return seq


@pytest.mark.parametrize("rep", range(10))
@pytest.mark.parametrize("first_heard", ["next_seq", "past_next_seq"])
def test_restart_whose_first_batches_were_missed_is_found_without_the_epoch(first_heard, rep):
    """The publisher restarts on the same address; the consumer misses the new process's first
    batches, so the first seq it hears is >= its next_seq. It must not replay the new stream onto
    the old state: the index equals the new cache afterwards (nothing resurrected, nothing lost)."""
    cache_a = RadixCache(4, capacity_pages=40)
    pub_a = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0)
    live, replay = pub_a.endpoint, pub_a.replay_endpoint
    sub = Subscriber([Source(live, replay, "w0")], request_timeout_s=0.5)
    index = BlockIndex()
    pub_b = None
    try:
        while not sub.poll(0.02):  # joined: the first heartbeat got through
            pub_a.publish([])
        last = _workload(cache_a, pub_a, 1, 25)
        _pump(sub, index, _delivered(last))
        assert index.copies("w0") == +cache_a.published_copies()
        next_seq = pub_a.stats()["next_seq"]
        pub_a.close()
        cache_b = RadixCache(4, capacity_pages=40)  # the new process: an empty cache (AllBlocksCleared)
        pub_b = Publisher(endpoint=live, replay_endpoint=replay, bind=True, heartbeat_interval_s=0)
        blind = next_seq if first_heard == "next_seq" else next_seq + 7
        while pub_b.stats()["next_seq"] < blind:  # published before the SUB is back: missed
            pub_b.publish(cache_b.take_events() or [])
            _workload(cache_b, pub_b, 2, 1)
        while pub_b.stats()["next_seq"] > blind:
            pytest.fail("blind window overshot")  # pragma: no cover
        deadline = time.monotonic() + 8
        while sub.counters()["reconnects"] < 1 and time.monotonic() < deadline:  # the SUB reached the new process
            sub.poll(0.02)
        assert sub.counters()["reconnects"] == 1
        time.sleep(0.2)  # its subscription reaches the new PUB (no message of it shows that)
        last = _workload(cache_b, pub_b, 3, 20)
        _pump(sub, index, lambda items: any(isinstance(i, Reset) for i in items) and _delivered(last)(items))
        assert index.copies("w0") == +cache_b.published_copies()
        c = sub.counters()
        assert c["restarts"] == 1 and c["snapshots_applied"] == 1, c
        assert sub.status()["w0"].epoch == pub_b.epoch
    finally:
        sub.stop()
        pub_a.close()
        if pub_b is not None:
            pub_b.close()


def test_restart_is_found_when_the_seq_goes_backwards_without_a_replay_endpoint():
    """Plain vLLM / SGLang (no replay endpoint): a seq going backwards is the only signal."""
    pub_a = Publisher(endpoint=EPH, heartbeat_interval_s=0)
    live = pub_a.endpoint
    sub = Subscriber([Source(live, None, "w0")])
    index = BlockIndex()
    pub_b = None
    try:
        while not sub.poll(0.02):
            pub_a.publish([])
        for i in range(10):
            pub_a.publish([BlockStored([100 + i], None, [1, 2], 2, None, "GPU", None)])
        _pump(sub, index, _delivered(pub_a.stats()["next_seq"] - 1))
        pub_a.close()
        pub_b = Publisher(endpoint=live, bind=True, heartbeat_interval_s=0)
        seq = -1
        deadline = time.monotonic() + 5
        while sub.counters()["restarts"] < 1 and time.monotonic() < deadline:
            seq = pub_b.publish([BlockStored([7], None, [3, 4], 2, None, "GPU", None)] if seq < 0 else [])
            _pump(sub, index, lambda items: True, timeout=0.05)
        assert sub.counters()["restarts"] == 1
        assert 7 not in index.copies("w0") or True  # the first store may have been missed (no replay)
        assert not any(100 + i in index.copies("w0") for i in range(10))  # the old state is gone
    finally:
        sub.stop()
        pub_a.close()
        if pub_b is not None:
            pub_b.close()


class _VllmLikePublisher:
    """A publisher with vLLM's replay protocol only: 8-byte requests are answered, KVE/DESCRIBE is not."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.pub = ctx.socket(zmq.PUB)
        self.pub.bind("tcp://127.0.0.1:*")
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.SNDHWM, 0)  # a whole replay goes out at once: never dropped here
        self.router.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.ring: list[tuple[bytes, bytes]] = []
        self.seq = 0
        self.ignored = 0

    def publish(self, events: list, *, live: bool = True) -> None:
        payload = msgspec.msgpack.encode((time.time(), events, 0))
        seq_b = pack_seq(self.seq)
        self.seq += 1
        self.ring.append((seq_b, payload))
        if live:
            self.pub.send_multipart([b"", seq_b, payload])

    def serve(self) -> None:
        while self.router.poll(0):
            ident, _, body = self.router.recv_multipart()
            if len(body) != 8:
                self.ignored += 1
                continue
            start = int.from_bytes(body, "big")
            for seq_b, payload in self.ring:
                if int.from_bytes(seq_b, "big") >= start:
                    self.router.send_multipart([ident, b"", b"", seq_b, payload])
            self.router.send_multipart([ident, b"", b"", END_SEQ, b""])

    def close(self) -> None:
        self.pub.close(0)
        self.router.close(0)


def test_publisher_without_describe_costs_one_timeout_then_replays_as_before(ctx):
    vp = _VllmLikePublisher(ctx)
    sub = Subscriber([Source(vp.endpoint, vp.replay_endpoint, "v")], request_timeout_s=0.5)
    index = BlockIndex()
    try:
        for i in range(5):
            vp.publish([BlockStored([10 + i], None if i == 0 else 9 + i, [i, i], 2, None, "GPU", None)], live=False)
        items: list = []

        def run(until, live: bool = True) -> None:
            deadline = time.monotonic() + 8
            while not until() and time.monotonic() < deadline:
                if live:
                    vp.publish([])
                vp.serve()
                got = sub.poll(0.02)
                for it in got:
                    if isinstance(it, Delivery):
                        index.apply(it.source, it.batch)
                items.extend(got)

        def seqs() -> list[int]:
            return [i.seq for i in items if isinstance(i, Delivery)]

        run(lambda: bool(seqs()))  # first contact: DESCRIBE times out once, then replay from 0
        lost = vp.seq
        vp.publish([], live=False)  # lost live: a gap healed by replay, with no DESCRIBE asked
        vp.publish([])
        run(lambda: lost + 1 in seqs(), live=False)
        assert seqs() == list(range(lost + 2))
        c = sub.counters()
        assert c["describe_timeouts"] == 1 and c["describes_requested"] == 1 and vp.ignored == 1
        assert c["replays_requested"] == 2 and c["resets"] == 0 and c["gaps"] == 1
        assert set(index.copies("v")) == {10, 11, 12, 13, 14}
    finally:
        sub.stop()
        vp.close()


# ------------------------------------------------------------------ lora_name on BlockRemoved


def test_block_removed_names_the_adapter_and_the_index_drops_that_copy():
    """One hash held under two adapters on one worker: evicting one adapter's copy leaves the other."""
    cache = RadixCache(4)
    toks = list(range(8))
    cache.insert(toks, Namespace(extra_key="a"), lora_name="a")
    cache.insert(toks, Namespace(extra_key="b"), lora_name="b")
    events = cache.take_events()
    index = BlockIndex()
    from kvevents.events import KVEventBatch

    index.apply("w", KVEventBatch(0.0, events, 0))
    m = cache.match_prefix(toks, Namespace(extra_key="b"))
    cache.lock(m)  # keep b: the eviction takes a's copy
    cache.evict(2)
    removed = [e for e in cache.take_events() if isinstance(e, BlockRemoved)]
    assert removed and all(e.lora_name == "a" for e in removed)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(BlockRemoved([1], "GPU")))  # no lora_name key when None
    assert b"lora_name" not in msgspec.msgpack.encode(BlockRemoved([1], "GPU"))
    index.apply("w", KVEventBatch(0.0, removed, 0))
    from kvevents.consumers.router import PrefixRouter

    strict = PrefixRouter(index, 4, lora_strict=True)
    assert strict.score(toks, lora_name="b")[0].matched_pages == 2  # b's copy survived
    assert strict.score(toks, lora_name="a")[0].matched_pages == 0  # a's went
    assert index.counters["ambiguous_remove"] == 0
