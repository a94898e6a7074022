"""Read-only reports over a BlockIndex: who holds a hash, copies per source, medium and adapter.

A base class of BlockIndex (kvevents.consumers.indexer), apart from its write path (apply) and its
lookup seam (prefix_match): these methods read the state BlockIndex keeps and change none of it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterator, Mapping

from kvevents.consumers.copies import WORD, Extra, iter_copies, set_bits, view_tally
from kvevents.consumers.holders import LOW, row_pairs
from kvevents.consumers.table import HAS_PARENT, HashTable, as_hashes
from kvevents.consumers.worker_key import WorkerKey, worker_label

__all__ = ["IndexReports", "WorkerEntry", "WorkerKey", "worker_label"]


@dataclass(slots=True)
class WorkerEntry:
    """One worker the index knows: its key, its bit index (the C fast path's small int) and the
    label it is displayed under."""

    index: int
    key: WorkerKey
    label: str  # key.label, kept: reports and the router read it per worker

    @property
    def source(self) -> str:
        return self.key.source

    @property
    def dp_rank(self) -> int:
        return self.key.dp_rank


def by_label(counts: dict[WorkerKey, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Per-worker counts re-keyed by display label (workers sharing a label are summed)."""
    out: dict[str, dict[str, int]] = {}
    for key, per in counts.items():
        row = out.setdefault(key.label, {})
        for name, n in per.items():
            row[name] = row.get(name, 0) + n
    return out


class IndexReports:
    """The reporting half of BlockIndex (which sets every attribute below)."""

    _workers: dict[tuple[str, int], WorkerEntry]  # every key is a WorkerKey (see BlockIndex.__init__)
    _by_index: dict[int, WorkerEntry]
    _views: list[HashTable | None]  # None: a freed adapter view
    _cols: dict[tuple[int, int], int]
    _extra: Extra
    _counts: Counter[tuple[int, int]]
    _media: list[str | None]
    _medium_ix: dict[str | None, int]
    _loras: list[str | None]
    _layout_version: int  # bumped whenever the workers (or the layout) change
    _keys: tuple[int, Mapping[int, WorkerKey]] | None
    _labels: tuple[int, Mapping[int, str]] | None

    def keys_by_index(self) -> Mapping[int, WorkerKey]:
        """Worker index (what `prefix_match` results are keyed by) -> WorkerKey, for every known
        worker: the one map between the C path's small ints and the keys. A read-only view,
        rebuilt only when the workers change."""
        if self._keys is None or self._keys[0] != self._layout_version:
            self._keys = (self._layout_version, MappingProxyType({wi: w.key for wi, w in self._by_index.items()}))
        return self._keys[1]

    def labels(self) -> Mapping[int, str]:
        """Worker index -> display label (`keys_by_index`, rendered; labels need not be unique)."""
        if self._labels is None or self._labels[0] != self._layout_version:
            self._labels = (self._layout_version, MappingProxyType({wi: w.label for wi, w in self._by_index.items()}))
        return self._labels[1]

    def workers(self) -> list[str]:
        """Labels of every known worker, in registration order (for display: see `worker_keys`)."""
        return [w.label for w in self._workers.values()]

    def worker_keys(self) -> list[WorkerKey]:
        """Every known worker, in registration order."""
        return [w.key for w in self._workers.values()]

    def _tables(self) -> list[tuple[int, HashTable]]:
        """(view id, table) of every live view."""
        return [(v, t) for v, t in enumerate(self._views) if t is not None]

    def _pairs_of(self, block_hash: int) -> list[int]:
        """The holder pairs (column, bits) of `block_hash` in every view."""
        try:
            q = as_hashes((block_hash,))
        except ValueError:
            return []
        out: list[int] = []
        for _, t in self._tables():
            s = int(t.find(q)[0])
            if s >= 0:
                out += row_pairs(int(t.rows[s]), t.pool)
        return out

    def workers_for(self, block_hash: int, medium: str | None = None) -> set[str]:
        """Labels of the workers holding at least one copy of `block_hash` (on `medium` if given)."""
        return {key.label for key in self.keys_for(block_hash, medium)}

    def keys_for(self, block_hash: int, medium: str | None = None) -> set[WorkerKey]:
        """The workers holding at least one copy of `block_hash` (on `medium` if given)."""
        mi = None
        if medium is not None:
            mi = self._medium_ix.get(medium)
            if mi is None:
                return set()
        owner = {col: key for key, col in self._cols.items()}  # column -> (medium index, worker word)
        out: set[WorkerKey] = set()
        for p in self._pairs_of(block_hash):
            m, word = owner[p >> 32]
            if mi is None or m == mi:
                out.update(self._by_index[word * WORD + b].key for b in set_bits(p & LOW))
        return out

    def parent_of(self, block_hash: int) -> int | None:
        """The parent hash recorded for `block_hash` (None for a chain head or an unknown hash)."""
        try:
            q = as_hashes((block_hash,))
        except ValueError:
            return None
        for _, t in self._tables():
            s = int(t.find(q)[0])
            if s >= 0 and t.state[s] & HAS_PARENT:
                return int(t.parent[s])
        return None

    def has(self, block_hash: int) -> bool:
        return bool(self._pairs_of(block_hash))

    def _iter_copies(self, wi: int | None = None, medium: str | None = None) -> Iterator[tuple[int, int, int]]:
        """Yield (worker index, hash, copies) for every held (worker, medium, lora, hash)."""
        mi_only = None if medium is None else self._medium_ix.get(medium, -1)
        return iter_copies(self._tables(), self._cols, self._extra, wi, mi_only)

    def copies(self, source: str | None = None, medium: str | None = None, dp_rank: int | None = None) -> Counter[int]:
        """hash -> number of copies held (by one source, or by everyone), optionally on one medium.

        The same shape as `RadixCache.published_copies()`, for ground-truth comparisons. O(index).
        """
        out: Counter[int] = Counter()
        if source is None:
            for _, h, n in self._iter_copies(None, medium):
                out[h] += n
            return out
        for key, w in self._workers.items():
            if key[0] == source and (dp_rank is None or key[1] == dp_rank):
                for _, h, n in self._iter_copies(w.index, medium):
                    out[h] += n
        return out

    def worker_block_counts(self) -> dict[WorkerKey, dict[str, int]]:
        """Per worker: medium -> copies held (media with zero copies omitted)."""
        out: dict[WorkerKey, dict[str, int]] = {w.key: {} for w in self._workers.values()}
        for (wi, mi), n in self._counts.items():
            if n:
                out[self._by_index[wi].key][str(self._media[mi])] = n
        return out

    def block_counts(self) -> dict[str, dict[str, int]]:
        """`worker_block_counts` by display label (for JSON and metrics)."""
        return by_label(self.worker_block_counts())

    def source_counts(self) -> dict[str, int]:
        """Per source name (all dp ranks): copies held on every medium."""
        out: dict[str, int] = {}
        for w in self._workers.values():
            out.setdefault(w.source, 0)
        for (wi, _), n in self._counts.items():
            out[self._by_index[wi].source] += n
        return out

    def medium_counts(self) -> dict[str, int]:
        """Per medium: copies held by all workers."""
        out: dict[str, int] = {}
        for (_, mi), n in self._counts.items():
            if n:
                key = str(self._media[mi])
                out[key] = out.get(key, 0) + n
        return out

    def worker_adapter_counts(self) -> dict[WorkerKey, dict[str, int]]:
        """Per worker: adapter (lora_name; "" for the base model) -> copies held. O(index), for
        status pages (one bit count per column and view)."""
        out: dict[WorkerKey, dict[str, int]] = {w.key: {} for w in self._workers.values()}
        for (vid, wi), n in view_tally(self._tables(), self._cols, self._extra).items():
            w = self._by_index.get(wi)
            if w is not None and n:
                name = self._loras[vid] or ""
                row = out[w.key]
                row[name] = row.get(name, 0) + n
        return out

    def adapter_counts(self) -> dict[str, dict[str, int]]:
        """`worker_adapter_counts` by display label."""
        return by_label(self.worker_adapter_counts())

    def __len__(self) -> int:
        """Number of block copies held (all workers, media, lora names)."""
        return sum(self._counts.values())

    @property
    def distinct_hashes(self) -> int:
        """Number of (lora_name, hash) entries: the table rows the index pays for."""
        return sum(t.live for t in self._views if t is not None)
