"""SourceKeyer: vLLM streams indexed by token-derived keys score exactly like contract streams of the same cache."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.keying import SourceKeyer, mix_extra_keys, parse_key_mode, request_keys
from kvevents.consumers.router import PrefixRouter
from kvevents.engines.vllm_wire import encode_vllm_batch, removed_event, stored_event
from kvevents.events import BlockRemoved, BlockStored, KVEventBatch, encode_batch
from kvevents.hashing import Namespace, event_hashes_int64
from kvevents.sim.vllm import VllmSimWorker
from kvevents.sim.worker import SimWorker, Workload

PS = 4


def contract_twin(sims: list[VllmSimWorker], lora_seen: set[str] = frozenset()) -> BlockIndex:
    """An index fed the contract stream of the sims' cache state: one store per cached block,
    its key computed from the block's whole token prefix by the contract (not by the keyer's chain).
    A worker in `lora_seen` once published a lora_name (the index then reads it lora-strictly)."""
    idx = BlockIndex()
    for s in sims:
        if s.name in lora_seen:
            idx.apply(
                s.name,
                KVEventBatch(
                    0.0,
                    [BlockStored([7], None, [0] * PS, PS, None, "GPU", "x"), BlockRemoved([7], "GPU", lora_name="x")],
                    0,
                ),
            )
        evs = []
        for cb in s.cached_blocks():
            h = event_hashes_int64(cb.prefix, PS, Namespace(cache_salt=cb.cache_salt))[-1]
            evs.append(BlockStored([h], None, cb.prefix[-PS:], PS, None, "GPU", cb.lora_name))
        idx.apply(s.name, KVEventBatch(0.0, evs, 0))
    return idx


def ranked(router: PrefixRouter, tokens, salt, lora):
    return sorted((s.worker, s.matched_pages, round(s.score, 9)) for s in router.score(tokens, salt, lora))


def feed(keyer: SourceKeyer, idx: BlockIndex, sim: VllmSimWorker) -> None:
    payload = sim.take_payload(1.0)
    if payload is not None:
        keyer.apply(idx, sim.name, None, payload)


@settings(max_examples=60)
@given(
    seed=st.integers(0, 10_000),
    capacities=st.lists(st.integers(6, 60), min_size=1, max_size=3),
    algo=st.sampled_from(["sha256", "sha256_cbor"]),
    n=st.integers(10, 120),
    reset_at=st.integers(0, 200),
)
def test_tokens_mode_scores_equal_contract_stream_scores(seed, capacities, algo, n, reset_at):
    sims = [
        VllmSimWorker(
            f"v{i}", block_size=PS, capacity_blocks=c, hash_algo=algo, sliding_window_blocks=2 if i == 1 else None
        )
        for i, c in enumerate(capacities)
    ]
    keyer, idx = SourceKeyer(PS, default_mode="tokens"), BlockIndex()
    reqs = Workload(
        seed,
        page_size=PS,
        num_system_prompts=3,
        system_prompt_pages=(1, 4),
        user_tokens=(0, 9),
        answer_tokens=(0, 9),
        vocab_size=4,
    ).take(n)
    lora_seen = set()
    for i, r in enumerate(reqs):
        sim = sims[i % len(sims)]
        if i == reset_at:
            sim.reset()
        sim.serve_request(r)
        if r.lora_name is not None:
            lora_seen.add(sim.name)
        feed(keyer, idx, sim)
    twin = contract_twin(sims, lora_seen)
    assert idx.copies() == twin.copies()
    ra, rb = PrefixRouter(idx, PS, seed=0), PrefixRouter(twin, PS, seed=0)
    for r in reqs:
        for lora in {r.lora_name, None}:
            assert ranked(ra, r.tokens, r.namespace.cache_salt, lora) == ranked(
                rb, r.tokens, r.namespace.cache_salt, lora
            )
    for s in sims:
        assert keyer.stats()[s.name]["mapped_blocks"] == len(s.cached_blocks())


def test_everything_removed_returns_the_map_to_baseline():
    sim = VllmSimWorker("v", block_size=PS, capacity_blocks=30)
    keyer, idx = SourceKeyer(PS, default_mode="tokens"), BlockIndex()
    reqs = Workload(3, page_size=PS, vocab_size=6, system_prompt_pages=(1, 3), user_tokens=(0, 8)).take(200)
    gc.collect()
    tracemalloc.start()
    for r in reqs:
        sim.serve_request(r)
        feed(keyer, idx, sim)
    assert keyer.mapped_blocks("v") == 30 and keyer.interned_digests() > 0
    big = VllmSimWorker("v", block_size=PS, capacity_blocks=30)  # the same worker evicting everything:
    for i in range(40):  # fresh tokens push every cached block out, one removal per hash
        sim.serve([1000 + i] * PS * 1 + [i])
        feed(keyer, idx, sim)
    del big
    sim.reset()
    feed(keyer, idx, sim)
    assert keyer.mapped_blocks() == 0 and keyer.interned_digests() == 0 and len(idx) == 0
    for r in reqs[:50]:  # and again, then removed through removes only
        sim.serve_request(r)
        feed(keyer, idx, sim)
    for i in range(40):
        sim.serve([5000 + i] * PS)
        feed(keyer, idx, sim)
    keyer.reset("v")
    idx.drop_source("v")
    gc.collect()
    snap = tracemalloc.take_snapshot()
    tracemalloc.stop()
    assert keyer.mapped_blocks() == 0 and keyer.interned_digests() == 0
    # what the keyer's own code allocated (map entries, digests, decoded engine hashes) is all gone;
    # the index's numpy tables and the simulator keep their own memory, so they are left out
    mine = snap.filter_traces(
        [tracemalloc.Filter(True, f"*{name}") for name in ("consumers/keying.py", "kvevents/engines/vllm_wire.py")]
    )
    left = sum(st.size for st in mine.statistics("filename"))
    assert left < 4096, mine.statistics("lineno")[:5]


def store(hashes, parent, tokens, **kw):
    return stored_event(hashes, parent, tokens, PS, **kw)


def run(keyer: SourceKeyer, idx: BlockIndex, *events, rank=0):
    keyer.apply(idx, "v", None, encode_vllm_batch(1.0, list(events), rank))
    return keyer.stats()["v"]


def keys(tokens, salt=None):
    return event_hashes_int64(tokens, PS, Namespace(cache_salt=salt))


def test_parents_duplicates_removes_and_lora_through_the_map():
    keyer, idx = SourceKeyer(PS, default_mode="tokens"), BlockIndex()
    toks = list(range(12))
    run(keyer, idx, store([11, 12], None, toks[:8], lora_name="lora-a", extra_keys=[["lora-a", "tenant"], ["lora-a"]]))
    run(keyer, idx, store([13], 12, toks[8:], lora_name="lora-a", extra_keys=[["lora-a"]]))
    want = keys(toks, "tenant")
    assert idx.copies() == {k: 1 for k in want}
    assert PrefixRouter(idx, PS).score(toks, "tenant", "lora-a")[0].matched_pages == 3
    assert PrefixRouter(idx, PS).score(toks, None, "lora-a")[0].matched_pages == 0  # salt seeds the chain
    run(keyer, idx, store([13], 12, toks[8:], lora_name="lora-a", extra_keys=[["lora-a"]]))  # a duplicate copy
    assert idx.copies()[want[2]] == 2
    s = run(keyer, idx, removed_event([13], group_idx=0))
    assert idx.copies()[want[2]] == 1 and s["mapped_blocks"] == 3
    s = run(keyer, idx, removed_event([13]), removed_event([12]), removed_event([11]))
    assert len(idx) == 0 and s["mapped_blocks"] == 0 and keyer.interned_digests() == 0
    assert idx.counters["ambiguous_remove"] == 0 and idx.counters["unknown_remove"] == 0
    s = run(keyer, idx, removed_event([11]))
    assert s["unknown_remove"] == 1


def test_uint64_and_bytes_hashes_and_ranks_have_their_own_maps():
    keyer, idx = SourceKeyer(PS, default_mode="tokens"), BlockIndex()
    run(keyer, idx, store([b"\x01" * 32], None, [1, 2, 3, 4]))
    run(keyer, idx, store([b"\x02" * 32], b"\x01" * 32, [5, 6, 7, 8]))
    run(keyer, idx, store([2**64 - 1], None, [1, 2, 3, 4]), rank=1)
    run(keyer, idx, store([7], 2**64 - 1, [5, 6, 7, 8]), rank=1)
    assert sorted(idx.workers()) == ["v", "v#dp1"]
    assert all(n == 2 for n in idx.copies().values()) and len(idx.copies()) == 2
    run(keyer, idx, {"type": "AllBlocksCleared"}, rank=1)
    assert keyer.mapped_blocks() == 2 and len(idx.copies()) == 2
    keyer.reset("v", 0)
    assert keyer.mapped_blocks() == 0


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (store([1, 2], None, [1, 2, 3, 4]), "token_count_mismatch"),  # 4 tokens for 2 blocks
        (store([1], None, list(range(12))), "token_count_mismatch"),  # a span over skipped null blocks
        (store([1], 999, [1, 2, 3, 4]), "unknown_parent"),
        (store([[1]], None, [1, 2, 3, 4]), "bad_hash"),  # a list: unhashable
        (store([1.5], None, [1, 2, 3, 4]), "bad_hash"),
        (store([True], None, [1, 2, 3, 4]), "bad_hash"),
        (store(["abc"], None, [1, 2, 3, 4]), "bad_hash"),
        (store([1], None, [1, 2, 3, 4], extra_keys=[["a", "b"]]), "bad_extra_keys"),  # two salts?
        (store([1], None, [1, 2, 3, 4], extra_keys=[[1], [2]]), "bad_extra_keys"),
        (stored_event([1], None, list(range(8)), 8), "block_size_mismatch"),
        (store([1], None, [1, 2, -3, 4]), "bad_tokens"),
    ],
)
def test_bad_input_is_counted_never_indexed(event, reason):
    keyer, idx = SourceKeyer(PS, default_mode="tokens"), BlockIndex()
    s = run(keyer, idx, event)
    assert s[reason] == 1 and len(idx) == 0
    s = run(keyer, idx, store([50], 1, [9, 9, 9, 9]))  # a child of an unkeyed block is not keyed either
    assert len(idx) == 0 and (s.get("unkeyed_parent", 0) + s.get("unknown_parent", 0)) >= 1
    run(keyer, idx, removed_event([50]), removed_event([1]), removed_event([2]))
    assert keyer.mapped_blocks() == 0


def test_a_known_hash_stored_again_unkeyed_is_the_same_block():
    keyer, idx = SourceKeyer(PS, default_mode="tokens"), BlockIndex()
    run(keyer, idx, store([1], None, [1, 2, 3, 4]))
    s = run(keyer, idx, store([1], 77, [1, 2, 3, 4]))  # unknown parent, but hash 1 is known: same block
    assert s["unknown_parent"] == 1 and idx.copies()[keys([1, 2, 3, 4])[0]] == 2
    run(keyer, idx, removed_event([1]), removed_event([1]))
    assert len(idx) == 0 and keyer.mapped_blocks() == 0


def test_multimodal_and_embeds_keys_never_match_text_only_but_match_with_page_extras():
    keyer, idx = SourceKeyer(PS, default_mode="tokens"), BlockIndex()
    toks = list(range(12))
    extras = [None, [["img-1", 0]], [b"\x05" * 32]]
    run(keyer, idx, store([1, 2, 3], None, toks, extra_keys=extras))
    router = PrefixRouter(idx, PS)
    assert router.score(toks)[0].matched_pages == 1  # text-only: the plain first page, then no match
    hs = request_keys(toks, PS, None, [None, [("img-1", 0)], [b"\x05" * 32]])
    assert router.score_hashes(hs)[0].matched_pages == 3
    assert router.score(toks, page_extra_keys=[None, [("img-1", 0)], [b"\x05" * 32]])[0].matched_pages == 3
    assert router.score_hashes(request_keys(toks, PS, None, [None, [("img-2", 0)], None]))[0].matched_pages == 1
    assert list(request_keys(toks, PS)) == keys(toks)
    assert mix_extra_keys(b"\x00" * 32, []) == b"\x00" * 32
    assert keyer.stats()["v"]["mixed_blocks"] == 2


def test_other_kv_cache_groups_are_skipped_and_can_be_followed():
    sim = VllmSimWorker("v", block_size=PS, capacity_blocks=20, sliding_window_blocks=1)
    k0, k1, i0, i1 = (
        SourceKeyer(PS, default_mode="tokens"),
        SourceKeyer(PS, default_mode="tokens", group_idx=1),
        BlockIndex(),
        BlockIndex(),
    )
    sim.serve(list(range(16)))
    payload = sim.take_payload()
    k0.apply(i0, "v", None, payload)
    k1.apply(i1, "v", None, payload)
    assert k0.stats()["v"]["other_group_events"] == 1 and len(i0) == 4
    assert k1.stats()["v"]["token_count_mismatch"] == 1 and len(i1) == 0  # span over null blocks: never guessed


def test_auto_detects_contract_and_vllm_sources_and_counts_the_mode():
    keyer, idx = SourceKeyer(PS), BlockIndex()
    w = SimWorker("c", page_size=PS, capacity_pages=4096)
    v = VllmSimWorker("v", block_size=PS, capacity_blocks=4096)
    assert keyer.mode("c") == "auto"
    for r in Workload(0, page_size=PS, vocab_size=8).take(30):
        w.serve(r)
        b = KVEventBatch(1.0, w.take_events(), 0)
        keyer.apply(idx, "c", b, encode_batch(b))
        v.serve_request(r)
        feed(keyer, idx, v)
    stats = keyer.stats()
    assert stats["c"]["mode"] == "contract" and stats["c"]["auto_detected_contract"] == 1
    assert stats["v"]["mode"] == "tokens" and stats["v"]["auto_detected_tokens"] == 1
    assert stats["c"]["mapped_blocks"] == 0  # contract sources cost nothing extra
    r = Workload(0, page_size=PS, vocab_size=8).take(1)[0]
    got = {
        s.worker: s.matched_pages for s in PrefixRouter(idx, PS).score(r.tokens, r.namespace.cache_salt, r.lora_name)
    }
    assert got["c"] == got["v"] > 0


def test_auto_waits_for_a_head_then_replays_what_it_held_and_falls_back_to_tokens():
    keyer, idx = SourceKeyer(PS, auto_max_batches=3), BlockIndex()
    run(keyer, idx, removed_event([5]))
    assert keyer.mode("v") == "auto" and len(idx) == 0
    run(keyer, idx, store([1], None, [1, 2, 3, 4]))
    assert keyer.mode("v") == "tokens" and len(idx) == 1
    keyer.set_mode("x", "auto")
    for _ in range(3):
        keyer.apply(idx, "x", None, encode_vllm_batch(1.0, [removed_event([5])], 0))
    assert keyer.mode("x") == "tokens" and keyer.stats()["x"]["auto_undecided"] == 1


def test_modes_parse_and_validate():
    assert parse_key_mode("w0=tokens") == ("w0", "tokens")
    for bad in ("w0", "=tokens", "w0=fast"):
        with pytest.raises(ValueError):
            parse_key_mode(bad)
    with pytest.raises(ValueError):
        SourceKeyer(0)
    with pytest.raises(ValueError):
        SourceKeyer(4, default_mode="x")
    keyer = SourceKeyer(4, modes={"a": "contract"})
    assert keyer.mode("a") == "contract" and keyer.mode("b") == "auto"
    assert keyer.translate("a", None, b"\xc1") == [] and keyer.stats()["a"]["undecodable"] == 1


def test_an_engine_hash_reused_for_other_tokens_is_a_counted_conflict_never_a_wrong_key():
    keyer, idx = SourceKeyer(PS, default_mode="tokens"), BlockIndex()
    run(keyer, idx, store([1, 2], None, list(range(8))))
    s = run(keyer, idx, store([3, 2], None, [9] * 8))  # hash 2 now claims other tokens: only 3 is indexed
    assert s["hash_conflict"] == 1
    assert set(idx.copies()) == set(keys(list(range(8)))) | {keys([9] * 4)[0]}
    run(keyer, idx, store([1, 2], None, list(range(8))))  # the same block again: a duplicate copy
    assert idx.copies()[keys(list(range(8)))[1]] == 2


def test_a_reset_drops_what_auto_still_holds_for_that_rank():
    keyer, idx = SourceKeyer(PS), BlockIndex()
    run(keyer, idx, removed_event([5]), rank=0)
    run(keyer, idx, removed_event([6]), rank=1)
    keyer.reset("v", 0)
    assert keyer.stats()["v"]["auto_dropped_on_reset"] == 1
    run(keyer, idx, store([1], None, [1, 2, 3, 4]), rank=1)
    assert keyer.mode("v") == "tokens" and keyer.stats()["v"]["unknown_remove"] == 1  # rank 1's held remove replayed
