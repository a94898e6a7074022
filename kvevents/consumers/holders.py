"""Who holds one table entry: a slot's `rows` word and the record pool behind it (pure-Python twin).

Why not a bitmask as wide as the fleet: a block is usually held by a few workers, so an entry costs
what its holders take, not what the fleet is. A holder is one bit (its worker's) in a *pair*
`col << 32 | bits`: a column is (medium, group of WORD=32 workers), `bits` its workers' bits. A
slot's `rows` word (kvevents/native/layout.py) is 0, one inline pair (every holder in one column:
no memory beyond the slot), or `ROW_REF | cls << 56 | offset` of a record in the table's `Pool`: a header
`shares << 40 | len << 8 | cls` and `len` pairs with distinct columns, in the order they came (a pair
that loses its last bit takes the last pair's place; a record left with one pair goes back inline and
is freed). Records come in classes of `POOL_MIN_WORDS << cls` words, grown one class when full, freed
blocks kept per class for reuse.

Why shared records: consecutive pages of a chain are mostly held by the same workers, so a store whose
result would equal the previous page's record names that record instead (`shares` counts the slots
beyond the first). A lookup then recognises an unchanged page from its rows word alone, without
reading a record. A write to a shared record copies it first (copy on write), except clear_worker's,
which every sharer undergoes alike: the record changes in place once, for all of them. The compiled
twins (kvevents/native/_holders.h) do exactly the same writes in the same order, so both leave
identical arrays.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from kvevents.consumers.paged import is_paged, zeros_paged
from kvevents.native.layout import (
    PMETA_FREE,
    PMETA_IN_USE,
    PMETA_TOP,
    POOL_CLASSES,
    POOL_MIN_WORDS,
    REC_SHARES_SHIFT,
    ROW_CLS_SHIFT,
    ROW_REF,
)

__all__ = [
    "Pool",
    "LOW",
    "OFFSET",
    "ref",
    "row_bits",
    "set_bit",
    "clear_bit",
    "settle_inline",
    "row_pairs",
    "expand_rows",
    "POOL_START",
]

LOW = 0xFFFFFFFF  # a pair's bits
POOL_START = 64  # words of a new table's pool
_CLS = 0xFF
OFFSET = (1 << ROW_CLS_SHIFT) - 1  # a record's offset in its rows word
_ONE_SHARE = 1 << REC_SHARES_SHIFT
_SHARES_MAX = (1 << 24) - 1  # slots beyond the first that may name one record


def ref(o: int, cls: int) -> int:
    """The rows word naming the record of class `cls` at pool offset `o`."""
    return ROW_REF | cls << ROW_CLS_SHIFT | o


class Pool:
    """A table's record pool: `words` (uint64) and `meta` (int64: bump pointer, words in use, one
    free-list head per class). Word 0 is never a record, so offset 0 means "none"."""

    __slots__ = ("words", "meta", "wv", "mv", "_changed")

    def __init__(self, changed: Callable[[], None]) -> None:
        """`changed` is called whenever `words` is replaced (the table's compiled view goes stale)."""
        self._changed = changed
        self.words = zeros_paged(POOL_START, np.uint64)
        self.meta = np.zeros(PMETA_FREE + POOL_CLASSES, np.int64)
        self.meta[PMETA_TOP] = 1
        self.wv = self.words.data
        self.mv = self.meta.data

    def grow(self, need: int) -> None:
        """Room for at least `need` more words past the bump pointer (the compiled loops stop and
        ask for this when a record does not fit; the Python ones call it from `alloc`)."""
        n = len(self.words)
        size = max(POOL_START, self.mv[PMETA_TOP] + need, n + n // 2)
        size = -(-size // 64) * 64
        grown = zeros_paged(size, np.uint64)
        grown[:n] = self.words
        self.words = grown
        self.wv = grown.data
        self._changed()

    def alloc(self, cls: int) -> int:
        """A block of class `cls` (its header says cls, length 0): a freed one, else a fresh one."""
        if cls >= POOL_CLASSES:
            raise ValueError("holders: a record past the largest pool class")
        mv, size = self.mv, POOL_MIN_WORDS << cls
        o = mv[PMETA_FREE + cls]
        if o:
            mv[PMETA_FREE + cls] = self.wv[o + 1]
        else:
            o = mv[PMETA_TOP]
            if o + size > len(self.words):
                self.grow(size)
            mv[PMETA_TOP] = o + size
        mv[PMETA_IN_USE] += size
        self.wv[o] = cls
        return o

    def free(self, o: int) -> None:
        """Give the block at `o` back to its class's free list."""
        wv, mv = self.wv, self.mv
        cls = wv[o] & _CLS
        wv[o] = cls
        wv[o + 1] = mv[PMETA_FREE + cls]
        mv[PMETA_FREE + cls] = o
        mv[PMETA_IN_USE] -= POOL_MIN_WORDS << cls

    def nbytes(self) -> int:
        return int(self.words.nbytes + self.meta.nbytes)

    def paged_bytes(self) -> int:
        return int(self.words.nbytes) if is_paged(self.words) else 0


def row_bits(r: int, pool: Pool, col: int) -> int:
    """The bits of column `col` in rows word `r` (0: none of its workers)."""
    if r < ROW_REF:
        return r & LOW if r and r >> 32 == col else 0
    o = r & OFFSET
    wv = pool.wv
    for i in range(o + 1, o + 1 + (wv[o] >> 8 & LOW)):
        p = wv[i]
        if p >> 32 == col:
            return p & LOW
    return 0


def row_pairs(r: int, pool: Pool) -> list[int]:
    """The pairs of rows word `r`, in record order."""
    if r < ROW_REF:
        return [r] if r else []
    o = r & OFFSET
    return pool.wv[o + 1 : o + 1 + (pool.wv[o] >> 8 & LOW)].tolist()


def _release(pool: Pool, o: int) -> None:
    """One slot fewer names the record at `o`: its shares down by one, or the block freed."""
    if pool.wv[o] >> REC_SHARES_SHIFT:
        pool.wv[o] -= _ONE_SHARE
    else:
        pool.free(o)


def _is_record(pool: Pool, pw: int, old: list[int], at: int, pair: int) -> bool:
    """Is `pw` (the previous page's rows word) a record, not shared to the limit, whose pairs are
    `old` with `pair` OR-ed into old[at] (at >= 0) or appended (at < 0)?"""
    if pw < ROW_REF:
        return False
    wv, o = pool.wv, pw & OFFSET
    n = len(old)
    head = wv[o]
    if head >> 8 & LOW != n + (at < 0) or head >> REC_SHARES_SHIFT >= _SHARES_MAX:
        return False
    want = list(old)
    if at >= 0:
        want[at] |= pair
    else:
        want.append(pair)
    return wv[o + 1 : o + 1 + len(want)].tolist() == want


def _share(rv: memoryview, pool: Pool, s: int, pw: int) -> None:
    pool.wv[pw & OFFSET] += _ONE_SHARE
    rv[s] = pw


def set_bit(rv: memoryview, pool: Pool, s: int, col: int, bit: int, pw: int = 0) -> bool:
    """Set `bit` of column `col` in slot `s`'s holders; True if it was set already (an extra copy).
    `pw` is the rows word of the page before in the chain (0: none), whose record `s` names when
    the result would equal it."""
    r = rv[s]
    pair = col << 32 | bit
    if not r:
        rv[s] = pair
        return False
    if r < ROW_REF:
        if r >> 32 == col:
            if r & bit:
                return True
            rv[s] = r | bit
            return False
        if _is_record(pool, pw, [r], -1, pair):
            _share(rv, pool, s, pw)
            return False
        o = pool.alloc(0)  # a second column: the row moves to a record
        wv = pool.wv
        wv[o] = 2 << 8
        wv[o + 1] = r
        wv[o + 2] = pair
        rv[s] = ref(o, 0)
        return False
    o = r & OFFSET
    wv = pool.wv
    head = wv[o]
    n = head >> 8 & LOW
    old = wv[o + 1 : o + 1 + n].tolist()
    at = next((i for i, p in enumerate(old) if p >> 32 == col), -1)
    if at >= 0 and old[at] & bit:
        return True
    if _is_record(pool, pw, old, at, pair):
        _share(rv, pool, s, pw)
        _release(pool, o)
        return False
    shared = head >> REC_SHARES_SHIFT != 0
    cls = head & _CLS
    if at >= 0 and not shared:
        wv[o + 1 + at] = old[at] | bit
        return False
    n2 = n + (at < 0)
    if not shared and n2 < POOL_MIN_WORDS << cls:
        wv[o + 1 + n] = pair
        wv[o] = n2 << 8 | cls
        return False
    cls2 = cls if n2 < POOL_MIN_WORDS << cls else cls + 1  # shared: a copy; full: one class up
    o2 = pool.alloc(cls2)
    wv = pool.wv
    if at >= 0:
        old[at] |= bit
    else:
        old.append(pair)
    for j, q in enumerate(old, o2 + 1):
        wv[j] = q
    wv[o2] = n2 << 8 | cls2
    _release(pool, o)
    rv[s] = ref(o2, cls2)
    return False


def clear_bit(rv: memoryview, pool: Pool, s: int, col: int, bit: int, every: bool = False) -> tuple[int, int]:
    """Clear `bit` of column `col` in slot `s`: (0 it was not set, 1 cleared, 2 cleared and the slot
    now has no holder at all (the caller deletes it); the slots cleared). A shared record is copied
    first, unless `every` (clear_worker: every slot naming it is cleared alike, so it changes in place
    for all, each counted; a sharer left with one pair goes inline, the others in `settle_inline`)."""
    r = rv[s]
    if r < ROW_REF:
        if not r or r >> 32 != col or not r & bit:
            return 0, 0
        r &= ~bit
        if r & LOW:
            rv[s] = r
            return 1, 1
        rv[s] = 0
        return 2, 1
    o = r & OFFSET
    wv = pool.wv
    head = wv[o]
    n, cls, shares = head >> 8 & LOW, head & _CLS, head >> REC_SHARES_SHIFT
    for i in range(n):
        p = wv[o + 1 + i]
        if p >> 32 != col:
            continue
        if not p & bit:
            return 0, 0
        p &= ~bit
        if shares and not every:  # copy on write
            if not p & LOW and n == 2:
                rv[s] = wv[o + 2 - i]
                _release(pool, o)
                return 1, 1
            o2 = pool.alloc(cls)
            wv = pool.wv
            wv[o2 + 1 : o2 + 1 + n] = wv[o + 1 : o + 1 + n]
            n2 = n
            if p & LOW:
                wv[o2 + 1 + i] = p
            else:
                n2 -= 1
                wv[o2 + 1 + i] = wv[o2 + 1 + n2]  # the last pair takes its place
            wv[o2] = n2 << 8 | cls
            _release(pool, o)
            rv[s] = ref(o2, cls)
            return 1, 1
        if p & LOW:
            wv[o + 1 + i] = p
            return 1, shares + 1
        wv[o + 1 + i] = wv[o + n]  # the last pair takes its place
        n -= 1
        wv[o] = shares << REC_SHARES_SHIFT | n << 8 | cls
        if n == 1:
            rv[s] = wv[o + 1]
            _release(pool, o)
        return 1, shares + 1
    return 0, 0


def settle_inline(rv: memoryview, pool: Pool, s: int) -> None:
    """clear_worker's first step at a slot: a record left with one pair (by a sharer's clear) goes
    inline here too."""
    r = rv[s]
    if r >= ROW_REF:
        o = r & OFFSET
        if pool.wv[o] >> 8 & LOW == 1:
            rv[s] = pool.wv[o + 1]
            _release(pool, o)


def expand_rows(rows: np.ndarray, pool: Pool) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of the rows words `rows`, vectorised: (index into `rows` of each pair, the pairs)."""
    rows = np.asarray(rows, np.uint64)
    ref = rows >= np.uint64(ROW_REF)
    inline = np.flatnonzero((rows != 0) & ~ref)
    at = np.flatnonzero(ref)
    if not len(at):
        return inline, rows[inline]
    offs = (rows[at] & np.uint64(OFFSET)).astype(np.intp)
    lens = ((pool.words[offs] >> np.uint64(8)) & np.uint64(LOW)).astype(np.intp)
    starts = np.cumsum(lens) - lens
    total = int(lens.sum())
    idx = np.repeat(offs + 1 - starts, lens) + np.arange(total)
    which = np.concatenate([inline, np.repeat(at, lens)])
    return which, np.concatenate([rows[inline], pool.words[idx]])
