"""The HashTable layout that consumers/table.py and the C walk and apply loops must agree on.

The Python side of kvevents/native/_table.h: consumers/table.py builds its tables from these
constants, the extension exports its own (`_speedups.layout()`), and kvevents.native refuses an
extension whose constants differ (`mismatch`), so a stale or edited build can never misread a table.
The vacant key is not here: each table carries its own, in its view (`HashTable.cview()`).
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
    "MASK_EXTRA_ROWS",
    "CVIEW",
    "TABLE_LAYOUT",
    "mismatch",
]

SLOTS = 8  # slots per bucket: 8 int64 keys = one 64-byte cache line
EMPTY, LIVE, TOMB, HAS_PARENT = 0, 1, 2, 4  # slot state (uint8): never used, live bit, deleted, parent bit
MIX = 0x9E3779B97F4A7C15  # Fibonacci hashing: home bucket = (key * MIX mod 2**64) >> (64 - log2 buckets)
LIVE_BYTES = int.from_bytes(bytes([LIVE]) * SLOTS, "little")  # the LIVE bit of each state byte of a bucket
WORD = 64  # workers per uint64 mask column (worker w: column group w // 64, bit w % 64)
MASK_EXTRA_ROWS = 1  # masks has one all-zero row past the last slot: an absent key's row
# HashTable.cview(): the view tuple's fields, in order
CVIEW = ("keys", "state", "parent", "masks", "overflow", "nshift", "vacant", "spill", "nc")

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
    "MASK_EXTRA_ROWS": MASK_EXTRA_ROWS,
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
