"""HashTable: int64 block hash -> one row of flat numpy arrays (the BlockIndex's store).

Why arrays and not a dict: a dict entry with its int key and int value costs 100+ bytes, and each
lookup is a chain of dependent pointer loads that the CPU cannot overlap. Here a key is 8 bytes
in one array, its row (one `rows` word naming its holders, kvevents.consumers.holders, and the
parent link) sits beside it, and a 512-page lookup is a few vectorised gathers whose cache misses
the CPU overlaps. What a slot costs does not depend on the fleet's width: an entry held by the
workers of one column keeps them in its `rows` word, others a record in the table's `pool`.

Layout: buckets of 8 slots (one 64-byte line of keys) and a Fibonacci-hashed home bucket. Slots
that hold no key hold the table's `vacant` key (never a live key), so a lookup compares keys
without reading slot states. A key whose home bucket is full goes to the next bucket with room;
its home bucket is flagged in `overflow` (one byte per bucket, small enough to stay in cache) and
the key's slot is noted in a small dict (`spill`, a few percent of the keys). So a lookup reads one
64-byte line per key in one vectorised pass, and only misses in flagged buckets ask the dict.
Deletes leave tombstones for inserts to reuse; the next rebuild drops them and the flags.
The big arrays start on 2 MiB boundaries and ask for transparent huge pages (`zeros_paged`): with
4 KiB pages nearly every probe of a multi-megabyte table also misses the TLB (under a hypervisor,
lookups measured ~1.3x slower at p50 and ~1.6x at p99: benchmarks/README.md).
"""

from __future__ import annotations

import math

import numpy as np

from kvevents import native
from kvevents.consumers import holders
from kvevents.consumers.paged import is_paged, zeros_paged
from kvevents.native.layout import EMPTY, EXTRA_ROWS, HAS_PARENT, LIVE, LIVE_BYTES, MIX, SLOTS, TOMB

__all__ = ["HashTable", "EMPTY", "LIVE", "TOMB", "HAS_PARENT", "SLOTS", "as_hashes", "rebuild_buckets", "zeros_paged"]

# EMPTY, LIVE, TOMB, HAS_PARENT (slot states), SLOTS (per bucket), MIX, LIVE_BYTES, EXTRA_ROWS: the
# layout the compiled twin shares, defined once in kvevents/native/layout.py (checked against the C at import)
MAX_LOAD = 0.5  # used slots (live + tombstones) per slot before a rebuild
REBUILD_LOAD = 0.3  # a rebuild picks the smallest size that keeps the live load at or below this
# (so a table grows 2x at load 0.5 and lands at 0.25: few full buckets, <= 100 bytes per key)
VACANT = -0x5EED_C0DE_5EED_C0DF  # the key of slots holding none (moved if a real key equals it)
_MIN_BUCKETS = 8
# Array operands are 0-d arrays, not numpy scalars: a ufunc takes them ~0.5 us faster a call.
_MIX = np.array(MIX, np.uint64)  # Fibonacci hashing: spreads sequential keys too
_LIVE_BYTES = np.array(LIVE_BYTES, np.uint64)  # the LIVE bit of each of a bucket's 8 state bytes
_GATHER = np.array(0x0102040810204080, np.uint64)  # w * _GATHER >> 56: the bytes' low bits as one byte
_SHIFT56 = np.array(56, np.uint64)
_SLOTS = np.array(SLOTS, np.intp)
_MIX_INT = int(_MIX)
_M64 = (1 << 64) - 1
_LIVE_BYTES_INT = int(_LIVE_BYTES)
_BIT_INDEX = np.zeros(256, np.intp)
_BIT_INDEX[1 << np.arange(8)] = np.arange(8)
_SLOT_IN_BUCKET = np.full(256, -(2**62), np.intp)  # the same; no byte (or several) set: far below 0
_SLOT_IN_BUCKET[1 << np.arange(8)] = np.arange(8)
_FAR = 2**40  # a slot past any table's end
_SLOT_OR_FAR = np.full(256, _FAR, np.intp)  # the same, with absent keys far above the end
_SLOT_OR_FAR[1 << np.arange(8)] = np.arange(8)
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def as_hashes(values: object) -> np.ndarray:
    """Block hashes as a 1-d int64 array; ValueError naming the problem for anything else.

    Strict: floats, bools and ints outside int64 are refused, never truncated.
    """
    if isinstance(values, np.ndarray) and values.dtype == np.int64 and values.ndim == 1:
        return values
    try:
        out = np.array(values)
    except (OverflowError, TypeError, ValueError):
        out = np.array(None)
    if out.ndim == 1 and out.dtype == np.int64:
        return out
    if out.ndim == 1 and out.size == 0:
        return np.empty(0, np.int64)
    if out.ndim > 1:
        raise ValueError(f"block hashes must be a flat sequence, got shape {out.shape}")
    if out.ndim == 0:
        raise ValueError(f"block hashes must be a sequence of int64 integers, got {values!r}")
    bad = next((v for v in values if type(v) is not int or not _I64_MIN <= v <= _I64_MAX), values)  # type: ignore[attr-defined]
    raise ValueError(f"block hashes must be int64 integers, got {bad!r}")


class HashTable:
    """Open-addressing table of unique int64 keys with a row per key: `rows[slot]` (its holders,
    kvevents.consumers.holders, records in `pool`) and `parent`.

    `rows` has one more word than there are slots, always zero, so slot -1 (absent) reads as 0.
    Slot numbers stay valid until the next `reserve`/`insert`/`insert1` that rebuilds; callers
    reserve first, then find and place. Not thread-safe.
    """

    __slots__ = (
        "keys", "state", "parent", "rows", "overflow", "vacant", "live", "used", "spill", "limit", "pool",
        "_bmask", "_shift", "_nshift", "_kv", "_sv", "_pv", "_rv", "_ov", "_cview", "_changes",
    )  # fmt: skip

    _cview: tuple | None

    def __init__(self, buckets: int = _MIN_BUCKETS, *, changes: list[int] | None = None) -> None:
        """`changes`: a one-int list bumped whenever `cview()` changes (rebuilt arrays, a grown
        pool, a moved vacant key, a new spill dict), which tables of one index may share: what
        caches a view can check with one compare."""
        self._changes = changes
        self.live = 0  # slots holding a key
        self.used = 0  # live + tombstones (what fills buckets)
        self.vacant = VACANT
        self.spill: dict[int, int] = {}  # key -> slot, for the few keys not in their home bucket
        self._cview = None
        self.pool = holders.Pool(self._view_changed)
        self._alloc(max(_MIN_BUCKETS, _pow2(buckets)))

    def _alloc(self, buckets: int) -> None:
        n = buckets * SLOTS
        self.keys = zeros_paged(n, np.int64)
        self.keys.fill(self.vacant)
        self.state = np.zeros(n, np.uint8)
        self.parent = zeros_paged(n, np.int64)
        # one extra zero word at index -1: `rows.take(find(q))` gives 0 (nobody) for absent keys
        self.rows = zeros_paged(n + EXTRA_ROWS, np.uint64)
        self.overflow = np.zeros(buckets, np.bool_)  # a key homed here lives in a later bucket
        self.limit = MAX_LOAD * n  # used slots past which the next reserve rebuilds
        self._bmask = buckets - 1
        self._nshift = 64 - (buckets.bit_length() - 1)
        self._shift = np.array(self._nshift, np.uint64)
        self._refresh()

    def _refresh(self) -> None:
        """Memoryviews for the scalar paths (plain ints in and out, no numpy scalar boxing)."""
        self._kv = self.keys.data  # ndarray.data: the array's memoryview
        self._sv = self.state.data
        self._pv = self.parent.data
        self._rv = self.rows.data
        self._ov = self.overflow.view(np.uint8).data
        self._view_changed()

    def cview(self) -> tuple:
        """The arrays and bucket math as the compiled fast path reads them (kvevents.native):
        (keys, state, parent, rows, overflow bytes, nshift, vacant, spill, pool words, pool meta),
        in the order of kvevents.native.layout.CVIEW, the arrays as memoryviews (cheaper for C to
        open than numpy arrays). Valid until the next rebuild or pool growth."""
        c = self._cview
        if c is None:
            p = self.pool
            c = self._cview = (
                self._kv, self._sv, self._pv, self._rv, self._ov, self._nshift, self.vacant, self.spill, p.wv, p.mv,
            )  # fmt: skip
        return c

    def _view_changed(self) -> None:
        self._cview = None  # built on first use; dropped whenever its parts change
        if self._changes is not None:
            self._changes[0] += 1

    def note_deleted(self, n: int) -> None:
        """Account for `n` rows the compiled remove loop deleted (tombstoned) through `cview`."""
        self.live -= n

    @property
    def capacity(self) -> int:
        return len(self.keys)

    def _home(self, q: np.ndarray) -> np.ndarray:
        b = q.view(np.uint64) * _MIX
        b >>= self._shift
        return b.view(np.intp)  # < buckets: a safe view

    def find(self, q: np.ndarray) -> np.ndarray:
        """Slot of each key of `q` (int64 array), -1 where absent."""
        out = self._slots(q, _SLOT_IN_BUCKET, -1)
        np.maximum(out, -1, out=out)
        vacant = q == self.vacant
        if vacant.any():  # the vacant key may match an empty slot: it is never present
            out[vacant] = -1
        return out

    def row_words(self, q: np.ndarray, *, exact: bool = True) -> np.ndarray:
        """The rows words of the keys of `q`, 0 for an absent key (router lookups).

        `find` without its vacant-key check: a vacant-key query can only reach an empty slot,
        whose row is zero too. Absent keys get a slot far past the end, which take's clip mode
        turns into the zero last word (one numpy call fewer than mapping them to -1).
        exact=False skips the spill: a key off its home bucket (one in `spill`) reads as absent.
        """
        return self.rows.take(self._slots(q, _SLOT_OR_FAR, _FAR, exact), mode="clip")

    def _slots(self, q: np.ndarray, in_bucket: np.ndarray, absent: int, exact: bool = True) -> np.ndarray:
        """Slots of the keys of `q`; an absent key's is below 0 (`absent` < 0) or past the end."""
        if not self.live or not len(q):
            return np.full(len(q), absent, np.intp)
        b = self._home(q)
        # take(): several times faster than fancy indexing for these gathers
        hit = self.keys.reshape(-1, SLOTS).take(b, axis=0) == q[:, None]
        hw = hit.view(np.uint64).reshape(-1)  # byte j is 1: slot j holds the key
        hw *= _GATHER
        hw >>= _SHIFT56
        out = b * _SLOTS
        out += in_bucket.take(hw)
        if exact and self.spill:  # keys off their home bucket (rare): only misses can be one of them
            n = len(self.keys)
            if (out.min() < 0) if absent < 0 else (out.max() >= n):
                miss = out < 0 if absent < 0 else out >= n
                rest = (miss & self.overflow.take(b)).nonzero()[0]
                if len(rest):
                    get = self.spill.get
                    out[rest] = [get(k, absent) for k in q.take(rest).tolist()]
        return out

    # Scalar paths: the same table, one key at a time in plain Python (small events: a few us
    # each, where a vectorised call costs tens of us of numpy overhead).

    def find1(self, k: int) -> int:
        """`find` for one key: its slot, or -1."""
        b = ((k * _MIX_INT) & _M64) >> self._nshift
        row = self._kv[b * SLOTS : b * SLOTS + SLOTS].tolist()
        if k in row and k != self.vacant:
            return b * SLOTS + row.index(k)
        if self._ov[b] and self.spill:
            return self.spill.get(k, -1)
        return -1

    def insert1(self, k: int) -> int:
        """`insert` for one absent key (reserves room itself)."""
        self.reserve(1)
        return self.place1(k)

    def place1(self, k: int) -> int:
        """Insert one absent key into room already reserved (slot numbers stay valid)."""
        if k == self.vacant:
            self._move_vacant()
        home = b = ((k * _MIX_INT) & _M64) >> self._nshift
        st = self._sv
        while True:
            base = b * SLOTS
            free = ~int.from_bytes(st[base : base + SLOTS], "little") & _LIVE_BYTES_INT
            if free:
                s = base + (((free & -free).bit_length() - 1) >> 3)
                if not st[s]:
                    self.used += 1
                st[s] = LIVE
                self._kv[s] = k
                self.live += 1
                if b != home:
                    self._ov[home] = 1
                    self.spill[k] = s
                return s
            b = (b + 1) & self._bmask

    def delete1(self, s: int) -> None:
        """`delete` for one live slot (whose holders are gone)."""
        kv = self._kv
        if self.spill:
            k = kv[s]
            if s // SLOTS != ((k * _MIX_INT) & _M64) >> self._nshift:
                del self.spill[k]
        kv[s] = self.vacant
        self._sv[s] = TOMB
        self._rv[s] = 0
        self.live -= 1

    def row_holds(self, s: int, filt: np.ndarray | None = None) -> bool:
        """Does slot `s` have any holder (any of `filt`'s bits, per column, when given)?"""
        r = self._rv[s]
        if filt is None or not r:
            return bool(r)
        f = filt.tolist()
        return any(p >> 32 < len(f) and p & f[p >> 32] for p in holders.row_pairs(r, self.pool))

    def set_bits_each(self, hashes: list[int], col: int, bit: int, prev: int | None) -> list[int]:
        """Set `bit` in column `col` for each key (inserted when absent, into reserved room), in
        order, recording each key's parent (`prev`, then the key before it); the keys whose bit
        was already set (extra copies) are returned."""
        if type(hashes) is list and native.active():
            got = native.set_bits_each(self.cview(), hashes, col, bit, prev)
            if got is not None:  # None: a key equals the vacant key, which the Python loop moves
                return self.finish_store(got, hashes, col, bit, prev)
        find1, place1, set_bit, pool = self.find1, self.place1, holders.set_bit, self.pool
        pv, sv = self._pv, self._sv
        dup: list[int] = []
        ps = find1(prev) if prev is not None else -1
        pw = self._rv[ps] if ps >= 0 else 0  # the previous key's rows word (its record may be shared)
        for h in hashes:
            s = find1(h)
            if s < 0:
                s = place1(h)
            if set_bit(self._rv, pool, s, col, bit, pw):
                dup.append(h)
            pw = self._rv[s]
            if prev is not None:
                pv[s] = prev
                sv[s] |= HAS_PARENT
            prev = h
        return dup

    def finish_store(self, got: tuple, hashes: list[int], col: int, bit: int, prev: int | None) -> list[int]:
        """Count what a compiled store loop (`native.set_bits_each`, `store_event`) placed; where it
        stopped because a record did not fit the pool, grow the pool and go on from there, as often
        as it takes (so both twins grow the pool at the same point). The duplicates."""
        self.live += got[1]
        self.used += got[2]
        if got[3] < 0:
            return got[0]  # type: ignore[no-any-return]
        dups: list[int] = list(got[0])
        start = 0
        while got[3] >= 0:
            start += got[3]
            prev = hashes[start - 1] if start else prev
            self.pool.grow(got[4])
            again = native.set_bits_each(self.cview(), hashes[start:], col, bit, prev)
            assert again is not None  # no vacant key: the first call would have said so
            got = again
            self.live += got[1]
            self.used += got[2]
            dups += got[0]
        return dups

    def bit_set(self, s: int, col: int, bit: int) -> bool:
        """True if slot `s` has `bit` set in column `col`."""
        return bool(holders.row_bits(self._rv[s], self.pool, col) & bit)

    def clear_bit(self, s: int, col: int, bit: int) -> bool:
        """Clear `bit` of slot `s` in column `col` (True if it was set); a slot left with no holder
        is deleted."""
        got, _ = holders.clear_bit(self._rv, self.pool, s, col, bit)
        if got == 2:
            self.delete1(s)
        return got > 0

    def clear_bit_every(self, s: int, col: int, bit: int) -> int:
        """clear_worker's `clear_bit`: a shared record changes in place for every slot naming it (all
        of them are cleared in the same pass); the slots cleared. A record a sharer left with one pair
        goes inline here first."""
        holders.settle_inline(self._rv, self.pool, s)
        got, k = holders.clear_bit(self._rv, self.pool, s, col, bit, True)
        if got == 2:
            self.delete1(s)
        return k

    def reserve(self, n: int) -> None:
        """Make room for `n` more keys (may rebuild: slot numbers change)."""
        buckets = rebuild_buckets(len(self.keys), self.used, self.live, n)
        if buckets:
            self._rebuild(buckets)

    def insert(self, q: np.ndarray) -> np.ndarray:
        """Insert keys known to be absent and distinct; returns their slots (rows start zeroed)."""
        self.reserve(len(q))
        return self.place(q)

    def place(self, q: np.ndarray) -> np.ndarray:
        """Insert absent keys (vectorised) into room already reserved; their slots."""
        if (q == self.vacant).any():
            self._move_vacant()
        out = np.empty(len(q), np.intp)
        keys, st = self.keys, self.state
        words = st.view(np.uint64)
        pending = np.arange(len(q))
        qq = q
        b = home = self._home(q)
        while len(pending):
            free = ~words.take(b) & _LIVE_BYTES  # byte j is 1: slot j is empty or a tombstone
            has = free != 0
            slot = b * _SLOTS + _BIT_INDEX.take(((free & (0 - free)) * _GATHER) >> _SHIFT56)  # lowest free
            if not has.all():
                slot, qk, ik = slot[has], qq[has], pending[has]
            else:
                qk, ik = qq, pending
            keys[slot] = qk  # keys contending for one slot: one write survives, and wins it
            won = keys.take(slot) == qk
            ws = slot[won] if not won.all() else slot
            self.used += int(np.count_nonzero(st.take(ws) == EMPTY))
            st[ws] = LIVE
            out[ik[won]] = ws
            left = ~has  # full bucket: on to the next one; lost contests retry their bucket
            left[np.flatnonzero(has)[~won]] = True
            b = np.where(has, b, (b + 1) & self._bmask)[left]
            pending, qq = pending[left], qq[left]
        self.live += len(q)
        away = (out // SLOTS) != home
        if away.any():  # placed past a full home bucket: flag it, and note where the key went
            self.overflow[home[away]] = True
            self.spill.update(zip(q[away].tolist(), out[away].tolist()))
        return out

    def _move_vacant(self) -> None:
        """A real key equals the vacant key: pick another one that no live key equals."""
        vacant = self.vacant
        live = set(self.keys[self.state & LIVE != 0].tolist())
        while vacant in live or vacant == self.vacant:
            vacant = (vacant + 0x9E3779B97F4A7C15) % 2**64 - 2**63
        self.keys[self.state & LIVE == 0] = vacant
        self.vacant = vacant
        self._view_changed()

    def delete(self, slots: np.ndarray) -> None:
        """Drop the keys at `slots` (distinct live slots, their holders gone): tombstones, rows zeroed."""
        if self.spill:
            keys = self.keys.take(slots)
            away = (slots // SLOTS) != self._home(keys)
            for k in keys[away].tolist():
                del self.spill[k]
        self.keys[slots] = self.vacant
        self.state[slots] = TOMB
        self.rows[slots] = 0
        self.live -= len(slots)

    def live_slots(self) -> np.ndarray:
        return np.flatnonzero(self.state & LIVE)

    def _rebuild(self, buckets: int) -> None:
        live = self.live_slots()
        keys, state, parent, rows = self.keys[live], self.state[live], self.parent[live], self.rows[live]
        self._alloc(buckets)
        self.live = self.used = 0
        self.spill = {}
        self._view_changed()
        slots = self.place(keys)
        self.state[slots] = state
        self.parent[slots] = parent
        self.rows[slots] = rows

    def nbytes(self) -> int:
        arrays = (self.keys, self.state, self.parent, self.rows, self.overflow)
        return sum(a.nbytes for a in arrays) + self.pool.nbytes()

    def paged_bytes(self) -> int:
        """The part of `nbytes` in zeros_paged's own mappings (outside the Python allocator, so
        tracemalloc does not see it)."""
        return sum(a.nbytes for a in (self.keys, self.parent, self.rows) if is_paged(a)) + self.pool.paged_bytes()


def rebuild_buckets(capacity: int, used: int, live: int, n: int) -> int:
    """Buckets to rebuild to before adding `n` keys, or 0 when they fit (the growth policy)."""
    if used + n <= MAX_LOAD * capacity:
        return 0
    return max(_MIN_BUCKETS, _pow2(math.ceil((live + n) / (REBUILD_LOAD * SLOTS))))


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
