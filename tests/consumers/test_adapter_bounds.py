"""Adapter names bound per source and free themselves (issue 28, "Bounds that free themselves").

A BlockIndex keeps one view per lora_name while copies reference it. One rogue publisher using 1,024
names must not stop another publisher's new adapter from being indexed; names must come back when
their copies go (removes, AllBlocksCleared, a dropped source); what a bound refuses is counted
under the source that caused it. Runs on both paths (the C twins and the pure-Python ones).
"""

from __future__ import annotations

from collections import Counter
from contextlib import nullcontext

import numpy as np
import pytest

from kvevents import native
from kvevents.consumers.indexer import BlockIndex
from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

PATHS = ["c", "python"] if native.active() else ["python"]


def _batch(*events) -> KVEventBatch:
    return KVEventBatch(0.0, list(events), 0)


def _store(hashes: list[int], lora: str | None) -> BlockStored:
    return BlockStored(hashes, None, [], 16, None, "GPU", lora)


@pytest.fixture(params=PATHS)
def path(request):
    with native.python_only() if request.param == "python" else nullcontext():
        yield request.param


def test_a_rogue_source_using_1024_names_leaves_a_normal_sources_new_adapter_indexed(path):
    idx = BlockIndex()
    for i in range(1024):
        idx.apply("rogue", _batch(_store([10_000 + i], f"junk-{i}")))
    idx.apply("normal", _batch(_store([1, 2, 3], "real-adapter")))
    assert idx.copies("normal") == Counter({1: 1, 2: 1, 3: 1})
    got = idx.prefix_match(np.array([1, 2, 3], np.int64), "real-adapter")
    assert {idx.keys_by_index()[wi].source: m.pages for wi, m in got.workers.items()} == {"normal": 3}
    assert len(idx.adapters_of("rogue")) == idx.max_adapters_per_source == 256
    assert idx.adapter_drops() == {"rogue": 1024 - 256}  # counted under the source that caused it
    assert idx.counters["dropped_adapter"] == 768 and idx.live_adapters == 257
    loose = idx.prefix_match(np.array([1, 2, 3], np.int64), "real-adapter", strict=False)  # all 258 views
    assert [m.pages for m in loose.workers.values()] == [3]
    idx.apply("normal", _batch(BlockRemoved([1], "GPU")))  # one adapter of many: the remove finds it
    assert idx.copies("normal") == Counter({2: 1, 3: 1}) and idx.counters["unknown_remove"] == 0


def test_names_are_freed_by_removes_clears_and_drops(path):
    idx = BlockIndex()
    for rnd in range(6):  # 6 x 256 names: past the 1,024 of the global bound if none came back
        names = [f"r{rnd}-{i}" for i in range(256)]
        idx.apply("w", _batch(*[_store([rnd * 1000 + i], n) for i, n in enumerate(names)]))
        assert idx.live_adapters == 256 and idx.adapter_drops() == {}
        if rnd % 3 == 0:  # removes naming the adapter
            idx.apply("w", _batch(*[BlockRemoved([rnd * 1000 + i], "GPU", n) for i, n in enumerate(names)]))
        elif rnd % 3 == 1:
            idx.apply("w", _batch(AllBlocksCleared()))
        else:
            idx.drop_source("w")
        assert idx.live_adapters == 0 and len(idx) == 0 and idx.adapters_of("w") == []
    assert idx.counters["dropped_adapter"] == 0


def test_a_name_stays_while_any_copy_references_it(path):
    idx = BlockIndex(max_adapters=2)
    idx.apply("a", _batch(_store([1, 2], "x")))
    idx.apply("b", _batch(_store([1], "x"), _store([7], "y")))
    idx.apply("a", _batch(BlockRemoved([1, 2], "GPU", "x")))
    assert idx.live_adapters == 2  # b still holds 1 under x
    idx.apply("c", _batch(_store([5], "z")))  # global bound: x and y are live
    assert idx.adapter_drops() == {"c": 1}
    idx.apply("b", _batch(BlockRemoved([1], "GPU", "x")))
    idx.apply("c", _batch(_store([5], "z")))  # x is gone: z gets its place
    assert idx.live_adapters == 2 and idx.copies("c") == Counter({5: 1})
    assert idx.prefix_match(np.array([5], np.int64), "z").workers
    assert not idx.prefix_match(np.array([1], np.int64), "x").workers


def test_many_sources_share_the_global_bound_and_each_is_counted(path):
    idx = BlockIndex(max_adapters=8, max_adapters_per_source=3)
    for s in range(4):
        idx.apply(f"s{s}", _batch(*[_store([s * 10 + i], f"s{s}-{i}") for i in range(4)]))
    assert idx.live_adapters == 8  # s0, s1: 3 each; s2: 2 (the global bound); s3: none
    assert idx.adapter_drops() == {"s0": 1, "s1": 1, "s2": 2, "s3": 4}
    idx.apply("s0", _batch(AllBlocksCleared()))
    idx.apply("s3", _batch(_store([99], "s3-new")))
    assert idx.adapters_of("s3") == ["s3-new"] and idx.live_adapters == 6
