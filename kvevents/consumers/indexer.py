"""BlockIndex: which worker holds which published block, reference-counted and memory-lean.

Layout (why it is small and fast at any fleet width): one HashTable (kvevents.consumers.table:
flat numpy arrays) per live lora_name ("view") maps an int64 block hash to a row: the parent link
and one `rows` word naming its holders (kvevents.consumers.holders). A holder is one bit, its
worker's, in a column (one medium, one group of 32 workers); an entry whose holders share one
column keeps them in the row word itself, others a record of (column, bits) pairs in the table's
pool, sized by the holders it has: an entry's cost follows what holds it, not the fleet's width.
A second copy of the same (worker, dp_rank, medium, lora, hash) (the same tokens under two extra
keys) is counted in a small side dict that is empty in the common case (kvevents.consumers.copies
adds and drops copies). Read-only reports (who holds a hash, copies per source, medium and
adapter) live in the base class, kvevents.consumers.index_reports; the bounds on what a publisher
may cost (ranks, media, adapters) in kvevents.consumers.index_bounds; the lookups (`holds`,
`prefix_match`, their cached plans and layouts) in kvevents.consumers.index_lookups.

Adapter names free themselves: a lora_name's view is dropped (and its name forgotten) when no copy
references it any more, after removes, clears or drops; the number of live names is bounded
globally (`max_adapters`) and per source (`max_adapters_per_source`), so one source cannot use up
the names every other source needs; what a bound refuses is counted per source (`adapter_drops`).

Concurrency: a BlockIndex has no lock of its own and is not thread-safe. Its owner holds one lock
around each call (kvevents.consumers.service.core.RouterService.lock): the feed's thread holds it
for one `apply` (one batch: its events' pages, plus, now and then, the growth of one view's
arrays, or for AllBlocksCleared the scan of the views that worker holds copies in), HTTP threads
for one lookup (`holds`, `prefix_match`: one request, hashed before the lock is taken;
`prefix_columns_packed`: one request of packed ids up to 16,384 tokens, hashed page by page inside
the lock as the walk reads them, ~85 ns a page) or one report. A reader therefore sees the index between two batches, never inside one: every batch is
applied whole or, where it is refused (a bound), counted and skipped. Lookups read the arrays in
place: no copy is made, and a lookup never waits for more than the one batch being applied.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping

from kvevents import native
from kvevents.consumers.copies import WORD, Extra, clear_worker, remove_each, store_each
from kvevents.consumers.index_bounds import IndexBounds
from kvevents.consumers.index_lookups import IndexLookups
from kvevents.consumers.index_reports import WorkerEntry, WorkerKey, worker_label
from kvevents.consumers.table import HashTable, as_hashes
from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, is_rank, rank_of

__all__ = ["BlockIndex", "WorkerKey", "worker_label", "FIXED_MEDIA", "KNOWN_MEDIA"]

#: Media listed first (GPU gets column 0; other columns are added when first used).
FIXED_MEDIA: tuple[str, ...] = ("GPU", "CPU_PINNED", "STORAGE")
#: Media that never count against `max_other_media` (SGLang's and vLLM's tiers; None: SGLang's device).
KNOWN_MEDIA: frozenset[str | None] = frozenset({"GPU", "CPU", "CPU_PINNED", "DISK", "STORAGE", None})
_HOT = ("batches", "stored_copies", "removed_copies")
_SMALL = 24  # events with at most this many hashes are checked for int64 in one C call, not numpy
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


class BlockIndex(IndexBounds, IndexLookups):
    """Reference-counted map of published block copies per (source, dp_rank, medium, hash).

    `apply(source, batch)` never raises for content it cannot use: it counts the reason in
    `counters` (unknown_remove, unknown_parent, ambiguous_remove, ignored_event, bad_hash, ...).
    Not thread-safe: callers that apply and query from different threads hold one lock (see the
    module docstring).
    """

    _small = _SMALL  # events up to this size take the list check (tests set 0 for the numpy one)

    def __init__(
        self,
        *,
        max_ranks_per_source: int = 64,
        max_other_media: int = 8,
        max_adapters: int = 1024,
        max_adapters_per_source: int = 256,
    ) -> None:
        """What a publisher can cost is bounded (each new medium, rank or adapter adds columns,
        workers or views): past `max_ranks_per_source` dp ranks of one source, `max_other_media`
        media outside KNOWN_MEDIA, or `max_adapters` live lora names (`max_adapters_per_source` of
        one source), the batch or event is counted (`dropped_rank`, `dropped_medium`,
        `dropped_adapter`) and dropped."""
        IndexBounds.__init__(self, max_ranks_per_source, max_other_media, max_adapters, max_adapters_per_source)
        IndexLookups.__init__(self)  # the router's caches: plans, layouts, bound walks
        self._media: list[str | None] = list(FIXED_MEDIA)
        self._medium_ix: dict[str | None, int] = {m: i for i, m in enumerate(self._media)}
        self._cols: dict[tuple[int, int], int] = {(0, 0): 0}  # (medium index, worker word) -> column
        self._word_cols: dict[int, list[int]] = {0: [0]}  # worker word -> its columns (one per medium)
        self._table_changes = [0]  # bumped by every view whose cview() changes (HashTable(changes=))
        self._views: list[HashTable | None] = [HashTable(changes=self._table_changes)]  # None: freed
        self._extra: Extra = {}  # (view, medium, worker, hash) -> copies beyond the first
        # WorkerKey -> entry; typed by the plain tuple a WorkerKey equals, so apply looks up without building one
        self._workers: dict[tuple[str, int], WorkerEntry] = {}
        self._by_index: dict[int, WorkerEntry] = {}
        self._free: list[int] = []
        self._word_bits: dict[int, int] = {}  # worker word -> bits of the known workers in it
        self._counts: Counter[tuple[int, int]] = Counter()  # (worker index, medium index) -> copies
        self._medium_copies: list[int] = [0] * len(self._media)  # medium index -> copies (router)
        self._lora_sources: set[int] = set()  # workers that ever published a lora_name
        self._lora_removers: set[int] = set()  # workers that name the adapter on BlockRemoved
        self._layout_version = 0  # bumped by _changed(): lookups re-read the layout
        self._labels: tuple[int, Mapping[int, str]] | None = None
        self._keys: tuple[int, Mapping[int, WorkerKey]] | None = None
        self._counters: Counter[str] = Counter()
        self._hot = [0, 0, 0]  # batches, stored_copies, removed_copies: plain ints on the hot path

    # ---------------------------------------------------------------- workers, media, columns

    def _changed(self) -> None:
        """Workers, media, columns, lora views, or which media hold copies changed: cached router
        plans and layouts go."""
        self._forget_lookups()
        self._layout_version += 1

    def _worker(self, key: WorkerKey) -> WorkerEntry | None:
        """The worker's entry (its bit index), made on first use unless its source has too many ranks."""
        w = self._workers.get(key)
        if w is None:
            if not self._admit_rank(key.source):
                return None
            idx = min(self._free) if self._free else len(self._by_index)
            if self._free:
                self._free.remove(idx)
            w = WorkerEntry(idx, key, key.label)
            self._workers[key] = w
            self._by_index[idx] = w
            self._word_bits[idx // WORD] = self._word_bits.get(idx // WORD, 0) | 1 << (idx % WORD)
            self._changed()
        return w

    def _medium(self, medium: str | None) -> int | None:
        mi = self._medium_ix.get(medium)
        if mi is None:
            if medium not in KNOWN_MEDIA and sum(m not in KNOWN_MEDIA for m in self._media) >= self.max_other_media:
                return None
            mi = len(self._media)
            self._media.append(medium)
            self._medium_ix[medium] = mi
            self._medium_copies.append(0)
            self._changed()
        return mi

    def _new_view(self) -> HashTable:
        return HashTable(changes=self._table_changes)

    def _col(self, mi: int, word: int) -> int:
        """The column of (medium, worker word), numbered when first used (tables need no change:
        a column is only a number in their pairs)."""
        col = self._cols.get((mi, word))
        if col is None:
            col = self._cols[(mi, word)] = len(self._cols)
            self._word_cols.setdefault(word, []).append(col)
            self._changed()
        return col

    def _worker_cols(self, wi: int) -> list[int]:
        """Every column (one per medium) holding worker `wi`'s bit."""
        return self._word_cols.get(wi // WORD, [])

    @property
    def counters(self) -> Counter[str]:
        """Counts by reason (applied, ignored, unknown_remove, ...); the same Counter every time."""
        for name, n in zip(_HOT, self._hot):
            if n:
                self._counters[name] = n
        return self._counters

    # ---------------------------------------------------------------- applying events

    def apply(self, source: str, batch: KVEventBatch) -> None:
        """Apply one decoded batch from `source`, filed under `WorkerKey.of(source, its dp rank)`
        (a rank that is not one, e.g. a bool, is counted as `bad_rank` and filed as rank 0)."""
        rank = batch.data_parallel_rank
        if rank is not None and not is_rank(rank):
            self.counters["bad_rank"] += 1
        w = self._workers.get((source, rank_of(rank))) or self._worker(WorkerKey.of(source, rank))
        if w is None:
            self.counters["dropped_rank"] += 1
            return
        self._hot[0] += 1
        for ev in batch.events:
            t = type(ev)
            if t is BlockStored:
                self._store(w, ev)  # type: ignore[arg-type]
            elif t is BlockRemoved:
                self._remove(w, ev)  # type: ignore[arg-type]
            elif t is AllBlocksCleared:
                self.counters["cleared"] += 1
                self._clear_worker(w)
            else:
                self.counters["ignored_event"] += 1

    def _store(self, w: WorkerEntry, ev: BlockStored) -> None:
        hashes = ev.block_hashes
        n = len(hashes)
        if not n:
            self.counters["empty_store"] += 1
            return
        if type(hashes) is list and native.active() and self._store_fast(w, ev, hashes, n):
            return
        prev = ev.parent_block_hash
        checked = self._checked_hashes(hashes, prev, n)
        if checked is None:
            self.counters["bad_hash"] += 1
            return
        hashes = checked
        wi = w.index
        slots = self._store_slots(w, ev)
        if slots is None:
            return
        mi, vid = slots
        lora = ev.lora_name
        if lora is not None and wi not in self._lora_sources:
            self._lora_sources.add(wi)
            self._changed()
        col = self._cols.get((mi, wi // WORD))
        if col is None:
            col = self._col(mi, wi // WORD)
        if prev is not None and not self._holds(wi, prev):
            self.counters["unknown_parent"] += 1
        t = self._views[vid]
        assert t is not None
        if t.used + n > t.limit:
            t.reserve(n)  # no rebuild below: slot numbers and memoryviews stay valid
        dup = store_each(t, self._extra, vid, mi, col, wi, hashes, prev)
        self._note_copies(w, vid, n)
        self._counts[(wi, mi)] += n
        self._medium_copies[mi] += n
        if self._medium_copies[mi] == n:  # a medium holds copies again: routers re-read the layout
            self._changed()
        self._hot[1] += n
        if dup:
            self.counters["duplicate_copies"] += dup

    def _checked_hashes(self, hashes: Any, prev: int | None, n: int) -> list[int] | None:
        """The event's hashes as a list of int64 (the loops take a list); None when one is not."""
        if n <= self._small and type(hashes) is list and _all_int64(hashes, prev):
            return hashes
        try:  # the numpy check (long events, other sequences)
            out = as_hashes(hashes).tolist()
            if prev is not None:
                as_hashes((prev,))
        except ValueError:
            return None
        return out

    def _store_slots(self, w: WorkerEntry, ev: BlockStored) -> tuple[int, int] | None:
        """(medium index, view id) of a store, registering a new medium or adapter; None (counted)
        when one is past its bound."""
        mi = self._medium_ix.get(ev.medium)
        if mi is None:
            mi = self._medium(ev.medium)
            if mi is None:
                self.counters["dropped_medium"] += 1
                return None
        vid = self._lora_ix.get(ev.lora_name)
        if vid is None or (vid and vid not in self._source_views[w.source]):
            vid = self._admit_view(w.source, ev.lora_name)  # a name new to the index or to this source
            if vid is None:
                self.counters["dropped_adapter"] += 1
                return None
        return mi, vid

    def _store_fast(self, w: WorkerEntry, ev: BlockStored, hashes: list[int], n: int) -> bool:
        """The common store in one C call (checks, parent probe, store loop), when its medium, view
        and column exist and the view has room; False (nothing changed) for the general path."""
        wi = w.index
        mi = self._medium_ix.get(ev.medium)
        lora = ev.lora_name
        vid = self._lora_ix.get(lora)
        if mi is None or vid is None or (vid and vid not in self._source_views[w.source]):
            return False
        col = self._cols.get((mi, wi // WORD))
        t = self._views[vid]
        if col is None or t is None or t.used + n > t.limit or (lora is not None and wi not in self._lora_sources):
            return False
        prev = ev.parent_block_hash
        mine = self._worker_views.get(wi)
        bit = 1 << (wi % WORD)
        if prev is None or not mine:
            pviews = []
        elif len(mine) == 1 and vid in mine:
            pviews = [t.cview()]
        else:
            views = self._views
            pviews = [views[v].cview() for v in mine]  # type: ignore[union-attr]
        got = native.store_event(t.cview(), hashes, col, bit, prev, pviews, self._word_cols[wi // WORD])
        if got is None:
            return False
        if prev is not None and not got[5]:
            self.counters["unknown_parent"] += 1
        dups = t.finish_store(got, hashes, col, bit, prev)
        if dups:
            extra = self._extra
            for h in dups:
                extra[(vid, mi, wi, h)] = extra.get((vid, mi, wi, h), 0) + 1
        if vid or mine is None:
            self._note_copies(w, vid, n)
        else:  # no adapter: only the worker's own count (what _note_copies does for view 0)
            mine[0] = mine.get(0, 0) + n
        self._counts[(wi, mi)] += n
        self._medium_copies[mi] += n
        if self._medium_copies[mi] == n:
            self._changed()
        self._hot[1] += n
        if dups:
            self.counters["duplicate_copies"] += len(dups)
        return True

    def _holds(self, wi: int, h: int) -> bool:
        """True if worker `wi` holds a copy of `h` on any medium, under any lora_name (only the
        views it holds copies in are looked at)."""
        mine = self._worker_views.get(wi)
        if not mine:
            return False
        bit = 1 << (wi % WORD)
        cols = self._word_cols[wi // WORD]
        if native.active():
            views = self._views
            return native.holds_bit([views[v].cview() for v in mine], h, cols, bit)  # type: ignore[union-attr]
        for _, t in self._worker_tables(wi):
            s = t.find1(h)
            if s >= 0 and any(t.bit_set(s, c, bit) for c in cols):
                return True
        return False

    def _remove(self, w: WorkerEntry, ev: BlockRemoved) -> None:
        hashes = ev.block_hashes
        n = len(hashes)
        if not n:
            return
        wi = w.index
        mi = self._medium_ix.get(ev.medium)
        col = None if mi is None else self._cols.get((mi, wi // WORD))
        if mi is None or col is None:
            self.counters["unknown_remove"] += n
            return
        # The remove's lora_name picks the adapter's copy. A worker that names adapters on removes
        # means "no adapter" by a remove without one; for other workers that is unknowable.
        lora = ev.lora_name
        if lora is not None and wi not in self._lora_removers:
            self._lora_removers.add(wi)
        exact = wi in self._lora_removers
        prefer = self._lora_ix.get(lora)
        if n > self._small or type(hashes) is not list or not _all_int64(hashes, None):
            try:  # the numpy check (long events, other sequences); the loops take a list
                hashes = as_hashes(hashes).tolist()
            except ValueError:
                self.counters["bad_hash"] += 1
                return
        views = self._worker_tables(wi)
        unknown, ambiguous, removed = remove_each(views, self._extra, mi, col, wi, hashes, prefer, exact)
        if unknown:
            self.counters["unknown_remove"] += unknown
        if ambiguous:
            self.counters["ambiguous_remove"] += ambiguous
        gone = 0
        for (vid, _), r in zip(views, removed):
            if r:
                gone += r
                self._note_copies(w, vid, -r)
        if gone:
            self._counts[(wi, mi)] -= gone
            self._medium_copies[mi] -= gone
            if not self._medium_copies[mi]:
                self._changed()
            self._hot[2] += gone

    def _clear_worker(self, w: WorkerEntry) -> int:
        """Drop every copy the worker holds, on every medium and lora; returns copies dropped."""
        wi = w.index
        dropped = sum(n for (i, _), n in self._counts.items() if i == wi)
        if not dropped and not any(k[2] == wi for k in self._extra):
            return 0
        bit = 1 << (wi % WORD)
        cols = self._worker_cols(wi)
        for vid, t in self._worker_tables(wi):
            clear_worker(t, cols, bit)
            self._note_copies(w, vid, None)
        for ekey in [k for k in self._extra if k[2] == wi]:
            del self._extra[ekey]
        for ckey in [k for k in self._counts if k[0] == wi]:
            self._medium_copies[ckey[1]] -= self._counts.pop(ckey)
        self._changed()
        self.counters["dropped_copies"] += dropped
        return dropped

    def drop_source(self, source: str, dp_rank: int | None = None, *, forget: bool = False) -> int:
        """Forget a source's blocks (all its dp ranks unless one is given), e.g. on restart or resync.

        The worker stays known (listed with zero blocks) unless `forget` is true.
        Returns the number of block copies dropped.
        """
        dropped = 0
        for key, w in list(self._workers.items()):
            if w.source != source or (dp_rank is not None and w.dp_rank != dp_rank):
                continue
            dropped += self._clear_worker(w)
            if forget:
                del self._workers[key]
                self._forget_rank(source)
                del self._by_index[w.index]
                self._word_bits[w.index // WORD] &= ~(1 << (w.index % WORD))
                self._lora_sources.discard(w.index)
                self._lora_removers.discard(w.index)
                self._changed()
                self._free.append(w.index)
        self.counters["dropped_sources"] += 1
        return dropped

    # ---------------------------------------------------------------- queries

    def stats(self) -> dict[str, Any]:
        """Counters plus sizes, for /metrics and reports."""
        out: dict[str, Any] = dict(self.counters)
        out.update(
            copies=len(self),
            entries=self.distinct_hashes,
            workers=len(self._workers),
            adapters=self.live_adapters,
            table_bytes=sum(t.nbytes() for t in self._views if t is not None),
            table_paged_bytes=sum(t.paged_bytes() for t in self._views if t is not None),
        )
        return out


def _all_int64(hashes: list[int], prev: int | None) -> bool:
    """Every hash (and the parent) a plain int in int64 range (what the table can key)."""
    if type(hashes) is list and native.active():
        return native.all_int64(hashes, prev)
    for h in hashes:
        if type(h) is not int or not _I64_MIN <= h <= _I64_MAX:
            return False
    return prev is None or (type(prev) is int and _I64_MIN <= prev <= _I64_MAX)
