"""The simulated engine: deterministic workloads, serving with hits, content checks, restarts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from kvevents.cache import FileStore, MemoryStore, RadixCache
from kvevents.events import AllBlocksCleared, KVEventBatch, encode_batch
from kvevents.hashing import Namespace, storage_hashes
from kvevents.sim.worker import Request, SimWorker, Workload, expected_content, page_content


def test_workload_is_deterministic_per_seed() -> None:
    a, b = Workload(7).take(300), Workload(7).take(300)
    assert a == b
    assert Workload(7).take(50) == a[:50]  # take(n) is always the first n
    assert Workload(8).take(50) != a[:50]
    it = iter(Workload(7))
    assert [next(it) for _ in range(5)] == a[:5]


def test_workload_is_multi_tenant() -> None:
    w = Workload(1, page_size=16)
    reqs = w.take(600)
    assert all(isinstance(r, Request) and r.tokens for r in reqs)
    assert {r.namespace.cache_salt for r in reqs} == set(w.salts)
    keys = {r.namespace.extra_key for r in reqs}
    assert None in keys and set(w.adapters) <= keys
    assert all(r.lora_name == r.namespace.extra_key for r in reqs)  # the adapter name is the extra key
    # multi-turn: a later request of a session extends its earlier prompt
    by_session: dict[str, list[Request]] = {}
    for r in reqs:
        by_session.setdefault(r.session_id or "", []).append(r)
    turns = [rs for rs in by_session.values() if len(rs) > 1]
    assert turns
    for rs in turns:
        for prev, nxt in zip(rs, rs[1:]):
            assert nxt.tokens[: len(prev.tokens)] == prev.tokens and len(nxt.tokens) > len(prev.tokens)
            assert nxt.namespace == prev.namespace
    # shared system prompts with Zipf-like popularity: the top prefix is far more common than most
    heads = Counter(tuple(r.tokens[:32]) for rs in by_session.values() for r in rs[:1])
    counts = sorted(heads.values(), reverse=True)
    assert counts[0] >= 4 * counts[len(counts) // 2]


def test_workload_rejects_bad_options() -> None:
    with pytest.raises(ValueError):
        Workload(page_size=0)
    with pytest.raises(ValueError):
        Workload(salts=())
    with pytest.raises(ValueError):
        Workload().take(-1)


def run(seed: int, n: int, **kw) -> tuple[list, list, dict]:
    worker = SimWorker("w0", page_size=16, capacity_pages=512, **kw)
    results = []
    batches = []
    for i, req in enumerate(Workload(seed).take(n)):
        results.append(worker.serve(req))
        if i % 10 == 9:
            batches.append(encode_batch(KVEventBatch(0.0, worker.take_events())))
    return results, batches, worker.stats()


def test_sim_worker_is_deterministic() -> None:
    r1, b1, s1 = run(3, 200)
    r2, b2, s2 = run(3, 200)
    assert r1 == r2 and b1 == b2 and s1 == s2
    assert s1["content_errors"] == 0 and all(r.content_ok for r in r1)
    assert s1["device_hit_tokens"] > 0 and s1["storage_hit_tokens"] > 0
    assert s1["device_pages"] <= 512


def test_serve_reports_device_then_storage_hits() -> None:
    worker = SimWorker("w", page_size=4, capacity_pages=100)
    req = Request(list(range(40)), Namespace("a", "t"), "a", "s1")
    r1 = worker.serve(req)
    assert (r1.num_tokens, r1.device_hit_tokens, r1.storage_hit_tokens, r1.content_ok) == (40, 0, 0, True)
    evs = worker.take_events()
    assert isinstance(evs[0], AllBlocksCleared) and evs[1].session_id == "s1" and evs[1].lora_name == "a"
    assert worker.serve(req).device_hit_tokens == 40
    worker.cache.match_prefix(req.tokens[:20], req.namespace)  # split the node after 5 pages
    assert worker.cache.evict(5) == 5  # the tail pages leave the device
    r3 = worker.serve(req)
    assert r3.device_hit_tokens == 20 and r3.storage_hit_tokens == 20 and r3.content_ok


def test_restart_resets_device_but_keeps_storage(tmp_path: Path) -> None:
    worker = SimWorker("w", page_size=4, store=FileStore(tmp_path, fsync=False))
    req = Request(list(range(24)), Namespace(None, "t"))
    worker.serve(req)
    worker.take_events()
    worker.restart()
    assert [type(e) for e in worker.take_events()] == [AllBlocksCleared]
    r = worker.serve(req)
    assert r.device_hit_tokens == 0 and r.storage_hit_tokens == 24 and r.content_ok
    assert worker.restarts == 1


def test_content_depends_on_extra_key_position_and_prefix() -> None:
    toks = list(range(32))
    base = expected_content(toks, Namespace(), 4)
    assert len(base) == 8 and len(set(base)) == 8
    assert expected_content(toks, Namespace("k"), 4) != base
    assert expected_content(toks, Namespace(None, "salt"), 4) == base  # salt: same model, same KV
    other_prefix = expected_content([99] + toks[1:], Namespace(), 4)
    assert all(a != b for a, b in zip(other_prefix, base))  # every page depends on the prefix
    assert expected_content(toks[:5], Namespace(), 4) == base[:1]  # partial pages carry no content


def test_content_served_across_namespaces_is_detected_from_storage() -> None:
    store = MemoryStore()
    worker = SimWorker("w", page_size=4, store=store)
    toks = list(range(16))
    worker.serve(Request(toks, Namespace("a")))
    # a broken store that lets adapter b read adapter a's pages
    for ka, kb in zip(storage_hashes(toks, 4, Namespace("a")), storage_hashes(toks, 4, Namespace("b"))):
        store.put(kb, store.get(ka))  # type: ignore[arg-type]
    r = worker.serve(Request(toks, Namespace("b")))
    assert r.storage_hit_tokens == 16 and not r.content_ok
    assert worker.content_errors == 1


class _NamespaceBlindCache(RadixCache):
    """A regression to detect: the device tree ignores extra_key on lookups."""

    def match_prefix(self, token_ids, namespace=None):  # type: ignore[override]
        salt = namespace.cache_salt if namespace is not None else None
        return super().match_prefix(token_ids, Namespace(None, salt))

    def insert(self, token_ids, namespace=None, **kw):  # type: ignore[override]
        salt = namespace.cache_salt if namespace is not None else None
        if namespace is not None and namespace.extra_key is not None:
            # store content computed under the real namespace, but in the shared tree
            self.page_content = lambda ns, data, ps: page_content(namespace, data, ps)
        try:
            return super().insert(token_ids, Namespace(None, salt), **kw)
        finally:
            self.page_content = page_content


def test_content_served_across_namespaces_is_detected_on_device() -> None:
    worker = SimWorker("w", page_size=4)
    worker.cache = _NamespaceBlindCache(4, page_content=page_content, store=MemoryStore())
    toks = list(range(16))
    assert worker.serve(Request(toks, Namespace("a"))).content_ok
    r = worker.serve(Request(toks, Namespace("b")))
    assert r.device_hit_tokens == 16 and not r.content_ok and worker.content_errors == 1


def test_many_workers_share_a_file_store(tmp_path: Path) -> None:
    store = FileStore(tmp_path, fsync=False)
    w1 = SimWorker("w1", page_size=16, store=store)
    w2 = SimWorker("w2", page_size=16, store=store)
    reqs = Workload(5).take(60)
    for r in reqs:
        w1.serve(r)
    hits = [w2.serve(r) for r in reqs]
    assert sum(h.storage_hit_tokens for h in hits) > 0 and all(h.content_ok for h in hits)
    assert w1.content_errors == w2.content_errors == 0


def test_sim_worker_rejects_bad_name() -> None:
    with pytest.raises(ValueError):
        SimWorker("")


def test_make_worker_and_serve_and_publish_send_a_vllm_workers_own_payload(ctx, pub) -> None:
    """`kvevents serve --engine vllm`'s step: the vLLM worker's 3-element payload goes out as encoded."""
    import msgspec

    from kvevents.sim.worker import make_worker, serve_and_publish
    from kvevents.testing.zeromq import dealer_socket, recv_all

    v = make_worker("vllm", "w0", page_size=4, capacity_pages=64, hash_algo="sha256_cbor", dp_rank=0)
    c = make_worker("contract", "w1", page_size=4, capacity_pages=64)
    reqs = Workload(1, page_size=4).take(2)
    assert serve_and_publish(v, reqs[0], pub) == 0
    assert serve_and_publish(c, reqs[1], pub) == 1
    d = dealer_socket(ctx, pub.replay_endpoint)
    d.send_multipart([b"", (0).to_bytes(8, "big")])
    msgs = recv_all(d)
    d.close()
    first = msgspec.msgpack.decode(msgs[0][-1])
    assert len(first) == 3 and first[2] == 0
    assert first[1][0]["group_idx"] == 0 and first[1][0]["block_hashes"][0] >= 0  # vLLM's uint64 form
    with pytest.raises(ValueError):
        make_worker("tgi", "x")
