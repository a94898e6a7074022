"""The router's seam into a BlockIndex: `holds` and `prefix_match`, and the plans and layouts they walk.

A base class of BlockIndex (kvevents.consumers.indexer), apart from its write path (apply): a lookup
reads the tables in place (the walk itself is kvevents.consumers.lookup) through a plan per
(lora_name, strict) (which views, which workers' bits) and a layout per medium weight (per worker
word, its columns best weight first); both are cached, and a compiled walk bound to them too, until
BlockIndex says its layout changed (`_forget_lookups`) or a table's arrays move.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from kvevents import native
from kvevents.consumers.index_reports import IndexReports
from kvevents.consumers.lookup import (
    ColumnsWalk,
    MatchColumns,
    PrefixMatch,
    WordLayout,
    bind_walk,
    bind_walk_columns,
    make_plan,
    walk_plan,
)
from kvevents.consumers.table import HashTable

__all__ = ["IndexLookups"]

_PLANS_MAX = 256  # cached lookup plans (per request lora_name); the cache starts over past it
_CACHED_NAME_MAX = 256  # longer lora names are planned per request, never kept

Plan = list[tuple[HashTable, "np.ndarray | None"]]


class IndexLookups(IndexReports):
    """The lookup half of BlockIndex (which sets the attributes below and calls `_forget_lookups`
    whenever workers, media, columns, lora views, or which media hold copies change)."""

    _lora_ix: dict[str | None, int]
    _lora_sources: set[int]
    _word_bits: dict[int, int]
    _medium_copies: list[int]
    _table_changes: list[int]

    def __init__(self) -> None:
        self._plans: dict[tuple[str | None, bool], Plan] = {}  # router cache
        self._layout_cache: tuple[int, Callable[[str | None], float], list[float], list[WordLayout]] | None = None
        # (lora_name, strict, medium_weight) -> the compiled walk bound to its plan and layout; valid
        # until _forget_lookups() or a table's cview() changes (then all go: they pin their tables' arrays)
        self._walkers: dict[tuple[Any, ...], Callable[[np.ndarray], Any]] = {}  # PrefixMatch or MatchColumns
        self._walkers_at = 0  # _table_changes[0] when they were bound

    def _forget_lookups(self) -> None:
        """Cached plans and bound walks go (layouts follow `_layout_version`)."""
        self._plans.clear()
        self._walkers.clear()

    def _word_columns(self) -> dict[int, list[tuple[int, int]]]:
        """Per worker word: (column, medium index) of the media holding any copy (router)."""
        out: dict[int, list[tuple[int, int]]] = {}
        copies = self._medium_copies
        for (mi, word), col in self._cols.items():
            if copies[mi] > 0:
                out.setdefault(word, []).append((col, mi))
        return out

    def holds(self, block_hash: int, lora_name: str | None = None, *, strict: bool = True) -> bool:
        """Does any worker hold `block_hash` for a request under `lora_name`? One key, a few us.

        Strict: copies stored under that lora_name, plus lora-less copies of workers that never
        published a lora_name (their events cannot tell adapters apart); else copies of any adapter.
        """
        for t, filt in self._lookup_plan(lora_name, strict):
            slot = t.find1(block_hash)
            if slot >= 0 and t.row_holds(slot, filt):
                return True
        return False

    def prefix_match(
        self,
        hashes: np.ndarray,
        lora_name: str | None = None,
        *,
        strict: bool = True,
        medium_weight: Callable[[str | None], float] = lambda medium: 1.0,
    ) -> PrefixMatch:
        """Per worker index (see `labels`): the consecutive prefix of `hashes` (int64 array, page
        order) it holds for a request under `lora_name` (as in `holds`), scored by medium weight,
        with the pages credited per medium (each at the best-weighted medium holding it)."""
        n = len(hashes)
        key = (lora_name, strict, medium_weight)
        bound = self._current_walkers().get(key)
        if bound is not None and n and native.active():  # the common case: one dict get and a C call
            return bound(hashes)
        plan = self._lookup_plan(lora_name, strict)
        if not plan or not self._by_index or not n:
            return PrefixMatch(n)
        weights, layout = self._layout(medium_weight)
        bound = bind_walk(plan, layout, self._media, weights)
        if bound is None:
            return walk_plan(hashes, plan, layout, self._media, weights, len(self._cols))
        self._keep_walker(key, lora_name, bound)
        return bound(hashes)

    def prefix_columns(
        self,
        hashes: np.ndarray,
        lora_name: str | None = None,
        *,
        strict: bool = True,
        medium_weight: Callable[[str | None], float] = lambda medium: 1.0,
    ) -> MatchColumns:
        """`prefix_match` as columns (worker index, prefix pages, score; no pages by medium), for a
        caller ranking every matched worker: the compiled walk then builds no object per worker."""
        if len(hashes) and native.active():
            bound = self._columns_walk(lora_name, strict, medium_weight)
            if bound is not None:
                return bound(hashes)
        return MatchColumns.of(self.prefix_match(hashes, lora_name, strict=strict, medium_weight=medium_weight))

    def prefix_columns_packed(
        self,
        ids: bytes,
        page_size: int,
        prior: bytes | None,
        lora_name: str | None = None,
        *,
        strict: bool = True,
        medium_weight: Callable[[str | None], float] = lambda medium: 1.0,
    ) -> tuple[np.ndarray, MatchColumns] | None:
        """The event hashes of packed ids' whole pages (chained after `prior`) and their `prefix_columns`,
        hashed as the compiled walk reads them (kvevents.consumers.lookup.ColumnsWalk.packed); None
        where no compiled walk applies (the caller hashes, then calls `prefix_columns`)."""
        if not native.active():
            return None
        bound = self._columns_walk(lora_name, strict, medium_weight)
        return bound.packed(ids, page_size, prior) if bound is not None else None

    def _columns_walk(
        self, lora_name: str | None, strict: bool, medium_weight: Callable[[str | None], float]
    ) -> ColumnsWalk | None:
        """The compiled columns walk for these lookup options: cached, else bound (None: nothing to
        walk, or weights the compiled walk declines)."""
        key = (lora_name, strict, medium_weight, MatchColumns)
        bound = self._current_walkers().get(key)
        if bound is not None:
            return bound  # type: ignore[return-value]
        plan = self._lookup_plan(lora_name, strict)
        if not plan or not self._by_index:
            return None
        weights, layout = self._layout(medium_weight)
        made = bind_walk_columns(plan, layout, self._media, weights)
        if made is not None:
            self._keep_walker(key, lora_name, made)
        return made

    def _current_walkers(self) -> dict[tuple[Any, ...], Callable[[np.ndarray], Any]]:
        """The bound walks, dropped first when a table's arrays moved since they were bound."""
        if self._walkers_at != self._table_changes[0]:
            self._walkers.clear()
            self._walkers_at = self._table_changes[0]
        return self._walkers

    def _keep_walker(self, key: tuple[Any, ...], lora_name: str | None, bound: Callable[[np.ndarray], Any]) -> None:
        """Cache a bound walk, bounded like the plans (long lora names are bound per request)."""
        if lora_name is None or len(lora_name) <= _CACHED_NAME_MAX:
            if len(self._walkers) >= _PLANS_MAX:
                self._walkers.clear()
            self._walkers[key] = bound

    def _layout(self, medium_weight: Callable[[str | None], float]) -> tuple[list[float], list[WordLayout]]:
        """Medium weights, and per worker word its columns best weight first; cached until the
        layout (workers, media, columns, media holding copies) or the weight function changes."""
        cached = self._layout_cache
        if cached is not None and cached[0] == self._layout_version and cached[1] == medium_weight:
            return cached[2], cached[3]
        weights = [medium_weight(m) for m in self._media]
        layout = []
        for word, cols in self._word_columns().items():
            alive = self._word_bits.get(word, 0)
            if alive:
                cols.sort(key=lambda c: (-weights[c[1]], c[1]))
                layout.append(WordLayout(word, cols, alive))
        self._layout_cache = (self._layout_version, medium_weight, weights, layout)
        return weights, layout

    def _lookup_plan(self, lora_name: str | None, strict: bool) -> Plan:
        """(view, per-column worker filter or None) pairs whose OR gives a page's masks (cached)."""
        key = (lora_name, strict)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._make_plan(lora_name, strict)
            if lora_name is None or len(lora_name) <= _CACHED_NAME_MAX:  # the cache is bounded in bytes too
                if len(self._plans) >= _PLANS_MAX:
                    self._plans.clear()
                self._plans[key] = plan
        return plan

    def _make_plan(self, lora_name: str | None, strict: bool) -> Plan:
        blind = [w.index for w in self._workers.values() if w.index not in self._lora_sources]
        return make_plan(self._views, self._lora_ix.get(lora_name), lora_name is not None, blind, self._cols, strict)
