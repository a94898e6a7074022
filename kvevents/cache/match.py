"""What `match_prefix` returns (`Match`) and what `sequences()` reports per node (`NodeInfo`)."""

from __future__ import annotations

from typing import NamedTuple

from kvevents.cache.node import DIGEST, Node, hexes, published
from kvevents.hashing import Namespace

__all__ = ["Match", "NodeInfo"]


class NodeInfo(NamedTuple):
    """One live node: its namespace, full token path, own pages' hashes, lock, access time."""

    namespace: Namespace
    tokens: list[int]
    storage_hashes: list[str]
    event_hashes: list[str]
    lock: int
    last_access: int
    is_leaf: bool


class Match:
    """A prefix match: whole pages found on device, their hashes, and what `lock` would pin.

    The hashes are a snapshot taken at match time; `lock`/`unlock` act on the matched nodes,
    which survive later splits (the deepest matched node stays the deepest).
    """

    __slots__ = ("num_tokens", "_storage", "_events", "page_data", "_node", "_cache", "_gen", "_locks")

    def __init__(
        self,
        num_tokens: int,
        storage: bytes,
        events: bytes,
        page_data: list[bytes],
        node: Node,
        cache: object,
        gen: int,
    ) -> None:
        self.num_tokens = num_tokens
        self._storage = storage
        self._events = events
        self.page_data = page_data  # simulated KV bytes per matched page (empty without page_content)
        self._node = node
        self._cache = cache
        self._gen = gen
        self._locks = 0

    @property
    def node(self) -> Node:
        """The deepest matched node: what `RadixCache.lock` pins (with its ancestors)."""
        return self._node

    @property
    def cache(self) -> object:
        """The cache this match was taken from (its owner: compared by identity, never called)."""
        return self._cache

    @property
    def generation(self) -> int:
        """The cache's reset count when this match was taken (a reset drops its nodes)."""
        return self._gen

    @property
    def locks(self) -> int:
        """How many times `RadixCache.lock` pinned this match (minus unlocks)."""
        return self._locks

    def count_lock(self, delta: int) -> None:
        """Record a lock (+1) or unlock (-1) of this match; never below zero (ValueError)."""
        if self._locks + delta < 0:
            raise ValueError(f"unlock(): {self!r} is not locked")
        self._locks += delta

    @property
    def num_pages(self) -> int:
        return len(self._storage) // DIGEST

    @property
    def storage_hashes(self) -> list[str]:
        """Storage hashes (hex) of the matched pages, in page order."""
        return hexes(self._storage)

    @property
    def event_hashes(self) -> list[str]:
        """Event (published) hashes (hex) of the matched pages, in page order."""
        return hexes(self._events)

    @property
    def last_storage_hash(self) -> str | None:
        """The prior for continuing this match's storage chain (None for a root-only match)."""
        return self._storage[-DIGEST:].hex() if self._storage else None

    @property
    def published(self) -> list[int]:
        """The matched pages' published int64 hashes."""
        return published(self._events)

    @property
    def locked(self) -> bool:
        return self._locks > 0

    def __repr__(self) -> str:
        return f"Match(num_tokens={self.num_tokens}, pages={self.num_pages}, locks={self._locks})"
