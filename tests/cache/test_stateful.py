"""Stateful property test of the radix cache against an independent model built from its events.

The model only sees the emitted events (plus the token paths they name) and recomputes every hash
with kvevents.hashing, so it checks the contract, "What the reference cache emits" from the consumer's side: every published hash
is event_hashes(full token path, salt), removes only remove live copies, and stored-minus-removed
copies equal the tree's pages at every step.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvevents.cache import Match, MemoryStore, RadixCache
from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvevents.hashing import Namespace, event_hashes, storage_hashes, to_int64

NAMESPACES = [
    Namespace(),
    Namespace("k1"),
    Namespace("k2"),
    Namespace(""),
    Namespace(None, "s1"),
    Namespace("k1", "s1"),
    Namespace("k2", "s1"),
    Namespace("k1", "s2"),
]
namespaces = st.sampled_from(NAMESPACES)
# a tiny alphabet so prefixes are shared and nodes split often
token_lists = st.lists(st.integers(0, 1), min_size=0, max_size=12)


class CacheMachine(RuleBasedStateMachine):
    matches = Bundle("matches")

    def __init__(self) -> None:
        super().__init__()
        self.cache: RadixCache | None = None
        self.store: MemoryStore | None = None
        self.ps = 1
        self.copies: Counter[int] = Counter()  # GPU: published hash -> live copies, from events only
        self.stored: Counter[int] = Counter()  # STORAGE copies announced by storage events
        self.path: dict[int, tuple[tuple[int, ...], str | None]] = {}  # hash -> (token path, salt)
        self.locked: list[Match] = []
        self.stale: list[Match] = []
        self.match_input: dict[int, tuple[list[int], Namespace]] = {}

    # ------------------------------------------------------------------ model
    def apply_events(self) -> list[Any]:
        assert self.cache is not None
        evs = self.cache.take_events()
        for ev in evs:
            if isinstance(ev, AllBlocksCleared):
                self.copies.clear()
                self.stored.clear()
                continue
            assert ev.medium in ("GPU", "STORAGE")
            copies = self.copies if ev.medium == "GPU" else self.stored
            if isinstance(ev, BlockStored):
                assert ev.block_size == self.ps and ev.lora_id is None
                assert len(ev.token_ids) == len(ev.block_hashes) * self.ps
                if ev.parent_block_hash is None:
                    prefix: tuple[int, ...] = ()
                else:  # the parent is a live copy (on the same medium) whose path the model knows
                    assert copies[ev.parent_block_hash] > 0, "BlockStored under a parent that is not live"
                    prefix, psalt = self.path[ev.parent_block_hash]
                    assert psalt == ev.cache_salt
                full = prefix + tuple(ev.token_ids)
                want = event_hashes(list(full), self.ps, Namespace(None, ev.cache_salt))
                assert ev.block_hashes == [to_int64(h) for h in want[len(prefix) // self.ps :]]
                for i, h in enumerate(ev.block_hashes):
                    copies[h] += 1
                    self.path[h] = (full[: len(prefix) + (i + 1) * self.ps], ev.cache_salt)
            else:
                assert isinstance(ev, BlockRemoved)
                for h in ev.block_hashes:
                    assert copies[h] > 0, "removed a hash copy that was not stored"
                    copies[h] -= 1
                    if not copies[h]:
                        del copies[h]
        return evs

    def live_prefixes(self) -> set[tuple[Namespace, tuple[int, ...]]]:
        assert self.cache is not None
        out = set()
        for ns, tokens, storage, *_ in self.cache.sequences():
            for k in range(len(tokens) // self.ps - len(storage) + 1, len(tokens) // self.ps + 1):
                out.add((ns, tuple(tokens[: k * self.ps])))
        return out

    def expected_hit(self, tokens: list[int], ns: Namespace) -> int:
        live = self.live_prefixes()
        k = 0
        while (k + 1) * self.ps <= len(tokens) and (ns, tuple(tokens[: (k + 1) * self.ps])) in live:
            k += 1
        return k * self.ps

    # ------------------------------------------------------------------ rules
    @initialize(ps=st.integers(1, 4), cap=st.one_of(st.none(), st.integers(3, 16)), storage=st.booleans())
    def setup(self, ps: int, cap: int | None, storage: bool) -> None:
        self.ps = ps
        self.store = MemoryStore() if storage else None
        self.cache = RadixCache(ps, capacity_pages=cap, store=self.store, storage_events=storage)
        assert [type(e) for e in self.apply_events()] == [AllBlocksCleared]

    @rule(tokens=token_lists, ns=namespaces)
    def insert(self, tokens: list[int], ns: Namespace) -> None:
        assert self.cache is not None
        want = self.expected_hit(tokens, ns)
        before = self.cache.num_pages
        got = self.cache.insert(tokens, ns)
        assert got == want
        if len(tokens) < self.ps:
            assert self.cache.num_pages == before
        evs = self.apply_events()
        if got == len(tokens) // self.ps * self.ps:
            assert evs == []  # re-inserting a cached prefix emits nothing
        elif self.cache.capacity_pages is None:
            assert self.expected_hit(tokens, ns) == len(tokens) // self.ps * self.ps

    @rule(tokens=token_lists, extra=st.lists(st.integers(0, 2), min_size=1, max_size=8), ns=namespaces)
    def insert_then_extend(self, tokens: list[int], extra: list[int], ns: Namespace) -> None:
        """Two inserts without a take: an extension of a new node joins its BlockStored."""
        assert self.cache is not None
        self.cache.insert(tokens, ns)
        self.cache.insert(tokens + extra, ns)

    @rule(a=token_lists, b=token_lists, ns_a=namespaces, ns_b=namespaces)
    def two_inserts(self, a: list[int], b: list[int], ns_a: Namespace, ns_b: Namespace) -> None:
        """Two unrelated inserts in one step: they join only when b chains onto a's last hash."""
        assert self.cache is not None
        self.cache.insert(a, ns_a)
        self.cache.insert(b, ns_b)

    @rule(target=matches, tokens=token_lists, ns=namespaces)
    def match(self, tokens: list[int], ns: Namespace) -> Match:
        assert self.cache is not None
        want = self.expected_hit(tokens, ns)
        m = self.cache.match_prefix(tokens, ns)
        assert m.num_tokens == want
        assert m.event_hashes == event_hashes(tokens[:want], self.ps, ns)
        assert m.storage_hashes == storage_hashes(tokens[:want], self.ps, ns)
        assert self.apply_events() == []
        self.match_input[id(m)] = (list(tokens), ns)
        return m

    @rule(n=st.integers(0, 12))
    def evict(self, n: int) -> None:
        assert self.cache is not None
        self.apply_events()
        before = self.cache.num_pages
        leaves = [i for i in self.cache.sequences() if i.is_leaf and not i.lock]
        freed = self.cache.evict(n)
        assert before - self.cache.num_pages == freed
        evs = self.apply_events()
        removed = [h for e in evs if isinstance(e, BlockRemoved) for h in e.block_hashes]
        assert all(e.medium == "GPU" for e in evs)  # device eviction never touches storage
        assert len(removed) == freed and len(evs) == (1 if freed else 0)  # one coalesced BlockRemoved
        if n and leaves:  # the least recently used unlocked leaf goes first
            oldest = min(leaves, key=lambda i: i.last_access)
            assert removed[: len(oldest.event_hashes)] == [to_int64(h) for h in oldest.event_hashes]
        if freed < n:  # nothing evictable left: every remaining leaf is locked
            assert all(info.lock > 0 for info in self.cache.sequences() if info.is_leaf)
        for m in self.locked:
            for h in m.published:
                assert self.copies[h] > 0, "a locked page was evicted"

    @rule(m=matches)
    def lock(self, m: Match) -> None:
        assert self.cache is not None
        # a match from before a reset, or whose pages were evicted since, cannot be locked
        expect_error = m._gen != self.cache._gen or not m._node.alive
        before = self.cache.debug_dump()
        try:
            self.cache.lock(m)
        except ValueError:
            assert expect_error
            assert self.cache.debug_dump() == before
            return
        assert not expect_error
        self.locked.append(m)

    @rule(tokens=token_lists, ns=namespaces)
    def match_and_lock(self, tokens: list[int], ns: Namespace) -> None:
        """Pin a fresh match (an engine's running request); later inserts split inside it."""
        m = self.match(tokens, ns)
        assert self.cache is not None
        self.cache.lock(m)
        self.locked.append(m)

    @precondition(lambda self: self.locked)
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        assert self.cache is not None
        m = data.draw(st.sampled_from(self.locked))
        self.cache.unlock(m)
        self.locked.remove(m)

    @rule(m=matches)
    def unlock_unlocked_is_rejected(self, m: Match) -> None:
        assert self.cache is not None
        if m in self.locked:
            return
        before = self.cache.debug_dump()
        try:
            self.cache.unlock(m)
        except ValueError:
            pass
        else:  # pragma: no cover - the assertion documents the contract
            raise AssertionError("unlocking an unlocked match must be a ValueError")
        assert self.cache.debug_dump() == before

    @rule()
    def reset(self) -> None:
        assert self.cache is not None
        self.cache.reset()
        self.stale.extend(self.locked)
        self.locked.clear()
        assert [type(e) for e in self.apply_events()] == [AllBlocksCleared]
        for m in self.stale:
            before = self.cache.debug_dump()
            try:
                self.cache.unlock(m)
            except ValueError:
                pass
            else:  # pragma: no cover
                raise AssertionError("unlocking a match taken before reset() must be a ValueError")
            assert self.cache.debug_dump() == before

    # ------------------------------------------------------------------ invariants
    @invariant()
    def tree_matches_events(self) -> None:
        if self.cache is None:
            return
        self.apply_events()
        cache = self.cache
        assert cache.published_copies() == self.copies
        pages = 0
        held = Counter()  # (namespace, token path of whole pages) -> locked matches covering it
        for m in self.locked:
            toks, mns = self.match_input[id(m)]
            for k in range(1, m.num_tokens // self.ps + 1):
                held[(mns, tuple(toks[: k * self.ps]))] += 1
        for ns, tokens, storage, evs, lock, _, _ in cache.sequences():
            assert lock == held[(ns, tuple(tokens))], "lock count differs from the locked matches"
            k = len(storage)
            pages += k
            assert len(tokens) % self.ps == 0 and k >= 1 and len(evs) == k
            assert evs == event_hashes(tokens, self.ps, Namespace(None, ns.cache_salt))[-k:]
            assert evs == event_hashes(tokens, self.ps, ns)[-k:]  # extra_key never moves them
            assert storage == storage_hashes(tokens, self.ps, ns)[-k:]
        assert pages == cache.num_pages == sum(self.copies.values())
        if cache.capacity_pages is not None:
            assert cache.num_pages <= cache.capacity_pages
        if self.store is not None:
            # write-through: every device page is in the store, under its full-namespace hash
            keys = set(self.store.keys())
            for _ns, _tokens, storage, *_ in cache.sequences():
                assert set(storage) <= keys
            announced = cache._tier.announced  # type: ignore[union-attr]
            assert set(announced) <= keys
            assert Counter(announced.values()) == self.stored


CacheMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
TestCacheMachine = CacheMachine.TestCase
