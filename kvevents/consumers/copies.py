"""One worker's block copies in a HashTable view: add and drop them, page by page or vectorised.

A copy is one bit (the worker's) in a mask column (its medium's, for its group of 64 workers). A
second copy of the same (view, medium, worker, hash), the same tokens under two extra keys, is
counted in `extra` instead, a dict that is empty in the common case. Small events take the scalar
table ops (a few us per page); long ones the vectorised ones (tens of us per call, ~1 us per
page). Callers reserve room in the table before storing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np

from kvevents import native
from kvevents.consumers.table import HAS_PARENT, HashTable

__all__ = ["WORD", "Extra", "store_each", "store_many", "remove_each", "remove_many", "clear_bits"]

WORD = 64  # workers per mask column

Extra = dict[tuple[int, int, int, int], int]  # (view, medium, worker, hash) -> copies beyond the bit


def _add_extra(extra: Extra, key: tuple[int, int, int, int]) -> None:
    extra[key] = extra.get(key, 0) + 1


def _take_extra(extra: Extra, key: tuple[int, int, int, int]) -> bool:
    """Drop one extra copy if there is one (a removal takes it before the bit)."""
    more = extra.get(key)
    if not more:
        return False
    if more == 1:
        del extra[key]
    else:
        extra[key] = more - 1
    return True


def store_each(
    t: HashTable, extra: Extra, vid: int, mi: int, col: int, wi: int, hashes: list[int], prev: int | None
) -> int:
    """Store page by page with the scalar table ops (later pages see earlier ones); returns duplicates."""
    dups = t.set_bits_each(hashes, col, 1 << (wi % WORD), prev)
    for h in dups:
        _add_extra(extra, (vid, mi, wi, h))
    return len(dups)


def store_many(
    t: HashTable, extra: Extra, vid: int, mi: int, col: int, wi: int, q: np.ndarray, prev: int | None
) -> int:
    """Store a long event of distinct hashes with the vectorised table ops; returns duplicates."""
    bit = np.uint64(1 << (wi % WORD))
    slots = t.find(q)
    missing = slots < 0
    if missing.any():
        slots[missing] = t.place(q[missing])
    colv = t.masks[:, col]
    cur = colv.take(slots)
    held = (cur & bit) != 0
    colv[slots] = cur | bit
    dup = int(np.count_nonzero(held))
    for h in q[held].tolist() if dup else ():
        _add_extra(extra, (vid, mi, wi, h))
    t.parent[slots[1:]] = q[:-1]
    t.state[slots[1:]] |= HAS_PARENT
    if prev is not None:
        t.parent[slots[0]] = prev
        t.state[slots[0]] |= HAS_PARENT
    return dup


def remove_each(
    views: list[HashTable],
    extra: Extra,
    mi: int,
    col: int,
    wi: int,
    hashes: list[int],
    prefer: int | None = None,
    exact: bool = False,
) -> tuple[int, int, int]:
    """Drop one copy per listed hash, in order (a repeated hash drops two); (unknown, ambiguous, removed).

    The copy goes from view `prefer` (the remove's lora_name) when that view holds it, else from
    the lowest view holding it. A hash several views hold is ambiguous unless `exact` (the remove
    named its adapter, or the worker names adapters on removes): which copy went is then known.
    """
    if native.active() and type(hashes) is list:
        unknown, ambiguous, removed, deleted = native.remove_each(
            [t.cview() for t in views], extra, mi, col, wi, hashes, prefer, exact
        )
        for t, d in zip(views, deleted):
            if d:
                t.note_deleted(d)
        return unknown, ambiguous, removed
    bit = 1 << (wi % WORD)
    unknown = ambiguous = removed = 0
    for h in hashes:
        holder: tuple[int, HashTable, int] | None = None
        several = False
        for vid, t in enumerate(views):
            s = t.find1(h)
            if s >= 0 and t.bit_set(s, col, bit):
                if holder is not None:
                    several = True
                    if holder[0] == prefer:
                        break
                if holder is None or vid == prefer:
                    holder = (vid, t, s)
                if several and prefer is None:
                    break
        if holder is None:
            unknown += 1
            continue
        if several and not (exact and holder[0] == prefer):
            ambiguous += 1
        removed += 1
        vid, t, s = holder
        if extra and _take_extra(extra, (vid, mi, wi, h)):
            continue  # an extra copy went; the bit stays
        t.clear_bit(s, col, bit)
    return unknown, ambiguous, removed


def remove_many(
    views: list[HashTable],
    extra: Extra,
    mi: int,
    col: int,
    wi: int,
    q: np.ndarray,
    prefer: int | None = None,
    exact: bool = False,
) -> tuple[int, int, int]:
    """`remove_each` for a long event of distinct hashes, vectorised; (unknown, ambiguous, removed)."""
    bit = np.uint64(1 << (wi % WORD))
    slots = [t.find(q) for t in views]
    held = np.array([(t.masks[:, col].take(s) & bit) != 0 for t, s in zip(views, slots)])  # (views, n)
    nheld = held.sum(0)
    unknown = int(np.count_nonzero(nheld == 0))
    first = held.argmax(0)  # the lowest view holding each hash
    several = nheld > 1
    if prefer is not None:
        mine_pref = held[prefer]
        first = np.where(mine_pref, prefer, first)  # the named adapter's copy goes where it is held
        if exact:
            several &= ~mine_pref
    for vid, t in enumerate(views):
        mine = held[vid] & (first == vid)
        if not mine.any():
            continue
        for i in np.flatnonzero(mine).tolist() if extra else ():
            if _take_extra(extra, (vid, mi, wi, int(q[i]))):
                mine[i] = False  # an extra copy went; the bit stays
        clear_bits(t, slots[vid][mine], col, bit)
    return unknown, int(np.count_nonzero(several)), len(q) - unknown


def clear_bits(t: HashTable, slots: np.ndarray, col: int, bit: np.uint64) -> None:
    """Clear one worker bit in `slots` of column `col`; rows left with no bit are deleted."""
    if not len(slots):
        return
    colv = t.masks[:, col]
    colv[slots] = colv.take(slots) & ~bit
    gone = slots[~t.masks.take(slots, axis=0).any(1)]
    if len(gone):
        t.delete(gone)


def iter_copies(
    views: list[HashTable], cols: dict[tuple[int, int], int], extra: Extra, wi: int | None, mi_only: int | None
) -> Iterator[tuple[int, int, int]]:
    """(worker index, hash, copies) for every held (worker, medium, view, hash); one worker (`wi`)
    and one medium index (`mi_only`) when given."""
    for vid, t in enumerate(views):
        live = t.live_slots()
        keys = t.keys[live]
        for (mi, word), col in cols.items():
            if (mi_only is not None and mi != mi_only) or (wi is not None and wi // WORD != word):
                continue
            colv = t.masks[live, col]
            present = int(np.bitwise_or.reduce(colv)) if len(colv) else 0
            for b in set_bits(present):
                i = word * WORD + b
                if wi is not None and i != wi:
                    continue
                for h in keys[((colv >> np.uint64(b)) & np.uint64(1)) != 0].tolist():
                    yield i, h, 1 + extra.get((vid, mi, i, h), 0)


def view_tally(views: list[HashTable], cols: dict[tuple[int, int], int], extra: Extra) -> Counter[tuple[int, int]]:
    """(view, worker index) -> copies held: one bit count per mask column and view, plus extras."""
    tally: Counter[tuple[int, int]] = Counter()
    for vid, t in enumerate(views):
        live = t.live_slots()
        if not len(live):
            continue
        for (_, word), col in cols.items():
            colv = t.masks[live, col]
            present = int(np.bitwise_or.reduce(colv)) if len(colv) else 0
            for b in set_bits(present):
                tally[(vid, word * WORD + b)] += int(np.count_nonzero(colv & np.uint64(1 << b)))
    for (vid, _, wi, _), n in extra.items():
        tally[(vid, wi)] += n
    return tally


def set_bits(mask: int) -> Iterator[int]:
    """Positions of the set bits of a non-negative int, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low
