"""Repair a damaged log: cut a torn tail (always), optionally rewrite without corrupt regions."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kvevents.recordlog.reader import Damage, RecordReader
from kvevents.recordlog.writer import RecordWriter

__all__ = ["RepairResult", "repair_log"]


@dataclass
class RepairResult:
    """What repair found and did; `changed` is False for a clean log."""

    path: str
    records: int
    size_before: int
    size_after: int
    torn_bytes: int = 0
    corrupt: list[Damage] = field(default_factory=list)
    rewritten: bool = False

    @property
    def changed(self) -> bool:
        return self.size_after != self.size_before or self.rewritten


def repair_log(path: str | os.PathLike[str], *, drop_corrupt: bool = False, dry_run: bool = False) -> RepairResult:
    """Truncate the torn tail of `path` in place (fsynced); with drop_corrupt, also rewrite the file
    keeping only valid records (atomic rename). Corrupt regions in the middle are otherwise kept:
    readers skip them, and the bytes stay for forensics."""
    found: list[Damage] = []
    reader = RecordReader(path, on_damage=found.append)
    try:
        for _ in reader:
            pass
    finally:
        reader.close()
    torn = sum(d.length for d in found if d.kind == "torn")
    corrupt = [d for d in found if d.kind == "corrupt"]
    res = RepairResult(reader.path, reader.records, reader.size, reader.size, torn, corrupt)
    if dry_run:
        res.size_after = reader.valid_end
        return res
    if drop_corrupt and corrupt:
        tmp = reader.path + ".repair-tmp"
        with RecordWriter(tmp, durability="buffered") as w:
            for rec in RecordReader(path, on_damage=lambda d: None):
                w.write_record(rec)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, reader.path)
        res.rewritten = True
        res.size_after = os.path.getsize(reader.path)
        return res
    if torn:
        with open(reader.path, "r+b") as f:
            f.truncate(reader.valid_end)
            f.flush()
            os.fsync(f.fileno())
        res.size_after = reader.valid_end
    return res
