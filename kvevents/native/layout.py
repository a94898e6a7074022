"""The HashTable layout that consumers/table.py and the C walk and apply loops must agree on.

The Python side of kvevents/native/_table.h: consumers/table.py and consumers/holders.py build their
tables from these constants, the extension exports its own (`_speedups.layout()`), and
kvevents.native refuses an extension whose constants differ (`mismatch`), so a stale or edited
build can never misread a table. The vacant key is not here: each table carries its own, in its
view (`HashTable.cview()`).

A slot's holders (consumers/holders.py): one uint64 `rows` word per slot, 0 (nobody), an inline
pair `col << 32 | bits` (every holder in one column: one medium, one group of WORD workers), or
`ROW_REF | cls << ROW_CLS_SHIFT | offset` of a record in the table's uint64 `pool`: a header
`shares << REC_SHARES_SHIFT | len << 8 | cls` (shares: how many more slots name the record, copy on
write), then `len` pairs, in a block of `POOL_MIN_WORDS << cls` words (the class in the
rows word too, so a lookup can prefetch the whole record before its header arrives). `pmeta` (int64): the pool's bump pointer, the
words its live records take, then one free-list head per class (0: none; word 0 is never a record).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "SLOTS",
    "EMPTY",
    "LIVE",
    "TOMB",
    "HAS_PARENT",
    "MIX",
    "LIVE_BYTES",
    "WORD",
    "EXTRA_ROWS",
    "ROW_REF",
    "ROW_CLS_SHIFT",
    "POOL_CLASSES",
    "POOL_MIN_WORDS",
    "REC_SHARES_SHIFT",
    "PMETA_TOP",
    "PMETA_IN_USE",
    "PMETA_FREE",
    "CVIEW",
    "TABLE_LAYOUT",
    "mismatch",
]

SLOTS = 8  # slots per bucket: 8 int64 keys = one 64-byte cache line
EMPTY, LIVE, TOMB, HAS_PARENT = 0, 1, 2, 4  # slot state (uint8): never used, live bit, deleted, parent bit
MIX = 0x9E3779B97F4A7C15  # Fibonacci hashing: home bucket = (key * MIX mod 2**64) >> (64 - log2 buckets)
LIVE_BYTES = int.from_bytes(bytes([LIVE]) * SLOTS, "little")  # the LIVE bit of each state byte of a bucket
WORD = 32  # workers per column (worker w: column group w // 32, bit w % 32 of a pair's low half)
EXTRA_ROWS = 1  # rows has one zero word past the last slot: an absent key's row
ROW_REF = 1 << 63  # a rows word with this bit names the slot's record: its class and pool offset
ROW_CLS_SHIFT = 56  # the record's class sits at bits 56..62, its offset below
POOL_CLASSES = 26  # record sizes POOL_MIN_WORDS << 0 .. << 25 words
POOL_MIN_WORDS = 4  # the smallest record: a header and 3 pairs
REC_SHARES_SHIFT = 40  # a record header `shares << 40 | len << 8 | cls`: shares = slots naming it, less one
PMETA_TOP, PMETA_IN_USE, PMETA_FREE = 0, 1, 2  # pmeta[2 + cls]: the free list of class cls
# HashTable.cview(): the view tuple's fields, in order
CVIEW = ("keys", "state", "parent", "rows", "overflow", "nshift", "vacant", "spill", "pool", "pmeta")

#: Every constant above by name, as the extension's layout() names them.
TABLE_LAYOUT: Mapping[str, int | tuple[str, ...]] = {
    "SLOTS": SLOTS,
    "EMPTY": EMPTY,
    "LIVE": LIVE,
    "TOMB": TOMB,
    "HAS_PARENT": HAS_PARENT,
    "MIX": MIX,
    "LIVE_BYTES": LIVE_BYTES,
    "WORD": WORD,
    "EXTRA_ROWS": EXTRA_ROWS,
    "ROW_REF": ROW_REF,
    "ROW_CLS_SHIFT": ROW_CLS_SHIFT,
    "POOL_CLASSES": POOL_CLASSES,
    "POOL_MIN_WORDS": POOL_MIN_WORDS,
    "REC_SHARES_SHIFT": REC_SHARES_SHIFT,
    "CVIEW": CVIEW,
}


def mismatch(c_layout: Mapping[str, object], py_layout: Mapping[str, object] = TABLE_LAYOUT) -> str | None:
    """The constants on which the extension's layout and the Python table's differ (or that one side
    lacks), as one line ("SLOTS: C 16, Python 8; ..."); None when they agree."""
    diffs = []
    for name in sorted(set(c_layout) | set(py_layout)):
        c, py = c_layout.get(name, "missing"), py_layout.get(name, "missing")
        if c != py:
            diffs.append(f"{name}: C {c!r}, Python {py!r}")
    return "; ".join(diffs) or None
