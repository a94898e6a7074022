"""Append-only writer: one framed record per write; crash-safe up to the last, torn, record."""

from __future__ import annotations

import errno
import os
import stat
import time
from typing import BinaryIO, Callable, Literal

from kvevents.recordlog.format import HEADER_BYTES, BadRecordError, Record, RecordLogError, encode_header, encode_record
from kvevents.recordlog.reader import Damage, RecordReader, open_regular_file

__all__ = ["RecordWriter", "Durability"]

Durability = Literal["buffered", "flush", "fsync"]


class RecordWriter:
    """Write records to `path` (a new file, or `append=True` to continue an existing log).

    durability: "flush" (default) hands every record to the OS, so a killed process loses at most
    a torn last record; "fsync" also survives power loss (slow); "buffered" batches writes (bulk
    conversion: a crash can lose the unflushed buffer, readers still skip the torn end).
    Appending to a log whose tail is torn truncates the torn bytes first (reported via on_damage),
    and a damaged file header is rewritten. Only regular files are written (a FIFO or a directory
    is a RecordLogError, never a hang); `exclusive=True` creates a new file and never follows a
    symlink (O_EXCL | O_NOFOLLOW), for temporary files.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        append: bool = False,
        durability: Durability = "flush",
        buffer_size: int = 1 << 20,
        on_damage: Callable[[Damage], None] | None = None,
        exclusive: bool = False,
    ) -> None:
        if durability not in ("buffered", "flush", "fsync"):
            raise RecordLogError(f"durability must be buffered, flush or fsync, got {durability!r}")
        self.path = os.fspath(path)
        self._durability = durability
        self.records = 0
        self.bytes_written = 0
        exists = (
            not exclusive
            and os.path.exists(self.path)
            and not os.path.isdir(self.path)
            and os.path.getsize(self.path) > 0
        )
        self.created = not (append and exists)  # a new (or emptied) file, holding only what this writer wrote
        if append and exists:
            reader = RecordReader(self.path, on_damage=on_damage)
            try:
                for _ in reader:
                    pass
            finally:
                reader.close()
            self.records = reader.records
            f, _size = open_regular_file(self.path, "r+b")
            if not reader.header_ok:
                f.write(HEADER_BYTES)  # type: ignore[attr-defined]
            f.truncate(reader.valid_end)  # type: ignore[attr-defined]
            f.seek(reader.valid_end)  # type: ignore[attr-defined]
            self._f: BinaryIO = f  # type: ignore[assignment]
        else:
            self._f = _create(self.path, exclusive, buffer_size)
            self._f.write(encode_header())
            self._sync()
        self.closed = False

    def _sync(self) -> None:
        if self._durability != "buffered":
            self._f.flush()
            if self._durability == "fsync":
                os.fsync(self._f.fileno())

    def write(
        self,
        payload: bytes,
        *,
        source: str,
        endpoint: str = "",
        topic: str = "",
        seq: int | None = None,
        epoch: int | None = None,
        dp_rank: int | None = None,
        kind: str = "live",
        recv_time: float | None = None,
    ) -> int:
        """Append one record; returns its index in the file."""
        if self.closed:
            raise RecordLogError(f"{self.path}: writer is closed")
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise BadRecordError(f"payload must be bytes, got {type(payload).__name__}")
        data = encode_record(
            time.time() if recv_time is None else recv_time,
            source,
            endpoint,
            topic,
            seq,
            epoch,
            dp_rank,
            kind,
            bytes(payload),
        )
        self._f.write(data)
        if self._durability != "buffered":
            self._sync()
        self.bytes_written += len(data)
        self.records += 1
        return self.records - 1

    def write_reset(
        self,
        *,
        source: str,
        reason: str,
        endpoint: str = "",
        dp_rank: int | None = None,
        recv_time: float | None = None,
    ) -> int:
        """Append a reset marker: consumers must drop `source` (rank) state here; a snapshot follows."""
        return self.write(
            reason.encode("utf-8"), source=source, endpoint=endpoint, dp_rank=dp_rank, kind="reset", recv_time=recv_time
        )

    def write_record(self, rec: Record) -> int:
        """Append a copy of a record read from another log."""
        return self.write(
            rec.payload,
            source=rec.source,
            endpoint=rec.endpoint,
            topic=rec.topic,
            seq=rec.seq,
            epoch=rec.epoch,
            dp_rank=rec.dp_rank,
            kind=rec.kind,
            recv_time=rec.recv_time,
        )

    def flush(self) -> None:
        self._f.flush()

    def fileno(self) -> int:
        """The file descriptor (to fsync a "buffered" writer's file after flush())."""
        return self._f.fileno()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._f.flush()
            if self._durability == "fsync":
                os.fsync(self._f.fileno())
            self._f.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _create(path: str, exclusive: bool, buffer_size: int) -> BinaryIO:
    """A new, empty regular file at `path` (opened without blocking on a FIFO, truncated only once
    it is known to be a regular file)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if exclusive:
        flags |= os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except FileNotFoundError:
        raise RecordLogError(f"{path}: directory does not exist") from None
    except IsADirectoryError:
        raise RecordLogError(f"{path}: is a directory; give a file name") from None
    except FileExistsError:
        raise RecordLogError(f"{path}: exists (a new file was required)") from None
    except PermissionError:
        raise RecordLogError(f"{path}: permission denied") from None
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.ELOOP):  # a FIFO with no reader; a symlink under O_NOFOLLOW
            raise RecordLogError(f"{path}: not a regular file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RecordLogError(f"{path}: not a regular file (a FIFO, socket or device); give a file name")
    os.ftruncate(fd, 0)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "wb", buffering=buffer_size)
