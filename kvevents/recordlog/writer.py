"""Append-only writer: one framed record per write; crash-safe up to the last, torn, record."""

from __future__ import annotations

import os
import time
from typing import Callable, Literal

from kvevents.recordlog.format import Record, RecordLogError, encode_header, encode_record
from kvevents.recordlog.reader import Damage, RecordReader

__all__ = ["RecordWriter", "Durability"]

Durability = Literal["buffered", "flush", "fsync"]


class RecordWriter:
    """Write records to `path` (a new file, or `append=True` to continue an existing log).

    durability: "flush" (default) hands every record to the OS, so a killed process loses at most
    a torn last record; "fsync" also survives power loss (slow); "buffered" batches writes (bulk
    conversion: a crash can lose the unflushed buffer, readers still skip the torn end).
    Appending to a log whose tail is torn truncates the torn bytes first (reported via on_damage).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        append: bool = False,
        durability: Durability = "flush",
        buffer_size: int = 1 << 20,
        on_damage: Callable[[Damage], None] | None = None,
    ) -> None:
        if durability not in ("buffered", "flush", "fsync"):
            raise RecordLogError(f"durability must be buffered, flush or fsync, got {durability!r}")
        self.path = os.fspath(path)
        self._durability = durability
        self.records = 0
        self.bytes_written = 0
        exists = os.path.exists(self.path) and os.path.getsize(self.path) > 0
        if append and exists:
            reader = RecordReader(self.path, on_damage=on_damage)
            try:
                for _ in reader:
                    pass
            finally:
                reader.close()
            self.records = reader.records
            f = open(self.path, "r+b", buffering=buffer_size)
            f.truncate(reader.valid_end)
            f.seek(reader.valid_end)
            self._f = f
        else:
            try:
                self._f = open(self.path, "wb", buffering=buffer_size)
            except FileNotFoundError:
                raise RecordLogError(f"{self.path}: directory does not exist") from None
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
            raise RecordLogError(f"payload must be bytes, got {type(payload).__name__}")
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

    def write_reset(self, *, source: str, reason: str, endpoint: str = "", dp_rank: int | None = None,
                    recv_time: float | None = None) -> int:
        """Append a reset marker: consumers must drop `source` (rank) state here; a snapshot follows."""
        return self.write(reason.encode("utf-8"), source=source, endpoint=endpoint, dp_rank=dp_rank,
                          kind="reset", recv_time=recv_time)

    def write_record(self, rec: Record) -> int:
        """Append a copy of a record read from another log."""
        return self.write(rec.payload, source=rec.source, endpoint=rec.endpoint, topic=rec.topic, seq=rec.seq,
                          epoch=rec.epoch, dp_rank=rec.dp_rank, kind=rec.kind, recv_time=rec.recv_time)

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._f.flush()
            if self._durability == "fsync":
                os.fsync(self._f.fileno())
            self._f.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

