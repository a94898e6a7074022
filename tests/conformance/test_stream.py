"""`conformance stream` rules: a live kvevents publisher passes every rule; each deliberately
broken publisher fails with its rule named (real ZeroMQ sockets on 127.0.0.1, ephemeral ports)."""

from __future__ import annotations

import random
import time

import pytest

from kvevents.cache import RadixCache
from kvevents.conformance.report import Status
from kvevents.conformance.stream import StreamObserver, StreamOptions
from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvevents.hashing import Namespace, storage_hashes, to_int64
from kvevents.testing.zeromq import EPH
from kvevents.zeromq.publisher import Publisher, publish_steps
from tests.helpers.conformance_fakes import FakeEngine, observe_fake
from tests.helpers.payloads import batch as payload

NAMESPACES = [Namespace(), Namespace("lora-a", None), Namespace(None, "tenant-a"), Namespace("lora-b", "tenant-b")]


def _workload(cache: RadixCache, pub: Publisher, obs: StreamObserver, steps: int) -> None:
    rng = random.Random(7)
    prefixes = [[rng.randrange(32000) for _ in range(4 * rng.randint(1, 4))] for _ in range(6)]
    for step in range(steps):
        ns = NAMESPACES[step % len(NAMESPACES)]
        tokens = rng.choice(prefixes) + [rng.randrange(32000) for _ in range(rng.randint(0, 14))]
        cache.insert(tokens, ns, lora_name=ns.extra_key)
        if step == 60:
            pub.drop_live(3)  # a gap the kit must heal by replay
        if step == 100:
            cache.reset()  # AllBlocksCleared mid-stream
        publish_steps(cache, pub)
        if step % 8 == 0:
            obs.pump(0.005)


def test_live_kvevents_publisher_passes_every_rule() -> None:
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0)
    try:
        cache = RadixCache(4, capacity_pages=40)
        with StreamObserver(StreamOptions(pub.endpoint, pub.replay_endpoint, 4, reply_timeout=1.0)) as obs:
            _workload(cache, pub, obs, 160)
            deadline = time.monotonic() + 5.0
            while obs.checker.expected != pub.stats()["next_seq"] and time.monotonic() < deadline:
                obs.pump(0.02)
            report = obs.finish(quiet=0.05)
    finally:
        pub.close(0)
    assert report.ok, report.table()
    for r in report.results:
        assert r.status is Status.PASS, report.table()
    assert report.result("gaps-healed").checked >= 1  # the dropped batches were replayed
    assert report.result("removes-live").checked > 0  # evictions happened and were judged
    assert report.result("all-cleared").checked >= 2  # the constructor's and the reset's
    assert report.figures["complete"] is True


def _stored(cache: RadixCache, tokens: list[int], ns: Namespace | None = None, lora: str | None = None) -> list:
    cache.insert(tokens, ns, lora_name=lora)
    return cache.take_events()


def test_storage_hashes_published_fail_hash_recompute() -> None:
    cache = RadixCache(2)
    head = cache.take_events()  # AllBlocksCleared
    ns = Namespace("lora-a", None)
    events = _stored(cache, [1, 2, 3, 4, 5, 6], ns, "lora-a")
    ev = events[0]
    ev.block_hashes = [to_int64(h) for h in storage_hashes(ev.token_ids, 2, ns)]  # the mistake
    eng = FakeEngine()
    try:
        report = observe_fake(eng, [(0, payload(head), True), (1, payload(events), True)])
    finally:
        eng.close()
    assert report.failed() == ["hash-recompute"], report.table()
    assert "storage hash" in report.result("hash-recompute").detail


def test_extra_batch_element_fails_batch_shape_unless_allowed() -> None:
    script = [(0, payload([AllBlocksCleared()], epoch=7), True), (1, payload([], epoch=7), True)]
    eng = FakeEngine()
    try:
        report = observe_fake(eng, script)
    finally:
        eng.close()
    assert report.failed() == ["batch-shape"], report.table()
    assert "4 elements" in report.result("batch-shape").detail
    eng = FakeEngine()
    try:
        allowed = observe_fake(eng, script, allow_epoch=True)
    finally:
        eng.close()
    assert allowed.ok, allowed.table()


def test_skipped_seq_without_replay_fails_gaps_healed() -> None:
    script = [(0, payload([AllBlocksCleared()]), True), (1, payload([]), True), (3, payload([]), True)]
    eng = FakeEngine(replay=False)
    try:
        report = observe_fake(eng, script, replay=False)
    finally:
        eng.close()
    assert report.failed() == ["gaps-healed"], report.table()
    assert "no replay endpoint" in report.result("gaps-healed").detail
    assert report.result("describe").status is Status.NOT_OFFERED


def test_replay_that_cannot_fill_the_gap_fails_gaps_healed() -> None:
    script = [(0, payload([AllBlocksCleared()]), True), (1, payload([]), False), (2, payload([]), True)]
    eng = FakeEngine(replay_mode="skip", skip=[1])
    try:
        report = observe_fake(eng, script)
    finally:
        eng.close()
    assert "gaps-healed" in report.failed(), report.table()


def test_replay_without_end_marker_fails_replay_protocol() -> None:
    script = [(0, payload([AllBlocksCleared()]), True), (1, payload([]), False), (2, payload([]), True)]
    eng = FakeEngine(replay_mode="no-end")
    try:
        report = observe_fake(eng, script, reply_timeout=0.4)  # each reply comes at once; only the marker never does
    finally:
        eng.close()
    assert "replay-protocol" in report.failed(), report.table()
    assert "end marker" in report.result("replay-protocol").detail
    assert report.result("gaps-healed").status is Status.PASS  # the batch itself did come


def test_child_before_parent_fails_parents_first() -> None:
    cache = RadixCache(2)
    head = cache.take_events()
    parent = _stored(cache, [1, 2, 3, 4])
    child = _stored(cache, [1, 2, 3, 4, 5, 6])
    assert child[0].parent_block_hash == parent[0].block_hashes[-1]
    script = [(0, payload(head), True), (1, payload(child), True), (2, payload(parent), True)]
    eng = FakeEngine()
    try:
        report = observe_fake(eng, script)
    finally:
        eng.close()
    assert report.failed() == ["parents-first"], report.table()
    assert report.result("hash-recompute").status is Status.PASS  # the parent's chain is right, just late


def test_remove_of_a_block_never_stored_fails_removes_live() -> None:
    cache = RadixCache(2)
    head = cache.take_events()
    stored = _stored(cache, [1, 2, 3, 4])
    script = [(0, payload(head), True), (1, payload(stored), True), (2, payload([BlockRemoved([12345], "GPU")]), True)]
    eng = FakeEngine()
    try:
        report = observe_fake(eng, script)
    finally:
        eng.close()
    assert report.failed() == ["removes-live"], report.table()


def test_reference_to_a_cleared_block_fails_all_cleared() -> None:
    cache = RadixCache(2)
    head = cache.take_events()
    stored = _stored(cache, [1, 2, 3, 4])
    gone = BlockRemoved([stored[0].block_hashes[0]], "GPU")
    script = [
        (0, payload(head), True),
        (1, payload(stored), True),
        (2, payload([AllBlocksCleared()]), True),
        (3, payload([gone]), True),
    ]
    eng = FakeEngine()
    try:
        report = observe_fake(eng, script)
    finally:
        eng.close()
    assert report.failed() == ["all-cleared"], report.table()


def test_window_without_history_is_not_checkable_not_failed() -> None:
    """No replay, first seq > 0: a child of an unseen parent and a remove of an unseen block are unknowable."""
    child = BlockStored([5], 4, [9, 9], 2, None, "GPU", None)
    script = [(7, payload([child]), True), (8, payload([BlockRemoved([3], "GPU")]), True)]
    eng = FakeEngine(replay=False)
    try:
        report = observe_fake(eng, script, replay=False)
    finally:
        eng.close()
    assert report.ok, report.table()
    for rule in ("parents-first", "removes-live", "hash-recompute", "all-cleared"):
        assert report.result(rule).status is Status.NOT_CHECKABLE, report.table()


@pytest.mark.parametrize("bad", [b"\x93\x01\x90\x00", b"\xc1", b"\x92\xcb" + b"\0" * 8 + b"\x90"])
def test_malformed_batches_fail_batch_shape(bad: bytes) -> None:
    eng = FakeEngine(replay=False)
    try:
        report = observe_fake(eng, [(0, bad, True)], replay=False)
    finally:
        eng.close()
    assert report.failed() == ["batch-shape"], report.table()


def _vllm_payloads(algo: str, n: int = 150) -> list[bytes]:
    from kvevents.sim.vllm import VllmSimWorker
    from kvevents.sim.worker import Workload

    sim = VllmSimWorker("v", block_size=4, capacity_blocks=60, hash_algo=algo)
    out = []
    for req in Workload(2, page_size=4, user_tokens=(4, 30), answer_tokens=(4, 30), system_prompt_pages=(1, 4)).take(n):
        sim.serve_request(req)  # LoRA adapters and salts included
        p = sim.take_payload(1.0)
        if p:
            out.append(p)
    return out


def test_live_vllm_stream_passes_under_its_profile() -> None:
    payloads = _vllm_payloads("sha256")
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0)
    try:
        opts = StreamOptions(
            pub.endpoint, pub.replay_endpoint, 4, profile="vllm-sha256", lora_path="/adapters/{name}", reply_timeout=1.0
        )
        with StreamObserver(opts) as obs:
            for i, p in enumerate(payloads):
                pub.publish_payload(p)
                if i % 8 == 0:
                    obs.pump(0.005)
            deadline = time.monotonic() + 5.0
            while obs.checker.expected != pub.stats()["next_seq"] and time.monotonic() < deadline:
                obs.pump(0.02)
            report = obs.finish(quiet=0.05)
    finally:
        pub.close(0)
    assert report.ok, report.table()
    for rule in ("hash-recompute", "parents-first", "removes-live", "batch-shape", "snapshot"):
        assert report.result(rule).status is Status.PASS, report.table()


def test_vllm_stream_under_the_wrong_profile_or_without_the_lora_path() -> None:
    """Pure state machine (no sockets): the same frames judged three ways."""
    from kvevents.conformance.profiles import get_profile
    from kvevents.conformance.rules import StreamChecker
    from kvevents.zeromq.wire import pack_seq

    frames = [[b"", pack_seq(i), p] for i, p in enumerate(_vllm_payloads("sha256_cbor", 60))]

    def judge(profile: str, lora_path: str | None) -> object:
        checker = StreamChecker(get_profile(profile, lora_path=lora_path), 4)
        for f in frames:
            checker.on_live(f)
        return checker.report()

    assert judge("vllm-sha256_cbor", "/adapters/{name}").ok
    assert judge("vllm-sha256", "/adapters/{name}").failed() == ["hash-recompute"]
    assert "hash-recompute" in judge("contract", None).failed()
    no_path = judge("vllm-sha256_cbor", None).result("hash-recompute")
    assert no_path.status is Status.PASS and "not checkable" in no_path.detail  # LoRA blocks: path unknown


def test_missing_vllm_module_is_profile_not_available(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from kvevents.conformance.profiles import ProfileUnavailable, get_profile

    monkeypatch.setitem(sys.modules, "kvevents.engines.vllm", None)  # as if not installed
    with pytest.raises(ProfileUnavailable, match="profile vllm-sha256 not available"):
        get_profile("vllm-sha256")
    with pytest.raises(ValueError, match="unknown profile"):
        get_profile("sglang-9")


def test_vllm_raw_digest_hashes_recompute() -> None:
    """VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: hashes travel as the raw digests (bytes), parents too."""
    from kvevents.conformance.profiles import get_profile
    from kvevents.conformance.rules import StreamChecker
    from kvevents.engines.vllm import vllm_block_hashes
    from kvevents.engines.vllm_wire import encode_vllm_batch, stored_event
    from kvevents.zeromq.wire import pack_seq

    toks = list(range(16))
    ds = vllm_block_hashes(toks, 4)
    checker = StreamChecker(get_profile("vllm-sha256"), 4)
    checker.on_live([b"", pack_seq(0), encode_vllm_batch(1.0, [stored_event(ds[:2], None, toks[:8], 4)], 0)])
    checker.on_live([b"", pack_seq(1), encode_vllm_batch(1.0, [stored_event(ds[2:], ds[1], toks[8:], 4)], 0)])
    report = checker.report()
    assert report.ok and report.result("hash-recompute").checked == 2, report.table()
    assert report.result("parents-first").status is Status.PASS
