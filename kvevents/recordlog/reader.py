"""Streaming reader: validates the header, yields records, skips damage with a warning.

Memory stays bounded by the chunk size plus the largest record; the file is never loaded whole.
Time stays linear in the file size, also through damage: see RangeChecker.
"""

from __future__ import annotations

import os
import stat
import warnings
import zlib
from typing import Callable, Iterator, NamedTuple

from kvevents.recordlog.format import (
    FIXED_SIZE,
    FRAME,
    FRAME_SIZE,
    HEADER_SIZE,
    MAX_BODY,
    SYNC,
    Record,
    RecordLogError,
    RecordLogWarning,
    check_header,
    decode_body,
)
from kvevents.recordlog.rangecheck import RangeChecker

__all__ = ["Damage", "RecordReader", "read_records", "feed_log", "open_log", "open_regular_file"]

CHUNK = 1 << 20
DIRECT_CRC_MAX = 4096  # bodies up to this size are CRC'd directly (cheap even for a false marker)


class Damage(NamedTuple):
    """Bytes a reader skipped: `kind` is "corrupt" (a valid record follows), "torn" (up to EOF) or
    "header" (a damaged file header, read past: the records carry their own CRC)."""

    offset: int
    length: int
    kind: str
    after_index: int  # number of valid records before the damage
    path: str

    def as_dict(self) -> dict[str, int | str]:
        """The fields as JSON (what `log inspect --json` and `--verify` report per damaged region)."""
        return {"offset": self.offset, "length": self.length, "kind": self.kind, "after_index": self.after_index,
                "path": self.path}  # fmt: skip

    def message(self) -> str:
        where = "before the first record" if self.after_index == 0 else f"after record {self.after_index - 1}"
        if self.kind == "header":
            return (
                f"{self.path}: damaged file header ({self.length} bytes at offset {self.offset}) read past, "
                "every record carries its own CRC; `kvevents log repair` rewrites it"
            )
        if self.kind == "torn":
            return (
                f"{self.path}: torn last record: {self.length} bytes at offset {self.offset} "
                f"({where}) skipped; `kvevents log repair` truncates them"
            )
        return (
            f"{self.path}: corrupt data: {self.length} bytes at offset {self.offset} failed the CRC check "
            f"({where}), skipped; resynced at the next valid record"
        )


def _warn(d: Damage) -> None:
    warnings.warn(d.message(), RecordLogWarning, stacklevel=3)


def open_regular_file(path: str | os.PathLike[str], mode: str = "rb") -> tuple[object, int]:
    """Open an existing regular file (never blocks on a FIFO or device); return (file, size)."""
    where = os.fspath(path)
    flags = (os.O_RDWR if "+" in mode else os.O_RDONLY) | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(where, flags)
    except FileNotFoundError:
        raise RecordLogError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise RecordLogError(f"{where}: is a directory, not a record log") from None
    except PermissionError:
        raise RecordLogError(f"{where}: permission denied") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, socket or device)"
        raise RecordLogError(f"{where}: is {what}, not a record log")
    os.set_blocking(fd, True)
    return os.fdopen(fd, mode), st.st_size


def _record_at(f: object, offset: int, size: int) -> bool:
    """Is there an intact record (sync, length bound, CRC) at `offset`? The file position is restored."""
    read, seek = f.read, f.seek  # type: ignore[attr-defined]
    seek(offset)
    try:
        head = read(FRAME_SIZE)
        if len(head) < FRAME_SIZE:
            return False
        sync, crc, n = FRAME.unpack_from(head)
        if sync != SYNC or not FIXED_SIZE <= n <= MAX_BODY or offset + FRAME_SIZE + n > size:
            return False
        acc = zlib.crc32(head[8:])
        left = n
        while left > 0:
            part = read(min(left, CHUNK))
            if not part:
                return False
            acc = zlib.crc32(part, acc)
            left -= len(part)
        return acc == crc
    finally:
        seek(offset)


def open_log(path: str | os.PathLike[str]) -> tuple[object, int, bool]:
    """Open a log for reading past its header; return (binary file, size, header_intact)."""
    where = os.fspath(path)
    f, size = open_regular_file(path)
    try:
        head = f.read(HEADER_SIZE)  # type: ignore[attr-defined]
        ok = check_header(head, where, lambda: _record_at(f, HEADER_SIZE, size))
    except BaseException:
        f.close()  # type: ignore[attr-defined]
        raise
    return f, size, ok


class RecordReader:
    """Iterate the valid records of a log; damage goes to `on_damage` (default: a RecordLogWarning).

    After a full iteration: `records` (count), `damage` (list), `valid_end` (offset just past the
    last valid record, where `repair` truncates), `size` (file size when opened); `header_ok` is
    False for a damaged file header (reported as "header" damage when the iteration starts).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        on_damage: Callable[[Damage], None] | None = None,
        chunk_size: int = CHUNK,
    ) -> None:
        self.path = os.fspath(path)
        self._f, self.size, self.header_ok = open_log(path)
        self._on_damage = on_damage if on_damage is not None else _warn
        self._chunk = max(int(chunk_size), 4096)
        self.records = 0
        self.damage: list[Damage] = []
        self.valid_end = HEADER_SIZE

    def close(self) -> None:
        self._f.close()  # type: ignore[attr-defined]

    def __enter__(self) -> RecordReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _report(self, offset: int, length: int, kind: str) -> None:
        d = Damage(offset, length, kind, self.records, self.path)
        self.damage.append(d)
        self._on_damage(d)

    def __iter__(self) -> Iterator[Record]:
        """Single pass: the file is closed when the iteration ends (or the generator is closed)."""
        try:
            yield from self._scan()
        finally:
            self.close()

    def _scan(self) -> Iterator[Record]:
        """One resynchronising pass over a sliding buffer (the hot path: the per-record steps stay inline)."""
        if not self.header_ok:
            self._report(0, HEADER_SIZE, "header")
        read = _bounded_reader(self._f.read, HEADER_SIZE, self.size)  # type: ignore[attr-defined]
        chunk, size = self._chunk, self.size
        unpack, crc32 = FRAME.unpack_from, zlib.crc32
        checker = RangeChecker(self._f.fileno(), size)  # type: ignore[attr-defined]
        buf, pos, base = b"", 0, HEADER_SIZE  # base: the file offset of buf[0]
        mv = memoryview(buf)
        bad_start, index, waste = -1, 0, 0  # waste: bytes CRC'd for claims that failed
        while True:
            if len(buf) - pos < FRAME_SIZE:
                buf, base, pos = buf[pos:] + read(chunk), base + pos, 0
                mv = memoryview(buf)
                if len(buf) < FRAME_SIZE:
                    break
            sync, crc, n = unpack(buf, pos)
            # a claim past the end of the file is refused before any CRC (format.py: resync rule)
            if sync == SYNC and FIXED_SIZE <= n <= MAX_BODY and base + pos + FRAME_SIZE + n <= size:
                end = pos + FRAME_SIZE + n
                # CRC'd in place while failed claims cost under twice the bytes read, else from prefix CRCs
                direct = n <= DIRECT_CRC_MAX or waste + n <= 2 * (base + pos) + chunk
                ok = direct or checker.crc(base + pos + 8, base + end) == crc
                if ok and end > len(buf):
                    buf, base, pos, end = buf[pos:] + read(max(chunk, end - len(buf))), base + pos, 0, FRAME_SIZE + n
                    mv = memoryview(buf)
                rec = None
                if ok and end <= len(buf) and (not direct or crc32(mv[pos + 8 : end]) == crc):
                    rec = _decode_or_none(buf, pos, end, index, base)
                if rec is not None:
                    if bad_start >= 0:
                        self._report(bad_start, base + pos - bad_start, "corrupt")
                        bad_start = -1
                    index = self.records = index + 1
                    pos = end
                    self.valid_end = base + pos
                    yield rec
                    continue
                if direct and n > DIRECT_CRC_MAX:
                    waste += n
            if bad_start < 0:  # damage at pos: look for the next sync marker
                bad_start = base + pos
            moved = _next_sync(buf, base, pos, read, chunk)
            if moved is None:
                break
            buf, base, pos = moved
            mv = memoryview(buf)
        self._report_tail(base + len(buf), bad_start)
        mv.release()

    def _report_tail(self, end_offset: int, bad_start: int) -> None:
        """At the end of the scan: bytes past the last valid record (or damage still open) are torn."""
        if bad_start < 0 and end_offset > self.valid_end:
            bad_start = self.valid_end
        if bad_start >= 0:
            self._report(bad_start, max(end_offset, self.size) - bad_start, "torn")


def _bounded_reader(f_read: Callable[[int], bytes], start: int, size: int) -> Callable[[int], bytes]:
    """A read(k) from file offset `start` that stops at the size seen at open: bytes appended meanwhile
    are not torn records."""
    fpos = start

    def read(k: int) -> bytes:
        nonlocal fpos
        k = min(k, size - fpos)
        if k <= 0:
            return b""
        data = f_read(k)
        fpos += len(data)
        return data

    return read


def _decode_or_none(buf: bytes, pos: int, end: int, index: int, base: int) -> Record | None:
    """The record framed at buf[pos:end] (its CRC already checked), or None for an inconsistent body."""
    try:
        return decode_body(buf, pos + FRAME_SIZE, end, index, base + pos)
    except (RecordLogError, UnicodeDecodeError):
        return None


def _next_sync(
    buf: bytes, base: int, pos: int, read: Callable[[int], bytes], chunk: int
) -> tuple[bytes, int, int] | None:
    """Damage at buf[pos]: (buf, base, pos) at the next sync marker (or where one may start once more
    is read), reading on as needed; None at the end of the file."""
    nxt = buf.find(SYNC, pos + 1)
    if nxt >= 0:
        return buf, base, nxt
    keep = max(pos + 1, len(buf) - (len(SYNC) - 1))
    more = read(chunk)
    if not more:
        return None
    buf = buf[keep:] + more
    if buf[:4] == SYNC:
        return buf, base + keep, 0
    found = buf.find(SYNC)
    return buf, base + keep, found if found >= 0 else max(0, len(buf) - (len(SYNC) - 1))


def read_records(
    path: str | os.PathLike[str], *, on_damage: Callable[[Damage], None] | None = None
) -> Iterator[Record]:
    """Yield the valid records of the log at `path`, streaming (warnings for skipped damage)."""
    with RecordReader(path, on_damage=on_damage) as reader:
        yield from reader


def feed_log(
    path: str | os.PathLike[str], feed: Callable[[Record], None], *, on_damage: Callable[[Damage], None] | None = None
) -> RecordReader:
    """Stream every valid record of the log into `feed`; return the closed reader (path, size, damage)."""
    with RecordReader(path, on_damage=on_damage) as reader:
        for rec in reader:
            feed(rec)
    return reader
