"""`log export --jsonl`: one JSON object per record, events decoded, for other tools."""

from __future__ import annotations

import base64
import os
from typing import Any, Callable, Iterator

import msgspec

from kvevents.errors import DecodeError
from kvevents.events import decode_batch, event_to_dict
from kvevents.recordlog.format import Record
from kvevents.recordlog.reader import Damage, RecordReader

__all__ = ["record_to_dict", "iter_jsonl"]

_json = msgspec.json.Encoder()


def record_to_dict(rec: Record, *, payload: bool = False) -> dict[str, Any]:
    """A record as plain JSON-able data; `batch` holds the decoded events or `decode_error` says why not."""
    out: dict[str, Any] = {
        "index": rec.index,
        "offset": rec.offset,
        "recv_time": rec.recv_time,
        "source": rec.source,
        "endpoint": rec.endpoint,
        "topic": rec.topic,
        "seq": rec.seq,
        "epoch": rec.epoch,
        "dp_rank": rec.dp_rank,
        "kind": rec.kind,
        "payload_len": len(rec.payload),
    }
    if rec.kind == "reset":
        out["reason"] = rec.reason
    else:
        try:
            b = decode_batch(rec.payload)
            out["batch"] = {
                "ts": b.ts,
                "events": [event_to_dict(e) for e in b.events],
                "data_parallel_rank": b.data_parallel_rank,
                "epoch": b.epoch,
            }
        except DecodeError as exc:
            out["decode_error"] = str(exc)
    if payload:
        out["payload_b64"] = base64.b64encode(rec.payload).decode("ascii")
    return out


def iter_jsonl(
    path: str | os.PathLike[str], *, payload: bool = False, on_damage: Callable[[Damage], None] | None = None
) -> Iterator[bytes]:
    """Yield one JSON line (bytes, with newline) per valid record, streaming."""
    with RecordReader(path, on_damage=on_damage) as reader:
        for rec in reader:
            yield _json.encode(record_to_dict(rec, payload=payload)) + b"\n"
