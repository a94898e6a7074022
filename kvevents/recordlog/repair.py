"""Repair a damaged log: cut a torn tail (always), optionally rewrite without corrupt regions."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field

from kvevents.recordlog.format import HEADER_BYTES, RecordLogError
from kvevents.recordlog.reader import Damage, RecordReader
from kvevents.recordlog.writer import RecordWriter

__all__ = ["RepairResult", "repair_log"]


@dataclass
class RepairResult:
    """What repair found and did; `changed` is False for a clean log (`header_damaged`: the file
    header was damaged and is rewritten, unless dry_run)."""

    path: str
    records: int
    size_before: int
    size_after: int
    torn_bytes: int = 0
    corrupt: list[Damage] = field(default_factory=list)
    rewritten: bool = False
    header_damaged: bool = False
    header_fixed: bool = False

    @property
    def changed(self) -> bool:
        return self.size_after != self.size_before or self.rewritten or self.header_fixed


def repair_log(path: str | os.PathLike[str], *, drop_corrupt: bool = False, dry_run: bool = False) -> RepairResult:
    """Truncate the torn tail of `path` in place (fsynced) and rewrite a damaged file header; with
    drop_corrupt, rewrite the file keeping only valid records (a new temp file created exclusively
    in the same directory, then an atomic rename). Corrupt regions in the middle are otherwise
    kept: readers skip them, and the bytes stay for forensics.

    A path that is a symbolic link is refused (RecordLogError) unless dry_run: repair changes the
    file in place, and following the link would change a file the caller did not name (the rename
    of drop_corrupt would also replace the link with a regular file)."""
    if not dry_run:
        _refuse_link(path)
    found: list[Damage] = []
    reader = RecordReader(path, on_damage=found.append)
    try:
        for _ in reader:
            pass
    finally:
        reader.close()
    torn = sum(d.length for d in found if d.kind == "torn")
    corrupt = [d for d in found if d.kind == "corrupt"]
    res = RepairResult(
        reader.path, reader.records, reader.size, reader.size, torn, corrupt, header_damaged=not reader.header_ok
    )
    if dry_run:
        res.size_after = reader.valid_end
        return res
    if drop_corrupt and corrupt:
        _rewrite(reader.path)
        res.rewritten = res.header_fixed = True
        res.size_after = os.path.getsize(reader.path)
        return res
    if torn or res.header_damaged:
        fd = os.open(reader.path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "r+b") as f:  # O_NOFOLLOW: a link put there since the check is not followed
            if res.header_damaged:
                f.write(HEADER_BYTES)
                res.header_fixed = True
            f.truncate(reader.valid_end)
            f.flush()
            os.fsync(f.fileno())
        res.size_after = reader.valid_end
    return res


def _refuse_link(path: str | os.PathLike[str]) -> None:
    where = os.fspath(path)
    if os.path.islink(where):
        raise RecordLogError(
            f"{where} is a symbolic link (to {os.readlink(where)}): repair changes a log in place and "
            f"does not follow links; run it on {os.path.realpath(where)}"
        )


def _rewrite(path: str) -> None:
    """Copy the valid records into a fresh file beside `path` and rename it over `path`."""
    tmp = f"{path}.{secrets.token_hex(8)}.repair-tmp"  # O_EXCL | O_NOFOLLOW: nothing planted is followed
    w = RecordWriter(tmp, durability="buffered", exclusive=True)  # raises before creating anything
    try:
        with w:
            for rec in RecordReader(path, on_damage=lambda d: None):
                w.write_record(rec)
            w.flush()
            os.fsync(w.fileno())
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
