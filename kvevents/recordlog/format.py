"""Byte layout of a kvevents record log (version 1): the file header and the record frame.

File:   header (16 bytes) then records, append-only.
Header: magic b"KVEVLOG\\0", version u16 LE, flags u16 LE (0), CRC32 of the previous 12 bytes (u32 LE).
        A damaged header (a few flipped bits, or any damage with an intact record right after it) is
        reported and read past, since every record carries its own sync marker and CRC;
        `repair` rewrites it.
Record: sync b"\\xc3KVR" | crc32 u32 LE | length u32 LE | body (length bytes).
        The CRC covers the length field and the body, so a flipped bit anywhere but the sync
        marker fails the CRC, and a damaged length cannot make a reader accept garbage.
Body:   recv_time f64 | seq u64 | epoch i64 | dp_rank i64 | kind u8 | flags u8 |
        len(source) u16 | len(endpoint) u16 | len(topic) u16 | source | endpoint | topic | payload.
        flags bit 0/1/2: seq/epoch/dp_rank present (else None). Strings are UTF-8.
        kind "reset" records carry the reason (UTF-8) as their payload and no batch.

Resync rule (readers): a record whose sync, length or CRC is wrong is skipped; the reader scans
forward byte by byte for the next sync marker whose record passes the length bound and the CRC
(a false match needs a 2**-32 CRC collision) and resumes there. Bytes after the last valid record
that do not form a valid record are the torn tail: skipped with a warning, cut by `repair`.
Resync stays linear in the bytes skipped: a length that runs past the end of the file is refused
before any CRC, and once failed claims have cost more than the bytes read, large claims are checked
from prefix CRCs (rangecheck.py), so each byte is CRC'd a bounded number of times.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

from kvevents.errors import KVEventsError

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER_SIZE",
    "FRAME_SIZE",
    "SYNC",
    "MAX_BODY",
    "KINDS",
    "Record",
    "RecordLogError",
    "BadRecordError",
    "RecordLogWarning",
    "encode_header",
    "HEADER_BYTES",
    "check_header",
    "encode_record",
    "decode_body",
]

MAGIC = b"KVEVLOG\x00"
VERSION = 1
HEADER = struct.Struct("<8sHHI")
HEADER_SIZE = HEADER.size  # 16
SYNC = b"\xc3KVR"
FRAME = struct.Struct("<4sII")  # sync, crc, length
FRAME_SIZE = FRAME.size  # 12
FIXED = struct.Struct("<dQqqBBHHH")
FIXED_SIZE = FIXED.size  # 40
MAX_BODY = 256 * 1024 * 1024

KINDS = ("live", "replay", "snapshot", "reset")
KIND_CODES = {k: i for i, k in enumerate(KINDS)}

F_SEQ, F_EPOCH, F_RANK = 1, 2, 4
_I64_MIN, _I64_MAX, _U64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


class RecordLogError(KVEventsError, ValueError):
    """A file that is not a readable record log (missing, empty, wrong magic, truncated header...)."""


class BadRecordError(RecordLogError):
    """One record that cannot be stored (a field over its bound, a wrong type): nothing was written,
    the log and the writer are fine, so a recorder counts it and goes on."""


class RecordLogWarning(UserWarning):
    """Damage a reader skipped: a record failing its CRC, or a torn last record."""


@dataclass(slots=True, kw_only=True)
class Record:
    """One received batch (or a reset marker) as stored in the log; `payload` is the exact bytes.

    Equality compares the stored fields, not where the record sits (`index`, `offset`).
    """

    recv_time: float
    source: str
    endpoint: str
    topic: str
    seq: int | None
    epoch: int | None
    dp_rank: int | None
    kind: str
    payload: bytes
    index: int = field(default=-1, compare=False)
    offset: int = field(default=-1, compare=False)

    @property
    def reason(self) -> str | None:
        """The reset reason of a "reset" record, else None."""
        return self.payload.decode("utf-8", "replace") if self.kind == "reset" else None

    def __repr__(self) -> str:
        return (
            f"Record(index={self.index}, kind={self.kind!r}, source={self.source!r}, seq={self.seq}, "
            f"epoch={self.epoch}, dp_rank={self.dp_rank}, payload={len(self.payload)} bytes)"
        )


def encode_header() -> bytes:
    head = MAGIC + struct.pack("<HH", VERSION, 0)
    return head + struct.pack("<I", zlib.crc32(head))


HEADER_BYTES = encode_header()  # the version-1 header is one constant
MAX_HEADER_FLIPS = 8  # a header this close to HEADER_BYTES is damage, not another kind of file


def _flips(a: bytes, b: bytes) -> int:
    return sum((x ^ y).bit_count() for x, y in zip(a, b))


def check_header(data: bytes, where: str, record_follows: Callable[[], bool] | None = None) -> bool:
    """True for a valid version-1 header; False for a damaged one that is still recognisable (at
    most MAX_HEADER_FLIPS bits off, or `record_follows()` finds an intact record right after it):
    records carry their own CRC, so readers warn and go on. RecordLogError for anything else."""
    if len(data) == 0:
        raise RecordLogError(f"{where}: empty file, not a kvevents record log")
    if len(data) < HEADER_SIZE:
        n = min(len(data), len(MAGIC))
        if data[:n] != MAGIC[:n]:
            raise RecordLogError(f"{where}: wrong magic, not a kvevents record log")
        raise RecordLogError(f"{where}: truncated header ({len(data)} of {HEADER_SIZE} bytes)")
    magic, version, _flags, crc = HEADER.unpack_from(data)
    if magic == MAGIC and crc == zlib.crc32(data[:12]):
        if version != VERSION:
            raise RecordLogError(f"{where}: record log version {version} is not supported (this build reads {VERSION})")
        return True
    if _flips(data[:HEADER_SIZE], HEADER_BYTES) <= MAX_HEADER_FLIPS or (
        record_follows is not None and record_follows()
    ):
        return False
    if magic != MAGIC:
        raise RecordLogError(f"{where}: wrong magic, not a kvevents record log")
    raise RecordLogError(f"{where}: header CRC mismatch, the file header is damaged and no intact record follows it")


def _opt(value: Any, lo: int, hi: int, name: str) -> tuple[int, bool]:
    if value is None:
        return 0, False
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRecordError(f"record {name} must be an int or None, got {type(value).__name__}")
    if not lo <= value <= hi:
        return 0, False  # out of the stored range: kept only inside the payload
    return value, True


_str_cache: dict[str, bytes] = {}


def _utf8(s: str, name: str) -> bytes:
    raw = _str_cache.get(s)
    if raw is None:
        if not isinstance(s, str):
            raise BadRecordError(f"record {name} must be a str, got {type(s).__name__}")
        raw = s.encode("utf-8")
        if len(raw) > 0xFFFF:
            raise BadRecordError(f"record {name} is {len(raw)} bytes, at most 65535")
        if len(_str_cache) < 4096:
            _str_cache[s] = raw
    return raw


def encode_record(
    recv_time: float,
    source: str,
    endpoint: str,
    topic: str,
    seq: int | None,
    epoch: int | None,
    dp_rank: int | None,
    kind: str,
    payload: bytes,
) -> bytes:
    """The full framed bytes of one record."""
    code = KIND_CODES.get(kind)
    if code is None:
        raise BadRecordError(f"record kind must be one of {', '.join(KINDS)}, got {kind!r}")
    s, fs = _opt(seq, 0, _U64_MAX, "seq")
    e, fe = _opt(epoch, _I64_MIN, _I64_MAX, "epoch")
    r, fr = _opt(dp_rank, _I64_MIN, _I64_MAX, "dp_rank")
    flags = (F_SEQ if fs else 0) | (F_EPOCH if fe else 0) | (F_RANK if fr else 0)
    src, ep, tp = _utf8(source, "source"), _utf8(endpoint, "endpoint"), _utf8(topic, "topic")
    body = b"".join(
        (FIXED.pack(float(recv_time), s, e, r, code, flags, len(src), len(ep), len(tp)), src, ep, tp, payload)
    )
    if len(body) > MAX_BODY:
        raise BadRecordError(f"record of {len(body)} bytes exceeds the {MAX_BODY}-byte limit")
    n = struct.pack("<I", len(body))
    return SYNC + struct.pack("<I", zlib.crc32(body, zlib.crc32(n))) + n + body


_fixed_unpack = FIXED.unpack_from
_names: dict[bytes, tuple[str, str, str]] = {}


def decode_body(buf: bytes, start: int, end: int, index: int, offset: int) -> Record:
    """Decode a CRC-checked body buf[start:end] into a Record (RecordLogError if inconsistent)."""
    t, s, e, r, code, flags, ls, le, lt = _fixed_unpack(buf, start)
    p = start + FIXED_SIZE
    q = p + ls + le + lt
    if q > end or code >= len(KINDS):
        raise RecordLogError(f"record {index} at offset {offset}: inconsistent body")
    key = buf[start + FIXED_SIZE - 6 : q]  # the three lengths and the three strings
    names = _names.get(key)
    if names is None:
        names = (
            str(buf[p : p + ls], "utf-8", "replace"),
            str(buf[p + ls : p + ls + le], "utf-8", "replace"),
            str(buf[p + ls + le : q], "utf-8", "replace"),
        )
        if len(_names) < 4096:
            _names[key] = names
    return Record(
        recv_time=t,
        source=names[0],
        endpoint=names[1],
        topic=names[2],
        seq=s if flags & F_SEQ else None,
        epoch=e if flags & F_EPOCH else None,
        dp_rank=r if flags & F_RANK else None,
        kind=KINDS[code],
        payload=buf[q:end],
        index=index,
        offset=offset,
    )
