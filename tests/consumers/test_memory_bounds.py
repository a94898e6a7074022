"""What a publisher (or a request) can cost the block index and the router is bounded: media, dp
ranks, adapters, per-request strings (the subscriber's own bound: tests/zeromq/test_subscriber_bounds.py)."""

from __future__ import annotations

import pytest

from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.router import PrefixRouter, _cached_seed
from kvevents.events import BlockStored, KVEventBatch


def _store(h: int, medium: str | None = "GPU", lora: str | None = None) -> BlockStored:
    return BlockStored([h], None, [1, 2], 2, None, medium, lora)


def test_distinct_media_are_bounded_past_the_known_tiers():
    idx = BlockIndex(max_other_media=4)
    for m in ("GPU", "CPU", "CPU_PINNED", "DISK", "STORAGE", None):
        idx.apply("w", KVEventBatch(0.0, [_store(1, m)], 0))
    before = idx.stats()["table_bytes"]
    for i in range(500):
        idx.apply("w", KVEventBatch(0.0, [_store(100 + i, f"m{i}")], 0))
    assert idx.counters["dropped_medium"] == 496  # 4 others admitted
    assert idx.stats()["table_bytes"] < 4 * before + 1_000_000
    assert len(idx.medium_counts()) == 6 + 4


def test_distinct_ranks_of_one_source_are_bounded():
    idx = BlockIndex(max_ranks_per_source=8)
    for r in range(2000):
        idx.apply("w", KVEventBatch(0.0, [_store(r)], r))
    assert idx.counters["dropped_rank"] == 1992 and len(idx.workers()) == 8
    idx.apply("other", KVEventBatch(0.0, [_store(1)], 0))  # another source has its own budget
    assert len(idx.workers()) == 9
    idx.drop_source("w", forget=True)
    idx.apply("w", KVEventBatch(0.0, [_store(5)], 1999))  # forgotten ranks free the budget
    assert idx.counters["dropped_rank"] == 1992 and len(idx.workers()) == 2


def test_distinct_adapters_are_bounded():
    idx = BlockIndex(max_adapters=16)
    for i in range(300):
        idx.apply("w", KVEventBatch(0.0, [_store(i, "GPU", f"lora-{i}")], 0))
    assert idx.counters["dropped_adapter"] == 300 - 16


def test_long_request_strings_are_never_kept():
    idx = BlockIndex()
    r = PrefixRouter(idx, 2)
    idx.apply("w", KVEventBatch(0.0, [_store(r.request_hashes([1, 2])[0], "GPU", "a")], 0))
    _cached_seed.cache_clear()
    for i in range(100):
        r.score([1, 2, 3, 4], cache_salt=f"{i}" + "s" * 1_000_000, lora_name=f"{i}" + "l" * 1_000_000)
    assert _cached_seed.cache_info().currsize == 0  # 1 MB salts hashed per request, not cached
    for i in range(1000):
        r.score([1, 2], lora_name=f"n{i}")
    assert r.score([1, 2], lora_name="a")[0].matched_pages == 1  # still right after the plan cache started over


def test_bounds_are_validated():
    with pytest.raises(ValueError, match="max_ranks_per_source"):
        BlockIndex(max_ranks_per_source=-1)
