"""BlockIndex: which worker holds which published block, reference-counted and memory-lean.

Layout (why it is small and fast): one dict per interned lora_name ("view") maps an int64 block
hash to one packed int, a bitmask with one bit per (medium, worker) placed medium-major
(bit = medium_index * stride + worker_index), interned so equal masks are one object. A copy is
one bit, not an object; a second copy of the same (worker, dp_rank, medium, lora, hash) (the same
tokens under two extra keys) is counted in a small side dict that is empty in the common case. Parent links live in one dict shared by
all copies (a hash's parent is a property of the chain, not of the copy). The router reads the
views directly: one dict lookup per page.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

__all__ = ["BlockIndex", "WorkerKey", "worker_label", "FIXED_MEDIA"]

#: Media with fixed bit groups (GPU first so the common device-only index keeps small masks).
FIXED_MEDIA: tuple[str, ...] = ("GPU", "CPU_PINNED", "STORAGE")
_MIN_STRIDE = 64
_INTERN_MAX = 1 << 16  # distinct masks shared by all entries (memory, and a hot set for lookups)

WorkerKey = tuple[str, int]


def worker_label(source: str, dp_rank: int) -> str:
    """The name a worker is reported under: the source, with `#dp<r>` for data-parallel ranks > 0."""
    return source if dp_rank == 0 else f"{source}#dp{dp_rank}"


@dataclass
class _Worker:
    index: int
    source: str
    dp_rank: int
    label: str


class BlockIndex:
    """Reference-counted map of published block copies per (source, dp_rank, medium, hash).

    `apply(source, batch)` never raises for content it cannot use: it counts the reason in
    `counters` (unknown_remove, unknown_parent, ambiguous_remove, ignored_event, ...).
    Not thread-safe: callers that apply and query from different threads hold one lock.
    """

    def __init__(self) -> None:
        self._stride = _MIN_STRIDE
        self._media: list[str | None] = list(FIXED_MEDIA)
        self._medium_ix: dict[str | None, int] = {m: i for i, m in enumerate(self._media)}
        self._loras: list[str | None] = [None]
        self._lora_ix: dict[str | None, int] = {None: 0}
        self._views: list[dict[int, int]] = [{}]
        self._parents: dict[int, int] = {}
        self._extra: dict[tuple[int, int, int, int], int] = {}  # (view, medium, worker, hash) -> copies - 1
        self._intern: dict[int, int] = {}
        self._workers: dict[WorkerKey, _Worker] = {}
        self._by_index: dict[int, _Worker] = {}
        self._free: list[int] = []
        self._counts: Counter[tuple[int, int]] = Counter()  # (worker index, medium index) -> copies
        self._medium_copies: list[int] = [0] * len(self._media)  # medium index -> copies (router)
        self._all_workers = 0  # one bit per known worker index (router)
        self._lora_sources: set[int] = set()  # workers that ever published a lora_name
        self._plans: dict[tuple[str | None, bool], list[tuple[dict[int, int], int]]] = {}  # router cache
        self.counters: Counter[str] = Counter()

    # ---------------------------------------------------------------- workers and media

    def _worker(self, source: str, dp_rank: int) -> _Worker:
        key = (source, dp_rank)
        w = self._workers.get(key)
        if w is None:
            idx = self._free.pop() if self._free else len(self._by_index)
            if idx >= self._stride:
                self._restride(self._stride * 2)
            w = _Worker(idx, source, dp_rank, worker_label(source, dp_rank))
            self._workers[key] = w
            self._by_index[idx] = w
            self._all_workers |= 1 << idx
            self._plans.clear()
        return w

    def _medium(self, medium: str | None) -> int:
        mi = self._medium_ix.get(medium)
        if mi is None:
            mi = len(self._media)
            self._media.append(medium)
            self._medium_ix[medium] = mi
            self._medium_copies.append(0)
            self._plans.clear()
        return mi

    def _view_id(self, lora_name: str | None) -> int:
        vid = self._lora_ix.get(lora_name)
        if vid is None:
            vid = len(self._loras)
            self._loras.append(lora_name)
            self._lora_ix[lora_name] = vid
            self._views.append({})
            self._plans.clear()
        return vid

    def _restride(self, stride: int) -> None:
        """Re-pack every mask with a wider per-medium group (only when workers exceed the stride)."""
        old, n_media = self._stride, len(self._media)
        low = (1 << old) - 1
        for view in self._views:
            for h, v in view.items():
                nv = 0
                for mi in range(n_media):
                    nv |= ((v >> (mi * old)) & low) << (mi * stride)
                view[h] = nv
        self._stride = stride
        self._intern.clear()
        self._plans.clear()

    def _worker_bits(self, wi: int) -> int:
        bits = 0
        for mi in range(len(self._media)):
            bits |= 1 << (mi * self._stride + wi)
        return bits

    # ---------------------------------------------------------------- applying events

    def apply(self, source: str, batch: KVEventBatch) -> None:
        """Apply one decoded batch from `source` (its dp rank comes from the batch)."""
        rank = batch.data_parallel_rank
        w = self._worker(source, rank if isinstance(rank, int) and rank >= 0 else 0)
        self.counters["batches"] += 1
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

    def _store(self, w: _Worker, ev: BlockStored) -> None:
        hashes = ev.block_hashes
        if not hashes:
            self.counters["empty_store"] += 1
            return
        wi = w.index
        lora = ev.lora_name
        if lora is not None and wi not in self._lora_sources:
            self._lora_sources.add(wi)
            self._plans.clear()
        vid = self._lora_ix.get(lora)
        if vid is None:
            vid = self._view_id(lora)
        view = self._views[vid]
        mi = self._medium_ix.get(ev.medium)
        if mi is None:
            mi = self._medium(ev.medium)
        bit = 1 << (mi * self._stride + wi)
        prev = ev.parent_block_hash
        if prev is not None and not self._holds(wi, prev):
            self.counters["unknown_parent"] += 1
        parents = self._parents
        intern = self._intern
        get = view.get
        dup = 0
        for h in hashes:
            v = get(h, 0)
            if v & bit:
                key = (vid, mi, wi, h)
                self._extra[key] = self._extra.get(key, 0) + 1
                dup += 1
            else:
                view[h] = intern.setdefault(v | bit, v | bit)
            if prev is not None:
                parents[h] = prev
            prev = h
        if len(intern) > _INTERN_MAX:
            intern.clear()  # masks stay valid; only the sharing of equal ones restarts
        n = len(hashes)
        self._counts[(wi, mi)] += n
        self._medium_copies[mi] += n
        self.counters["stored_copies"] += n
        if dup:
            self.counters["duplicate_copies"] += dup

    def _holds(self, wi: int, h: int) -> bool:
        """True if worker `wi` holds a copy of `h` on any medium, under any lora_name."""
        bits = self._worker_bits(wi)
        for view in self._views:
            if view.get(h, 0) & bits:
                return True
        return False

    def _remove(self, w: _Worker, ev: BlockRemoved) -> None:
        wi = w.index
        mi = self._medium_ix.get(ev.medium)
        if mi is None:
            self.counters["unknown_remove"] += len(ev.block_hashes)
            return
        bit = 1 << (mi * self._stride + wi)
        views = self._views
        extra = self._extra
        removed = 0
        for h in ev.block_hashes:
            holders = [vid for vid, view in enumerate(views) if view.get(h, 0) & bit]
            if not holders:
                self.counters["unknown_remove"] += 1
                continue
            if len(holders) > 1:
                # BlockRemoved carries no lora_name: which adapter's copy went is unknowable.
                self.counters["ambiguous_remove"] += 1
            vid = holders[0]
            removed += 1
            key = (vid, mi, wi, h)
            more = extra.get(key)
            if more:
                if more == 1:
                    del extra[key]
                else:
                    extra[key] = more - 1
                continue
            self._clear_bit(vid, h, bit)
        if removed:
            self._counts[(wi, mi)] -= removed
            self._medium_copies[mi] -= removed
            self.counters["removed_copies"] += removed

    def _clear_bit(self, vid: int, h: int, bits: int) -> None:
        view = self._views[vid]
        v = view[h] & ~bits
        if v:
            view[h] = self._intern.setdefault(v, v)
            return
        del view[h]
        if h in self._parents:
            for other in self._views:
                if h in other:
                    return
            del self._parents[h]

    def _clear_worker(self, w: _Worker) -> int:
        """Drop every copy the worker holds, on every medium and lora; returns copies dropped."""
        wi = w.index
        dropped = sum(n for (i, _), n in self._counts.items() if i == wi)
        if not dropped and not any(k[2] == wi for k in self._extra):
            return 0
        bits = self._worker_bits(wi)
        for vid, view in enumerate(self._views):
            held = [h for h, v in view.items() if v & bits]
            for h in held:
                self._clear_bit(vid, h, bits)
        for ekey in [k for k in self._extra if k[2] == wi]:
            del self._extra[ekey]
        for ckey in [k for k in self._counts if k[0] == wi]:
            self._medium_copies[ckey[1]] -= self._counts.pop(ckey)
        self.counters["dropped_copies"] += dropped
        return dropped

    def drop_source(self, source: str, dp_rank: int | None = None, *, forget: bool = False) -> int:
        """Forget a source's blocks (all its dp ranks unless one is given), e.g. on restart or resync.

        The worker stays known (listed with zero blocks) unless `forget` is true.
        Returns the number of block copies dropped.
        """
        dropped = 0
        for key, w in list(self._workers.items()):
            if key[0] != source or (dp_rank is not None and key[1] != dp_rank):
                continue
            dropped += self._clear_worker(w)
            if forget:
                del self._workers[key]
                del self._by_index[w.index]
                self._all_workers &= ~(1 << w.index)
                self._lora_sources.discard(w.index)
                self._plans.clear()
                self._free.append(w.index)
        self.counters["dropped_sources"] += 1
        return dropped

    # ---------------------------------------------------------------- queries

    def workers(self) -> list[str]:
        """Labels of every known worker, in registration order."""
        return [w.label for w in self._workers.values()]

    def workers_for(self, block_hash: int, medium: str | None = None) -> set[str]:
        """Labels of the workers holding at least one copy of `block_hash` (on `medium` if given)."""
        mask = 0
        for view in self._views:
            mask |= view.get(block_hash, 0)
        if medium is not None:
            mi = self._medium_ix.get(medium)
            if mi is None:
                return set()
            mask = (mask >> (mi * self._stride)) & ((1 << self._stride) - 1)
        else:
            mask = self._fold(mask)
        return {self._by_index[i].label for i in _bits(mask)}

    def parent_of(self, block_hash: int) -> int | None:
        """The parent hash recorded for `block_hash` (None for a chain head or an unknown hash)."""
        return self._parents.get(block_hash)

    def has(self, block_hash: int) -> bool:
        return any(block_hash in view for view in self._views)

    def _fold(self, mask: int) -> int:
        """Collapse a medium-major mask into one bit per worker (held on any medium)."""
        s, low, out = self._stride, (1 << self._stride) - 1, 0
        while mask:
            out |= mask & low
            mask >>= s
        return out

    def _iter_copies(self, wi: int | None = None, medium: str | None = None) -> Iterator[tuple[int, int, int]]:
        """Yield (worker index, hash, copies) for every held (worker, medium, lora, hash)."""
        s = self._stride
        extra = self._extra
        media = range(len(self._media)) if medium is None else [self._medium_ix.get(medium, -1)]
        for vid, view in enumerate(self._views):
            for h, v in view.items():
                for mi in media:
                    if mi < 0:
                        continue
                    group = (v >> (mi * s)) & ((1 << s) - 1)
                    for i in _bits(group):
                        if wi is None or i == wi:
                            yield i, h, 1 + extra.get((vid, mi, i, h), 0)

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

    def block_counts(self) -> dict[str, dict[str, int]]:
        """Per worker label: medium -> copies held (media with zero copies omitted)."""
        out: dict[str, dict[str, int]] = {w.label: {} for w in self._workers.values()}
        for (wi, mi), n in self._counts.items():
            if n:
                out[self._by_index[wi].label][str(self._media[mi])] = n
        return out

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

    def __len__(self) -> int:
        """Number of block copies held (all workers, media, lora names)."""
        return sum(self._counts.values())

    @property
    def distinct_hashes(self) -> int:
        """Number of (lora_name, hash) entries: the dict entries the index pays for."""
        return sum(len(v) for v in self._views)

    def stats(self) -> dict[str, Any]:
        """Counters plus sizes, for /metrics and reports."""
        out: dict[str, Any] = dict(self.counters)
        out.update(copies=len(self), entries=self.distinct_hashes, workers=len(self._workers))
        return out

    # ---------------------------------------------------------------- router support (same package)

    def _lookup_plan(self, lora_name: str | None, strict: bool) -> list[tuple[dict[int, int], int]]:
        """(view, worker-bit filter) pairs whose OR gives a page's mask for a request (cached).

        Strict: copies stored under the request's lora_name, plus lora-less copies of workers
        that never published a lora_name (their events cannot tell adapters apart).
        """
        key = (lora_name, strict)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._make_plan(lora_name, strict)
        return plan

    def _make_plan(self, lora_name: str | None, strict: bool) -> list[tuple[dict[int, int], int]]:
        if not strict:
            return [(view, -1) for view in self._views]
        plan: list[tuple[dict[int, int], int]] = []
        vid = self._lora_ix.get(lora_name)
        if vid is not None:
            plan.append((self._views[vid], -1))
        if lora_name is not None:
            blind = [w.index for w in self._workers.values() if w.index not in self._lora_sources]
            if blind:
                filt = 0
                for wi in blind:
                    filt |= self._worker_bits(wi)
                plan.append((self._views[0], filt))
        return plan


def _bits(mask: int) -> Iterable[int]:
    """Positions of the set bits of a non-negative int, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low
