"""What one publisher may cost a BlockIndex: dp ranks per source, and adapter names that free themselves.

A base class of BlockIndex (kvevents.consumers.indexer). Each lora_name gets a view (a table of its
own) while copies reference it: copies are counted per (worker, view), per (source, view) and per
view, so a view whose last copy goes (a remove, AllBlocksCleared, a dropped source) is freed with
its name, and its id reused. Live names are bounded globally (`max_adapters`) and per source
(`max_adapters_per_source`): a source that has used up its own share is refused, not everyone
else; every refusal is counted under the source that caused it (`adapter_drops`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter, defaultdict

from kvevents.consumers.index_reports import IndexReports, WorkerEntry
from kvevents.consumers.table import HashTable

__all__ = ["IndexBounds"]


class IndexBounds(IndexReports, ABC):
    """Rank and adapter bookkeeping of BlockIndex (which provides `_new_view` and `_changed`)."""

    def __init__(self, max_ranks: int, max_other_media: int, max_adapters: int, max_per_source: int) -> None:
        for name, v in (
            ("max_ranks_per_source", max_ranks),
            ("max_other_media", max_other_media),
            ("max_adapters", max_adapters),
            ("max_adapters_per_source", max_per_source),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"BlockIndex: {name} must be a non-negative integer, got {v!r}")
        self.max_ranks_per_source = max_ranks
        self.max_other_media = max_other_media
        self.max_adapters = max_adapters
        self.max_adapters_per_source = max_per_source
        self._ranks: Counter[str] = Counter()  # source -> dp ranks it has workers for
        self._loras: list[str | None] = [None]  # view id -> lora_name (None: no adapter, or freed)
        self._lora_ix: dict[str | None, int] = {None: 0}
        self._free_vids: list[int] = []
        self._live_adapters = 0
        self._view_copies: list[int] = [0]  # view id -> copies it holds
        self._worker_views: dict[int, dict[int, int]] = {}  # worker index -> {view id: copies}
        self._source_views: defaultdict[str, dict[int, int]] = defaultdict(dict)  # source -> {named view: copies}
        self._adapter_drops: Counter[str] = Counter()

    @abstractmethod
    def _new_view(self) -> HashTable:
        """An empty view table (the index's own sizing and change counter)."""

    @abstractmethod
    def _changed(self) -> None:
        """The index layout changed: bound walks and routers re-read it."""

    # ---------------------------------------------------------------- ranks

    def _admit_rank(self, source: str) -> bool:
        """Room for one more dp rank of `source` (taken if so)."""
        if self._ranks[source] >= self.max_ranks_per_source:
            return False
        self._ranks[source] += 1
        return True

    def _forget_rank(self, source: str) -> None:
        self._ranks[source] -= 1
        if not self._ranks[source]:
            del self._ranks[source]
            if not self._source_views.get(source):
                self._source_views.pop(source, None)

    # ---------------------------------------------------------------- adapters

    @property
    def live_adapters(self) -> int:
        """lora_names some copy references now (what `max_adapters` bounds)."""
        return self._live_adapters

    def adapter_drops(self) -> dict[str, int]:
        """Per source: store events refused by an adapter bound (its own or the global one)."""
        return dict(self._adapter_drops)

    def adapters_of(self, source: str) -> list[str]:
        """The lora_names `source`'s copies reference now (what `max_adapters_per_source` bounds)."""
        return sorted(str(self._loras[v]) for v in self._source_views.get(source, {}))

    def _admit_view(self, source: str, lora: str | None) -> int | None:
        """The view of `lora` for a store of `source` new to that name: made when the name is new,
        None (counted) when a bound refuses it."""
        vid = self._lora_ix.get(lora)
        if vid == 0:
            return 0
        mine = self._source_views[source]  # its named views only
        if len(mine) >= self.max_adapters_per_source or (vid is None and self._live_adapters >= self.max_adapters):
            self._adapter_drops[source] += 1
            return None
        if vid is None:
            if self._free_vids:
                vid = min(self._free_vids)
                self._free_vids.remove(vid)
                self._loras[vid] = lora
                self._views[vid] = self._new_view()
            else:
                vid = len(self._loras)
                self._loras.append(lora)
                self._views.append(self._new_view())
                self._view_copies.append(0)
            self._lora_ix[lora] = vid
            self._live_adapters += 1
            self._changed()
        return vid

    def _note_copies(self, w: WorkerEntry, vid: int, delta: int | None) -> None:
        """`delta` copies of worker `w` came to (or, negative, left) view `vid`; None: all it had
        there went. A named view left with no copy is freed."""
        wi = w.index
        mine = self._worker_views.get(wi)
        if mine is None:
            mine = self._worker_views[wi] = {}
        had = mine.get(vid, 0)
        if delta is None:
            delta = -had
        if had + delta:
            mine[vid] = had + delta
        elif had:
            del mine[vid]
        if vid:  # named views: per source, and freed with their last copy
            _add(self._source_views[w.source], vid, delta)
            left = self._view_copies[vid] = self._view_copies[vid] + delta
            if not left:
                self._free_view(vid)

    def _free_view(self, vid: int) -> None:
        del self._lora_ix[self._loras[vid]]
        self._loras[vid] = None
        self._views[vid] = None
        self._free_vids.append(vid)
        self._live_adapters -= 1
        self._changed()

    def _worker_tables(self, wi: int) -> list[tuple[int, HashTable]]:
        """(view id, table) of the views worker `wi` holds copies in, lowest id first."""
        mine = self._worker_views.get(wi)
        if not mine:
            return []
        views = self._views
        return [(v, views[v]) for v in sorted(mine)]  # type: ignore[misc]


def _add(counts: dict[int, int], key: int, delta: int) -> None:
    n = counts.get(key, 0) + delta
    if n:
        counts[key] = n
    else:
        counts.pop(key, None)
