"""One worker's block copies in HashTable views: add, drop and clear them, and count them.

A copy is one bit (the worker's) in a column (its medium's, for its group of WORD=32 workers) of
the entry's holders (kvevents.consumers.holders). A second copy of the same (view, medium, worker,
hash), the same tokens under two extra keys, is counted in `extra` instead, a dict that is empty
in the common case. The loops run compiled when kvevents.native is active (one C call per event),
else page by page in Python; both do the same writes. Callers reserve room in the table before
storing. Views are passed as (view id, table) pairs, lowest id first: only the views a worker holds
copies in need to be searched when it removes or clears.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np

from kvevents import native
from kvevents.consumers.holders import LOW, expand_rows
from kvevents.consumers.table import HashTable
from kvevents.native.layout import WORD

__all__ = ["WORD", "Extra", "store_each", "remove_each", "clear_worker", "iter_copies", "view_tally", "set_bits"]

Extra = dict[tuple[int, int, int, int], int]  # (view, medium, worker, hash) -> copies beyond the bit
Views = list[tuple[int, HashTable]]  # (view id, table), ascending ids


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
    """Store page by page (later pages see earlier ones); returns duplicates (extra copies)."""
    dups = t.set_bits_each(hashes, col, 1 << (wi % WORD), prev)
    for h in dups:
        _add_extra(extra, (vid, mi, wi, h))
    return len(dups)


def remove_each(
    views: Views,
    extra: Extra,
    mi: int,
    col: int,
    wi: int,
    hashes: list[int],
    prefer: int | None = None,
    exact: bool = False,
) -> tuple[int, int, list[int]]:
    """Drop one copy per listed hash, in order (a repeated hash drops two); (unknown, ambiguous,
    copies removed per listed view).

    The copy goes from view `prefer` (the remove's lora_name) when that view holds it, else from
    the lowest view holding it. A hash several views hold is ambiguous unless `exact` (the remove
    named its adapter, or the worker names adapters on removes): which copy went is then known.
    """
    if not views:  # the worker holds nothing
        return len(hashes), 0, []
    if native.active() and type(hashes) is list:
        return _remove_compiled(views, extra, mi, col, wi, hashes, prefer, exact)
    bit = 1 << (wi % WORD)
    unknown = ambiguous = 0
    removed = [0] * len(views)
    for h in hashes:
        holder: tuple[int, int, HashTable, int] | None = None  # (position, vid, table, slot)
        several = False
        for pos, (vid, t) in enumerate(views):
            s = t.find1(h)
            if s >= 0 and t.bit_set(s, col, bit):
                if holder is not None:
                    several = True
                    if holder[1] == prefer:
                        break
                if holder is None or vid == prefer:
                    holder = (pos, vid, t, s)
                if several and prefer is None:
                    break
        if holder is None:
            unknown += 1
            continue
        pos, vid, t, s = holder
        if several and not (exact and vid == prefer):
            ambiguous += 1
        removed[pos] += 1
        if extra and _take_extra(extra, (vid, mi, wi, h)):
            continue  # an extra copy went; the bit stays
        t.clear_bit(s, col, bit)
    return unknown, ambiguous, removed


def _remove_compiled(
    views: Views, extra: Extra, mi: int, col: int, wi: int, hashes: list[int], prefer: int | None, exact: bool
) -> tuple[int, int, list[int]]:
    """remove_each's compiled loop; where it stopped because a shared record's copy did not fit a
    pool, that pool grows and the loop goes on from there (as the Python twin's alloc grows it)."""
    unknown = ambiguous = 0
    removed = [0] * len(views)
    start = 0
    while True:
        u, a, rem, deleted, stop, stop_view, need = native.remove_each(
            [t.cview() for _, t in views], [v for v, _ in views], extra, mi, col, wi, hashes[start:], prefer, exact
        )
        unknown, ambiguous = unknown + u, ambiguous + a
        for pos, ((_, t), r, d) in enumerate(zip(views, rem, deleted)):
            removed[pos] += r
            if d:
                t.note_deleted(d)
        if stop < 0:
            return unknown, ambiguous, removed
        start += stop
        views[stop_view][1].pool.grow(need)


def clear_worker(t: HashTable, cols: list[int], bit: int) -> int:
    """Clear one worker's `bit` in each of `cols` in every slot of `t`, slot by slot (slots left
    with no holder are deleted); returns the bits cleared."""
    if native.active():
        cleared, deleted = native.clear_worker(t.cview(), cols, bit)
        t.note_deleted(deleted)
        return int(cleared)
    live = t.live_slots()
    rows = t.rows[live]
    which, pairs = expand_rows(rows, t.pool)
    hit = np.isin(pairs >> np.uint64(32), np.array(cols, np.uint64)) & ((pairs & np.uint64(bit)) != 0)
    cleared = 0
    for s in np.unique(live[which[hit]]).tolist():
        for col in cols:
            cleared += t.clear_bit_every(s, col, bit)
    return cleared


def _pairs(t: HashTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keys, columns, bits) of every pair of every live slot of `t`, grouped by column."""
    live = t.live_slots()
    which, pairs = expand_rows(t.rows[live], t.pool)
    cols = (pairs >> np.uint64(32)).astype(np.int64)
    order = np.argsort(cols, kind="stable")
    return t.keys[live[which[order]]], cols[order], pairs[order] & np.uint64(LOW)


def _by_column(cols: np.ndarray) -> Iterator[tuple[int, int, int]]:
    """(column, start, stop) of each run of a sorted column array."""
    if not len(cols):
        return
    cuts = np.flatnonzero(np.diff(cols)) + 1
    starts = np.concatenate([[0], cuts]).tolist()
    stops = np.concatenate([cuts, [len(cols)]]).tolist()
    for a, b in zip(starts, stops):
        yield int(cols[a]), a, b


def iter_copies(
    views: Views, cols: dict[tuple[int, int], int], extra: Extra, wi: int | None, mi_only: int | None
) -> Iterator[tuple[int, int, int]]:
    """(worker index, hash, copies) for every held (worker, medium, view, hash); one worker (`wi`)
    and one medium index (`mi_only`) when given."""
    owner = {col: key for key, col in cols.items()}  # column -> (medium index, worker word)
    for vid, t in views:
        keys, pcols, bits = _pairs(t)
        for col, a, b in _by_column(pcols):
            mi, word = owner[col]
            if (mi_only is not None and mi != mi_only) or (wi is not None and wi // WORD != word):
                continue
            colv = bits[a:b]
            present = int(np.bitwise_or.reduce(colv))
            for bb in set_bits(present):
                i = word * WORD + bb
                if wi is not None and i != wi:
                    continue
                for h in keys[a:b][((colv >> np.uint64(bb)) & np.uint64(1)) != 0].tolist():
                    yield i, h, 1 + extra.get((vid, mi, i, h), 0)


def view_tally(views: Views, cols: dict[tuple[int, int], int], extra: Extra) -> Counter[tuple[int, int]]:
    """(view, worker index) -> copies held: one bit count per column and view, plus extras."""
    owner = {col: key for key, col in cols.items()}
    tally: Counter[tuple[int, int]] = Counter()
    for vid, t in views:
        _, pcols, bits = _pairs(t)
        for col, a, b in _by_column(pcols):
            word = owner[col][1]
            colv = bits[a:b]
            for bb in set_bits(int(np.bitwise_or.reduce(colv))):
                tally[(vid, word * WORD + bb)] += int(np.count_nonzero(colv & np.uint64(1 << bb)))
    for (vid, _, wi, _), n in extra.items():
        tally[(vid, wi)] += n
    return tally


def set_bits(mask: int) -> Iterator[int]:
    """Positions of the set bits of a non-negative int, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low
