"""CRC checks of claimed record ranges that cost O(1) each, so resync after damage stays linear.

A reader that meets a sync marker claiming an n-byte body must know whether the CRC of those n bytes
matches. Computing it directly costs n, and a file of false markers each claiming megabytes then
costs (markers x claim): quadratic. `RangeChecker` instead keeps the CRC of every prefix of the file
from an anchor at fixed steps (each byte is CRC'd once, as the claims reach further), and answers
any range from two prefixes (kvevents.recordlog.crcshift). Its memory is bounded by the longest
claim (MAX_BODY / STEP entries) because prefixes behind the range being checked are dropped.
"""

from __future__ import annotations

import os
import zlib
from array import array

from kvevents.recordlog.crcshift import range_crc

__all__ = ["RangeChecker"]

STEP = 1024  # bytes between stored prefix CRCs: at most this many are CRC'd again per query
BLOCK = 1 << 20  # read size when extending the prefix table
WINDOW = STEP  # read size for the bytes between a stored prefix and a queried offset
FORGET = 16384  # stored prefixes kept behind the queries before they are dropped


class _Cursor:
    """The last prefix asked for near one place, and a window of the file there (no re-reads)."""

    __slots__ = ("at", "crc", "win_at", "mv")

    def __init__(self) -> None:
        self.at = -(STEP + 1)  # never near a queried offset
        self.crc = 0
        self.win_at = 0
        self.mv = memoryview(b"")


class RangeChecker:
    """zlib.crc32 of file[a:b] for ranges met in increasing order of `a`, from prefix CRCs."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self._size = size
        self._first = -1  # file offset of _cps[0]; -1 before the first query
        self._cps = array("I")  # _cps[i] = crc32(file[anchor : _first + i * STEP])
        self._cursors = (_Cursor(), _Cursor())  # one near the range starts, one near their ends

    def crc(self, a: int, b: int) -> int:
        """The CRC of file[a:b] (0 <= a <= b <= size; `a` not below an earlier query's `a`)."""
        if not 0 <= a <= b <= self._size:
            raise ValueError(f"range [{a}, {b}) outside the file of {self._size} bytes")
        first = self._first
        if first < 0 or a < first or a > first + (len(self._cps) - 1) * STEP:
            self._reanchor(a)  # nothing stored covers a: start over there (the gap is never CRC'd)
        elif a - first > FORGET * STEP:
            self._forget_before(a)
        cur_a, cur_b = self._cursors
        return range_crc(self._prefix(a, cur_a), self._prefix(b, cur_b), b - a)

    def _reanchor(self, a: int) -> None:
        self._first = a
        self._cps = array("I", [0])
        for c in self._cursors:
            c.at = -(STEP + 1)

    def _forget_before(self, a: int) -> None:
        """Drop the stored prefixes the queries have passed (in batches of FORGET: amortised)."""
        k = (a - self._first) // STEP
        del self._cps[:k]
        self._first += k * STEP

    def _extend(self, i: int) -> None:
        """Store prefixes up to index i, reading the file forward from the last stored one."""
        cps = self._cps
        while len(cps) <= i:
            at = self._first + (len(cps) - 1) * STEP
            want = min(BLOCK, (i + 1 - len(cps)) * STEP, self._size - at)
            data = os.pread(self._fd, want, at)
            if len(data) < STEP:
                raise OSError(f"short read at offset {at}: the file shrank")
            mv = memoryview(data)
            acc = cps[-1]
            for j in range(STEP, len(data) + 1, STEP):
                acc = zlib.crc32(mv[j - STEP : j], acc)
                cps.append(acc)
            mv.release()

    def _prefix(self, x: int, cur: _Cursor) -> int:
        """crc32(file[anchor:x]), from this cursor's last answer when near, else the nearest stored prefix."""
        at = cur.at
        if at <= x <= at + STEP and cur.win_at <= at and x - cur.win_at <= len(cur.mv):
            acc = zlib.crc32(cur.mv[at - cur.win_at : x - cur.win_at], cur.crc) if x > at else cur.crc
        else:
            i = (x - self._first) // STEP
            self._extend(i)
            start, acc = self._first + i * STEP, self._cps[i]
            if start < x:
                acc = zlib.crc32(self._bytes(start, x, cur), acc)
        cur.at, cur.crc = x, acc
        return acc

    def _bytes(self, a: int, b: int, cur: _Cursor) -> memoryview:
        off = a - cur.win_at
        if off < 0 or b - cur.win_at > len(cur.mv):
            cur.win_at = a
            cur.mv = memoryview(os.pread(self._fd, min(max(WINDOW, b - a), self._size - a), a))
            off = 0
            if len(cur.mv) < b - a:
                raise OSError(f"short read at offset {a}: the file shrank")
        return cur.mv[off : off + b - a]
