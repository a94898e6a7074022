"""Invalid input is a ValueError with a clear message, and the cache is unchanged after it."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from kvevents.cache import MemoryStore, RadixCache
from kvevents.hashing import Namespace


@pytest.mark.parametrize("page_size", [0, -1, 1.5, "4", None, True])
def test_bad_page_size(page_size: Any) -> None:
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(page_size)


@pytest.mark.parametrize("kwargs", [{"capacity_pages": -1}, {"capacity_pages": 2.5}, {"on_events": 3}, {"medium": 5}])
def test_bad_constructor_options(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        RadixCache(4, **kwargs)


def populated() -> tuple[RadixCache, Any]:
    cache = RadixCache(2, store=MemoryStore())
    cache.insert([1, 2, 3, 4, 5, 6], Namespace("k", "s"))
    cache.insert([1, 2, 9, 9])
    cache.take_events()
    cache.insert([1, 2, 3, 4, 7, 7], Namespace("k", "s"))  # one event still queued
    m = cache.match_prefix([1, 2, 3, 4], Namespace("k", "s"))
    return cache, m


BAD_CALLS: dict[str, Callable[[RadixCache, Any], Any]] = {
    "insert negative id": lambda c, m: c.insert([1, 2, -1, 4]),
    "insert id 2**32": lambda c, m: c.insert([1, 2, 3, 2**32]),
    "insert id in the partial tail": lambda c, m: c.insert([1, 2, 3, 4, 5, -7]),
    "insert float id": lambda c, m: c.insert([1, 2, 3.5, 4]),
    "insert str ids": lambda c, m: c.insert("abcd"),
    "insert None id": lambda c, m: c.insert([1, None]),
    "insert bad namespace": lambda c, m: c.insert([1, 2], ("k", "s")),
    "insert bad lora_name": lambda c, m: c.insert([1, 2], lora_name=3),
    "insert bad session_id": lambda c, m: c.insert([1, 2], session_id=b"x"),
    "match negative id": lambda c, m: c.match_prefix([1, 2, -3, 4]),
    "match huge id": lambda c, m: c.match_prefix([2**40, 2]),
    "match bad namespace": lambda c, m: c.match_prefix([1, 2], "k"),
    "evict negative": lambda c, m: c.evict(-1),
    "evict float": lambda c, m: c.evict(1.0),
    "evict bool": lambda c, m: c.evict(True),
    "lock not a match": lambda c, m: c.lock("m"),
    "unlock unlocked match": lambda c, m: c.unlock(m),
    "storage_hit_length bad prior": lambda c, m: c.storage_hit_length([1, 2], Namespace(), prior="zz"),
    "storage_hit_length bad id": lambda c, m: c.storage_hit_length([-1, 2], Namespace()),
    "prefetch bad namespace": lambda c, m: c.prefetch([1, 2], 7),
    "offload bad contents": lambda c, m: c.offload([1, 2, 3, 4], Namespace(), contents=[b"x"]),
}


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bad_input_leaves_cache_unchanged(name: str) -> None:
    cache, m = populated()
    before = cache.debug_dump()
    store_before = cache.store.keys()  # type: ignore[union-attr]
    with pytest.raises(ValueError) as err:
        BAD_CALLS[name](cache, m)
    assert str(err.value)  # a message that says what was wrong
    assert cache.debug_dump() == before
    assert cache.store.keys() == store_before  # type: ignore[union-attr]


def test_error_messages_name_the_problem() -> None:
    cache, m = populated()
    with pytest.raises(ValueError, match=r"-1 at position 2"):
        cache.insert([1, 2, -1, 4])
    with pytest.raises(ValueError, match="num_pages"):
        cache.evict(-1)
    with pytest.raises(ValueError, match="not locked"):
        cache.unlock(m)
    with pytest.raises(ValueError, match="namespace"):
        cache.insert([1, 2], ("k", "s"))


def test_storage_methods_without_a_store() -> None:
    cache = RadixCache(2)
    assert cache.storage_hit_length([1, 2], Namespace()) == 0
    assert cache.prefetch([1, 2], Namespace()) == 0
    with pytest.raises(ValueError, match="store"):
        cache.offload([1, 2], Namespace())
