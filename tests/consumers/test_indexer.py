"""BlockIndex: reference counts per (source, dp_rank, medium, hash), clears, drops, ground truth."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvevents.consumers.indexer import BlockIndex
from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from kvevents.hashing import Namespace, event_hashes, to_int64
from kvevents.sim.worker import Request, SimWorker, Workload


def batch(*events, rank=None) -> KVEventBatch:
    return KVEventBatch(0.0, list(events), rank)


def stored(hashes, parent=None, medium="GPU", lora=None) -> BlockStored:
    return BlockStored(list(hashes), parent, [0] * (2 * len(hashes)), 2, None, medium, lora)


def test_two_copies_under_two_extra_keys_survive_one_removal():
    """The same tokens cached under two extra keys publish the same hashes twice (the contract, "What the reference cache emits")."""
    toks = list(range(64))
    w = SimWorker("w0", page_size=16, capacity_pages=None)
    w.serve(Request(toks, Namespace("adapter-1")))
    w.serve(Request(toks, Namespace("adapter-2")))
    idx = BlockIndex()
    idx.apply("w0", batch(*w.take_events()))
    hs = [to_int64(h) for h in event_hashes(toks, 16, Namespace())]
    assert idx.copies("w0") == Counter({h: 2 for h in hs}) == w.cache.published_copies()
    idx.apply("w0", batch(BlockRemoved(hs, "GPU")))
    assert idx.copies("w0") == Counter(hs)
    assert all(idx.workers_for(h) == {"w0"} for h in hs)
    idx.apply("w0", batch(BlockRemoved(hs, "GPU")))
    assert idx.copies("w0") == Counter() and not idx.workers_for(hs[0])
    assert idx.counters["unknown_remove"] == 0


def test_duplicate_copies_same_lora_and_different_lora():
    idx = BlockIndex()
    idx.apply("a", batch(stored([1, 2], lora="x"), stored([1, 2], lora="x"), stored([1, 2], lora="y")))
    assert idx.copies("a") == Counter({1: 3, 2: 3})
    idx.apply("a", batch(BlockRemoved([1, 2], "GPU"), BlockRemoved([1, 2], "GPU")))
    assert idx.copies("a") == Counter({1: 1, 2: 1})
    assert idx.counters["ambiguous_remove"] >= 2  # a remove does not say which adapter's copy went
    assert idx.block_counts() == {"a": {"GPU": 2}}


def test_all_blocks_cleared_clears_every_medium_of_that_source_only():
    idx = BlockIndex()
    idx.apply("a", batch(stored([1, 2]), stored([3], medium="CPU_PINNED"), stored([4], medium="STORAGE", lora="l")))
    idx.apply("b", batch(stored([1, 2])))
    idx.apply("a", batch(stored([5]), rank=1))
    assert idx.medium_counts() == {"GPU": 5, "CPU_PINNED": 1, "STORAGE": 1}
    idx.apply("a", batch(AllBlocksCleared()))
    assert idx.copies("a", dp_rank=0) == Counter()
    assert idx.copies("a", dp_rank=1) == Counter({5: 1})  # another dp rank: another engine
    assert idx.copies("b") == Counter({1: 1, 2: 1})
    assert idx.workers_for(1) == {"b"} and idx.workers_for(5) == {"a#dp1"}
    assert idx.parent_of(2) == 1 and idx.parent_of(4) is None
    assert idx.medium_counts() == {"GPU": 3}


def test_drop_source_all_ranks_and_forget():
    idx = BlockIndex()
    idx.apply("a", batch(stored([1])))
    idx.apply("a", batch(stored([2]), rank=3))
    idx.apply("b", batch(stored([1])))
    assert idx.drop_source("a") == 2
    assert idx.workers_for(1) == {"b"} and not idx.has(2)
    assert set(idx.workers()) == {"a", "a#dp3", "b"}
    idx.drop_source("a", forget=True)
    assert idx.workers() == ["b"]
    idx.apply("c", batch(stored([7])))  # reuses the freed slot
    assert idx.workers_for(7) == {"c"} and idx.workers_for(1) == {"b"}


def test_unknown_removes_and_parents_are_counted_never_raised():
    idx = BlockIndex()
    idx.apply("a", batch(BlockRemoved([9], "GPU"), BlockRemoved([9], "NVME"), stored([3], parent=2)))
    idx.apply("a", batch(stored([], parent=None), stored([4], parent=3)))
    assert idx.counters["unknown_remove"] == 2
    assert idx.counters["unknown_parent"] == 1  # 4's parent 3 is known
    assert idx.counters["empty_store"] == 1
    assert idx.copies("a") == Counter({3: 1, 4: 1})


def test_workers_for_medium_filter_and_many_workers_restride():
    idx = BlockIndex()
    for i in range(150):  # past the initial 64-worker stride: masks are re-packed
        idx.apply(f"w{i}", batch(stored([i, 1000], medium="GPU" if i % 2 else "CPU_PINNED")))
    assert len(idx.workers_for(1000)) == 150
    assert idx.workers_for(1000, "GPU") == {f"w{i}" for i in range(1, 150, 2)}
    assert idx.workers_for(7, "CPU_PINNED") == set() and idx.workers_for(7, "GPU") == {"w7"}
    assert idx.workers_for(7, "NVME") == set()
    idx.apply("w7", batch(BlockRemoved([1000], "GPU")))
    assert "w7" not in idx.workers_for(1000) and len(idx) == 299


OPS = st.lists(
    st.tuples(
        st.sampled_from(["store", "remove", "clear", "drop"]),
        st.integers(0, 2),  # worker
        st.sampled_from(["GPU", "CPU_PINNED", None]),
        st.sampled_from([None, "l1", "l2"]),
        st.lists(st.integers(-3, 6), min_size=0, max_size=4),
    ),
    max_size=60,
)


@settings(max_examples=150)
@given(OPS, st.sampled_from([BlockIndex._small, 0]))
def test_index_matches_a_plain_reference_model(ops, small):
    """Random stores/removes/clears against a Counter per (worker, medium, hash).

    small=0 sends every event through the vectorised table ops (else only long events use them).
    """
    idx = BlockIndex()
    idx._small = small
    model: Counter = Counter()
    for op, w, medium, lora, hashes in ops:
        src = f"w{w}"
        if op == "store":
            idx.apply(src, batch(stored(hashes, medium=medium, lora=lora)))
            for h in hashes:
                model[(src, medium, h)] += 1
        elif op == "remove":
            idx.apply(src, batch(BlockRemoved(hashes, medium)))
            for h in hashes:
                if model[(src, medium, h)] > 0:
                    model[(src, medium, h)] -= 1
        elif op == "clear":
            idx.apply(src, batch(AllBlocksCleared()))
            for k in [k for k in model if k[0] == src]:
                del model[k]
        else:
            idx.drop_source(src)
            for k in [k for k in model if k[0] == src]:
                del model[k]
    model = +model
    for w in range(3):
        src = f"w{w}"
        for medium in ("GPU", "CPU_PINNED", None):
            want = Counter({h: n for (s, m, h), n in model.items() if s == src and m == medium})
            if medium is not None:
                assert idx.copies(src, medium=medium) == want
        want_all = Counter()
        for (s, _, h), n in model.items():
            if s == src:
                want_all[h] += n
        assert idx.copies(src) == want_all
    for h in range(-3, 7):
        assert idx.workers_for(h) == {s for (s, _, hh) in model if hh == h}
    assert len(idx) == sum(model.values())


@pytest.mark.slow
def test_index_equals_union_of_sim_caches_after_long_lossy_workload():
    """Many steps with restarts; lost batches are healed the way a subscriber would: a replayed
    batch is applied in order, an unrecoverable loss becomes drop_source + a rebuild (snapshot)."""
    rnd = random.Random(7)
    workers = [SimWorker(f"w{i}", page_size=16, capacity_pages=600) for i in range(4)]
    idx = BlockIndex()
    history: dict[str, list[KVEventBatch]] = {w.name: [] for w in workers}
    pending: dict[str, list[KVEventBatch]] = {w.name: [] for w in workers}
    for w in workers:  # the construction-time AllBlocksCleared
        b = batch(*w.take_events())
        history[w.name].append(b)
        idx.apply(w.name, b)
    for step, req in enumerate(Workload(seed=3).take(2500)):
        w = workers[rnd.randrange(len(workers))]
        if step % 400 == 399:
            w.restart()
        w.serve(req)
        b = batch(*w.take_events())
        history[w.name].append(b)
        roll = rnd.random()
        if roll < 0.05:  # lost live, will be replayed before the next one
            pending[w.name].append(b)
            continue
        if roll < 0.07:  # unrecoverable: the consumer resyncs from a snapshot
            idx.drop_source(w.name)
            last_clear = max(
                i for i, hb in enumerate(history[w.name]) if any(type(e) is AllBlocksCleared for e in hb.events)
            )
            for hb in history[w.name][last_clear:]:
                idx.apply(w.name, hb)
            pending[w.name].clear()
            continue
        for pb in pending[w.name]:
            idx.apply(w.name, pb)
        pending[w.name].clear()
        idx.apply(w.name, b)
    for w in workers:
        for pb in pending[w.name]:
            idx.apply(w.name, pb)
        assert idx.copies(w.name) == w.cache.published_copies(), w.name
    total = Counter()
    for w in workers:
        total.update(w.cache.published_copies())
    assert idx.copies() == total
    assert idx.counters["unknown_remove"] == 0
    assert sum(w.restarts for w in workers) >= 5
