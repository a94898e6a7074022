"""The publisher's compact view of live block copies, and the snapshot batches rebuilt from it.

Updated from every published batch (schemas/README.md, snapshots under "Transport in one page"). A live block is just a reference to the
BlockStored event that announced it (its page index is found again when a snapshot is built), so
a stored event costs one C-level dict update and allocates nothing the garbage collector must
track. Events must not be mutated after they are published.
"""

from __future__ import annotations

from collections import Counter
from itertools import repeat
from typing import Iterable, Iterator, Sequence

from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, Event

__all__ = ["LiveView", "FrozenView", "snapshot_batches"]

_UNSET = object()
_SMALL = 16  # events with more pages get a hash -> index map when a snapshot needs it


class FrozenView:
    """An immutable copy of a LiveView taken at one seq (what a snapshot serves)."""

    __slots__ = ("media", "extra")

    def __init__(
        self,
        media: list[tuple[str | None, dict[int, BlockStored]]],
        extra: list[tuple[str | None, int, BlockStored]],
    ) -> None:
        self.media = media
        self.extra = extra

    def __len__(self) -> int:
        return sum(len(m) for _, m in self.media) + len(self.extra)


class LiveView:
    """Live block copies per (medium, hash); a second copy of a hash is kept aside and counted.

    `apply` is the publisher's hot path (~100 ns per single-page event): one loop of plain dict
    operations, no method calls for single-page events; copies and multi-page events take the slow
    branches. A single page is taken by unpacking `(h,) = block_hashes` (~4 ns, against ~17 ns for a
    len() test); a failed unpacking raises (~320 ns), so after the first multi-page event of a kind
    the view tests len() for that kind first. Measured and not kept (slower): a method call for each
    multi-page remove (+3% with a quarter of the events 3 pages long), the page list kept in a local
    (~+2%), C-level passes over the batch (set(map(type, ...)), dict.update(zip(...)) cost 13-38 ns
    per event each) and folding a bounded list of pending batches in bulk.
    """

    __slots__ = ("_media", "_extra", "page_size", "_paged_stores", "_paged_removes")

    def __init__(self) -> None:
        self._media: dict[str | None, dict[int, BlockStored]] = {}
        self._extra: dict[tuple[str | None, int], list[BlockStored]] = {}
        self.page_size: int | None = None
        # Set for good once a stored / removed event with other than one page is seen: from then on
        # that kind's page count is tested with len() instead of caught by a failed unpacking.
        self._paged_stores = False
        self._paged_removes = False

    def __len__(self) -> int:
        return sum(len(m) for m in self._media.values()) + sum(len(v) for v in self._extra.values())

    def apply(self, events: Iterable[Event]) -> None:  # noqa: C901 - the measured hot path: one loop (class docstring)
        """Fold one batch's events into the view: stores add copies, removes drop one copy each."""
        media, extra = self._media, self._extra
        paged_stores, paged_removes = self._paged_stores, self._paged_removes
        cur: object = _UNSET
        m: dict[int, BlockStored] = {}
        last_stored = None
        for ev in events:
            t = ev.__class__
            if t is BlockStored:
                md = ev.medium  # type: ignore[union-attr]
                if md is not cur:
                    cur, m = md, media.get(md) or media.setdefault(md, {})
                last_stored = ev
                if paged_stores and len(ev.block_hashes) != 1:  # type: ignore[union-attr]
                    self._store_many(m, md, ev.block_hashes, ev)  # type: ignore[arg-type, union-attr]
                    continue
                try:
                    (h,) = ev.block_hashes  # type: ignore[union-attr]
                except ValueError:
                    paged_stores = self._first_paged_store(m, md, ev)  # type: ignore[arg-type]
                    continue
                if h in m:
                    extra.setdefault((md, h), []).append(ev)  # type: ignore[arg-type]
                else:
                    m[h] = ev  # type: ignore[assignment]
            elif t is BlockRemoved:
                md = ev.medium  # type: ignore[union-attr]
                if md is not cur:
                    cur, m = md, media.get(md) or media.setdefault(md, {})
                if extra:
                    self._remove_copies(m, md, ev.block_hashes, ev.lora_name)  # type: ignore[arg-type, union-attr]
                    continue
                if paged_removes and len(ev.block_hashes) != 1:  # type: ignore[union-attr]
                    for h in ev.block_hashes:  # type: ignore[union-attr]
                        if h in m:
                            del m[h]
                    continue
                try:
                    (h,) = ev.block_hashes  # type: ignore[union-attr]
                except ValueError:
                    paged_removes = self._first_paged_remove(m, md, ev)  # type: ignore[arg-type]
                    continue
                if h in m:
                    del m[h]
            elif t is AllBlocksCleared:
                self._clear()
        if last_stored is not None:
            self.page_size = last_stored.block_size  # type: ignore[union-attr]

    def _clear(self) -> None:
        """AllBlocksCleared: every medium's live copies and every extra copy go."""
        for m in self._media.values():
            m.clear()
        self._extra.clear()

    def _first_paged_store(self, m: dict[int, BlockStored], md: str | None, ev: BlockStored) -> bool:
        """The view's first multi-page store: stored off the fast path; len() tests stores from now on."""
        self._paged_stores = True
        self._store_many(m, md, ev.block_hashes, ev)
        return True

    def _first_paged_remove(self, m: dict[int, BlockStored], md: str | None, ev: BlockRemoved) -> bool:
        """The view's first multi-page remove: done off the fast path; len() tests removes from now on."""
        self._paged_removes = True
        self._remove_copies(m, md, ev.block_hashes, ev.lora_name)
        return True

    def _store_many(self, m: dict[int, BlockStored], md: str | None, hs: list[int], ev: BlockStored) -> None:
        """A multi-page store: one C-level update when no page is live yet, else page by page."""
        if m.keys().isdisjoint(hs):
            n0 = len(m)
            m.update(zip(hs, repeat(ev)))
            if len(m) - n0 == len(hs):
                return
            for h, k in Counter(hs).items():  # a hash repeated inside the event: extra copies
                if k > 1:
                    self._extra.setdefault((md, h), []).extend([ev] * (k - 1))
            return
        for h in hs:
            if h in m:
                self._extra.setdefault((md, h), []).append(ev)
            else:
                m[h] = ev

    def _remove_copies(self, m: dict[int, BlockStored], md: str | None, hs: list[int], lora: str | None) -> None:
        """Removes while some hash has extra copies: the copy stored under the remove's lora_name
        goes (the newest such), else an extra copy; the first copy is replaced by an extra one."""
        extra = self._extra
        for h in hs:
            copies = extra.get((md, h))
            if not copies:
                if h in m:
                    del m[h]
                continue
            j = len(copies) - 1  # the newest extra copy, unless the remove names another adapter's
            if lora is not None and copies[j].lora_name != lora:
                named = [k for k in range(len(copies)) if copies[k].lora_name == lora]
                if named:
                    j = named[-1]
                elif m[h].lora_name == lora:  # the first copy is the named one: an extra takes its place
                    m[h] = copies.pop()
                    j = -1
            if j >= 0:
                copies.pop(j)
            if not copies:
                del extra[(md, h)]

    def freeze(self) -> FrozenView:
        """A consistent copy (call it under the publisher's lock; events are never mutated)."""
        media = [(medium, dict(m)) for medium, m in self._media.items() if m]
        extra = [(medium, h, ev) for (medium, h), evs in self._extra.items() for ev in evs]
        return FrozenView(media, extra)


class _Index:
    """Page index of a hash inside its announcing event (cached for long events)."""

    def __init__(self) -> None:
        self._maps: dict[int, dict[int, int]] = {}

    def __call__(self, ev: BlockStored, h: int) -> int:
        hs = ev.block_hashes
        if len(hs) <= _SMALL:
            return hs.index(h)
        mp = self._maps.get(id(ev))
        if mp is None:
            mp = self._maps[id(ev)] = {x: i for i, x in reversed(list(enumerate(hs)))}
        return mp[h]


def _parent(ev: BlockStored, i: int) -> int | None:
    return ev.parent_block_hash if i == 0 else ev.block_hashes[i - 1]


def _ordered(view: FrozenView, index: _Index) -> Iterator[tuple[str | None, int, BlockStored, int]]:
    """Every live copy as (medium, hash, event, page index), each parent before its children."""
    for medium, m in view.media:
        done: set[int] = set()
        for h, ev in m.items():
            if h in done:
                continue
            i = index(ev, h)
            chain = [(h, ev, i)]
            seen = {h}
            p = _parent(ev, i)
            while p is not None and p in m and p not in done and p not in seen:
                seen.add(p)
                pev = m[p]
                pi = index(pev, p)
                chain.append((p, pev, pi))
                p = _parent(pev, pi)
            for h2, ev2, i2 in reversed(chain):
                done.add(h2)
                yield medium, h2, ev2, i2
    for medium, h, ev in view.extra:  # their parents (the first copies) are already out
        yield medium, h, ev, index(ev, h)


def snapshot_batches(view: FrozenView, blocks_per_batch: int = 512) -> Iterator[list[Event]]:
    """Event lists rebuilding `view`: the first starts with AllBlocksCleared; chains are re-joined."""
    batch: list[Event] = [AllBlocksCleared()]
    nblocks = 0
    cur: BlockStored | None = None
    cur_key: tuple | None = None
    for medium, h, ev, i in _ordered(view, _Index()):
        bs = ev.block_size
        toks: Sequence[int] = ev.token_ids[i * bs : (i + 1) * bs]
        parent = _parent(ev, i)
        key = (medium, bs, ev.lora_id, ev.lora_name, ev.cache_salt, ev.session_id)
        if cur is not None and key == cur_key and parent == cur.block_hashes[-1] and nblocks < blocks_per_batch:
            cur.block_hashes.append(h)
            cur.token_ids.extend(toks)
        else:
            if nblocks >= blocks_per_batch:
                yield batch
                batch, nblocks = [], 0
            cur = BlockStored(
                [h], parent, list(toks), bs, ev.lora_id, medium, ev.lora_name, ev.cache_salt, ev.session_id
            )
            cur_key = key
            batch.append(cur)
        nblocks += 1
    yield batch
