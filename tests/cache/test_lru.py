"""LRU order, split timing, locks and event coalescing of the radix cache (the contract, "What the reference cache emits")."""

from __future__ import annotations

import pytest

from kvevents.cache import RadixCache
from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvevents.hashing import Namespace, event_hashes, to_int64

PS = 2


def pages(*ids: int) -> list[int]:
    """One page per id: [id*10, id*10+1]."""
    return [t for i in ids for t in (i * 10, i * 10 + 1)]


def pub(tokens: list[int], ns: Namespace = Namespace()) -> list[int]:
    return [to_int64(h) for h in event_hashes(tokens, PS, ns)]


def removed_after(cache: RadixCache, n: int) -> list[int]:
    cache.take_events()
    cache.evict(n)
    evs = cache.take_events()
    assert all(isinstance(e, BlockRemoved) for e in evs) and len(evs) <= 1
    return evs[0].block_hashes if evs else []


def fresh() -> RadixCache:
    cache = RadixCache(PS)
    cache.take_events()
    return cache


def test_lru_leaves_oldest_first_and_match_refreshes() -> None:
    cache = fresh()
    x, w = pages(1, 2), pages(5, 6)
    cache.insert(x)
    cache.insert(w)
    cache.match_prefix(x)  # x is now newer than w
    assert removed_after(cache, 1) == pub(w)
    assert removed_after(cache, 1) == pub(x)


def test_split_lower_half_keeps_this_access_time() -> None:
    """A match ending inside X refreshes X before splitting: its lower half is newer than W."""
    cache = fresh()
    x, w = pages(1, 2, 3), pages(5)
    cache.insert(x)
    cache.insert(w)
    cache.take_events()
    m = cache.match_prefix(x[:PS])  # splits X into [1] and [2, 3]
    assert m.num_tokens == PS
    assert cache.take_events() == []  # a split emits nothing
    assert removed_after(cache, 1) == pub(w)
    assert removed_after(cache, 1) == pub(x)[1:]  # lower half, hashes kept through the split
    assert removed_after(cache, 1) == pub(x)[:1]


def test_split_upper_half_newer_than_lower_and_new_leaf_newest() -> None:
    cache = fresh()
    x = pages(1, 2, 3)
    cache.insert(x)
    cache.take_events()
    y = pages(1, 7)
    assert cache.insert(y) == PS  # splits X after page 0, adds leaf [7]
    evs = cache.take_events()
    assert len(evs) == 1 and isinstance(evs[0], BlockStored)
    assert evs[0].parent_block_hash == pub(x)[0] and evs[0].block_hashes == pub(y)[1:]
    infos = {tuple(i.tokens): i for i in cache.sequences()}
    upper, lower, leaf = infos[tuple(x[:PS])], infos[tuple(x)], infos[tuple(y)]
    assert lower.last_access < upper.last_access < leaf.last_access
    assert removed_after(cache, 100) == pub(x)[1:] + pub(y)[1:] + pub(x)[:1]


def test_parent_becoming_leaf_competes_with_its_own_time() -> None:
    cache = fresh()
    p, child, w = pages(1), pages(1, 2), pages(5)
    cache.insert(child)  # one node [1, 2]
    cache.match_prefix(p)  # split: parent [1] (refreshed), child [2]
    cache.insert(w)  # w newer than both
    cache.match_prefix(p)  # parent [1] newest now
    assert removed_after(cache, 1) == pub(child)[1:]
    # the parent is a leaf now, with its own (newest) time: w goes first
    assert removed_after(cache, 1) == pub(w)
    assert removed_after(cache, 1) == pub(p)


def test_short_insert_or_match_changes_nothing() -> None:
    cache = fresh()
    cache.insert(pages(1, 2))
    before = cache.debug_dump()
    assert cache.insert([10]) == 0
    assert cache.match_prefix([10]).num_tokens == 0
    assert cache.insert([]) == 0
    assert cache.debug_dump() == before


def test_evict_returns_pages_and_stops_when_nothing_evictable() -> None:
    cache = fresh()
    cache.insert(pages(1, 2, 3))
    cache.insert(pages(4))
    m = cache.match_prefix(pages(1, 2, 3))
    cache.lock(m)
    assert cache.evict(10) == 1  # only [4]
    assert cache.evict(10) == 0
    assert cache.num_pages == 3
    cache.unlock(m)
    assert cache.evict(0) == 0
    assert cache.evict(1) == 3  # whole node, at least n pages
    assert cache.num_pages == 0


def test_lock_pins_matched_nodes_only_and_split_keeps_both_halves_locked() -> None:
    cache = fresh()
    x = pages(1, 2, 3)
    cache.insert(x)
    m = cache.match_prefix(x[: 2 * PS])  # split: [1, 2] matched, [3] not
    cache.lock(m)
    assert cache.evict(1) == 1  # the unmatched lower half [3] stays evictable
    assert cache.evict(1) == 0
    cache.match_prefix(x[:PS])  # splitting the locked node: both halves stay locked
    assert {tuple(i.tokens): i.lock for i in cache.sequences()} == {tuple(x[:PS]): 1, tuple(x[: 2 * PS]): 1}
    assert cache.evict(5) == 0
    cache.unlock(m)
    assert all(i.lock == 0 for i in cache.sequences())
    assert removed_after(cache, 5) == pub(x)[1:2] + pub(x)[:1]


def test_lock_counts_and_unlock_errors() -> None:
    cache = fresh()
    cache.insert(pages(1))
    m = cache.match_prefix(pages(1))
    cache.lock(m)
    cache.lock(m)
    cache.unlock(m)
    assert cache.evict(1) == 0
    cache.unlock(m)
    with pytest.raises(ValueError, match="not locked"):
        cache.unlock(m)
    cache.lock(m)
    cache.reset()
    before = cache.debug_dump()
    with pytest.raises(ValueError, match="reset"):
        cache.unlock(m)
    with pytest.raises(ValueError, match="reset"):
        cache.lock(m)
    assert cache.debug_dump() == before
    other = RadixCache(PS)
    with pytest.raises(ValueError, match="another cache"):
        other.lock(cache.match_prefix(pages(1)))


def test_lock_after_eviction_is_rejected() -> None:
    cache = fresh()
    cache.insert(pages(1))
    m = cache.match_prefix(pages(1))
    cache.evict(1)
    with pytest.raises(ValueError, match="evicted"):
        cache.lock(m)


def test_reset_drops_locks_and_queues_cleared_after_pending() -> None:
    cache = fresh()
    cache.insert(pages(1))
    cache.lock(cache.match_prefix(pages(1)))
    cache.reset()
    cache.reset()
    evs = cache.take_events()
    assert [type(e) for e in evs] == [BlockStored, AllBlocksCleared, AllBlocksCleared]
    assert cache.num_pages == 0 and cache.published_copies() == {}
    cache.insert(pages(1))
    assert cache.evict(1) == 1  # no lock survived


def test_no_events_for_matches_reinserts_locks() -> None:
    cache = fresh()
    cache.insert(pages(1, 2))
    cache.take_events()
    m = cache.match_prefix(pages(1, 2, 3))
    cache.lock(m)
    cache.unlock(m)
    assert cache.insert(pages(1, 2)) == 2 * PS
    assert cache.insert(pages(1)) == PS
    assert cache.take_events() == []


def test_coalescing_rules() -> None:
    salt = Namespace(None, "t")
    cache = fresh()
    cache.insert(pages(1), salt)
    cache.insert(pages(1, 2), Namespace("k", "t"))  # other extra key, same salt: a root chain head
    cache.insert(pages(1, 2), salt)  # chains onto the first: joins
    evs = cache.take_events()
    assert [len(e.block_hashes) for e in evs] == [1, 2, 1]
    assert evs[0].block_hashes == pub(pages(1), salt) and evs[1].block_hashes == pub(pages(1, 2), salt)
    assert evs[2].block_hashes == pub(pages(1, 2), salt)[1:] and evs[2].parent_block_hash == evs[0].block_hashes[0]
    # the third joined nothing because the last queued event was the other namespace's head
    cache2 = fresh()
    cache2.insert(pages(1), salt)
    cache2.insert(pages(1, 2), salt)
    cache2.insert(pages(1, 2, 3), Namespace("k", "t"))  # root head under k: no join (parent None)
    evs = cache2.take_events()
    assert [e.block_hashes for e in evs][0] == pub(pages(1, 2), salt)
    # chained stores of one namespace join into one event
    cache3 = fresh()
    cache3.insert(pages(1), Namespace("k", "t"))
    cache3.insert(pages(1, 2), Namespace("k", "t"))
    cache3.insert(pages(1, 2, 3), Namespace("k", "t"))
    (ev,) = cache3.take_events()
    assert ev.block_hashes == pub(pages(1, 2, 3), salt) and ev.parent_block_hash is None
    assert ev.token_ids == pages(1, 2, 3)
    # joining ignores extra_key: a store under k extends the queued store of (None, t)
    cache4 = fresh()
    cache4.insert(pages(1), Namespace("k", "t"))
    cache4.take_events()
    cache4.insert(pages(1), salt)  # queued: (None, t)'s head, parent None
    cache4.insert(pages(1, 2), Namespace("k", "t"))  # k's new node chains from the same event hash
    (ev,) = cache4.take_events()
    assert ev.block_hashes == pub(pages(1, 2), salt) and ev.parent_block_hash is None
    assert ev.token_ids == pages(1, 2)


def test_coalescing_needs_equal_metadata_and_never_crosses_takes() -> None:
    cache = fresh()
    cache.insert(pages(1), session_id="a")
    cache.insert(pages(1, 2), session_id="b")
    cache.insert(pages(1, 2, 3), session_id="b", lora_name="x")
    assert [len(e.block_hashes) for e in cache.take_events()] == [1, 1, 1]
    cache.insert(pages(1, 2, 3, 4), session_id="b", lora_name="x")
    (ev,) = cache.take_events()
    assert ev.parent_block_hash == pub(pages(1, 2, 3))[-1] and ev.lora_name == "x" and ev.session_id == "b"
    # removes join removes of the same medium, even across evict calls, but never across takes
    cache.evict(1)
    cache.evict(1)
    (rm,) = cache.take_events()
    assert rm.block_hashes == pub(pages(1, 2, 3, 4))[3:] + pub(pages(1, 2, 3))[2:]
    cache.evict(1)
    assert len(cache.take_events()) == 1


def test_same_tokens_under_two_extra_keys_are_two_copies() -> None:
    cache = fresh()
    cache.insert(pages(1, 2), Namespace("a"))
    cache.insert(pages(1, 2), Namespace("b"))
    evs = cache.take_events()
    assert evs[0].block_hashes == evs[1].block_hashes == pub(pages(1, 2))
    assert cache.published_copies() == {h: 2 for h in pub(pages(1, 2))}
    cache.match_prefix(pages(1, 2), Namespace("b"))
    assert removed_after(cache, 1) == pub(pages(1, 2))
    assert cache.published_copies() == {h: 1 for h in pub(pages(1, 2))}


def test_capacity_evicts_before_insert_and_protects_the_path() -> None:
    cache = RadixCache(PS, capacity_pages=3)
    cache.take_events()
    cache.insert(pages(1, 2))
    cache.insert(pages(5))
    cache.take_events()
    assert cache.insert(pages(1, 2, 3)) == 2 * PS  # needs one page: evicts [5], not its own path
    evs = cache.take_events()
    assert isinstance(evs[0], BlockRemoved) and evs[0].block_hashes == pub(pages(5))
    assert isinstance(evs[1], BlockStored) and evs[1].block_hashes == pub(pages(1, 2, 3))[2:]
    assert cache.num_pages == 3
    # longer than the capacity: keeps what fits
    cache2 = RadixCache(PS, capacity_pages=2)
    cache2.insert(pages(1, 2, 3, 4))
    assert cache2.num_pages == 2 and cache2.match_prefix(pages(1, 2, 3, 4)).num_tokens == 2 * PS


def test_flush_events_calls_on_events() -> None:
    got: list[list] = []
    cache = RadixCache(PS, on_events=got.append)
    assert cache.flush_events() == 1
    assert cache.flush_events() == 0
    cache.insert(pages(1))
    cache.insert(pages(2))
    assert cache.flush_events() == 2
    assert [len(b) for b in got] == [1, 2]


def test_medium_and_metadata_carried() -> None:
    cache = RadixCache(PS, medium="CPU_PINNED")
    cache.take_events()
    cache.insert(pages(1), Namespace("lora-7", "s"), lora_name="lora-7", session_id="sess")
    (ev,) = cache.take_events()
    assert (ev.medium, ev.lora_id, ev.lora_name, ev.session_id, ev.cache_salt) == (
        "CPU_PINNED",
        None,
        "lora-7",
        "sess",
        "s",
    )
    cache.insert(pages(2), Namespace("lora-7"))
    (ev,) = cache.take_events()
    assert ev.lora_name is None  # never derived from extra_key


def test_lru_candidates_stay_bounded_without_evictions() -> None:
    """The lazy candidate heap is compacted, so a cache that never evicts does not grow with traffic."""
    cache = fresh()
    cache.insert(pages(1, 2))
    for _ in range(5000):
        cache.match_prefix(pages(1, 2))
    assert len(cache._heap) <= 4 * cache.num_nodes + 1025
    assert removed_after(cache, 1) == pub(pages(1, 2))


def test_children_distinguished_by_namespace_and_first_page() -> None:
    cache = fresh()
    toks = pages(1, 2)
    spaces = [Namespace(), Namespace(""), Namespace("k"), Namespace(None, "s"), Namespace("k", "s")]
    for ns in spaces:
        assert cache.insert(toks, ns) == 0  # nothing shared across namespaces
    assert cache.num_pages == 2 * len(spaces)
    for ns in spaces:
        m = cache.match_prefix(toks + pages(3), ns)
        assert m.num_tokens == 2 * PS and m.event_hashes == event_hashes(toks, PS, ns)
    # the default namespace stores one chain (event == storage); the others keep both
    nodes = {n.ns: n for n in cache._nodes()}
    assert nodes[Namespace()].events is None
    assert all(nodes[ns].events is not None for ns in spaces[1:])
    # extra_key "" and None publish the same hashes but are two copies
    assert cache.published_copies()[pub(toks)[0]] == 3  # (None,None), ("",None), ("k",None)
