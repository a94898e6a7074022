"""Strict checks of single messages: live frames, the batch array, replay and snapshot replies.

Each function returns None when the message is right, else one line saying what is wrong. The
default batch is exactly `[ts: float64, events: array of maps tagged by "type", rank: int | nil]`;
a 4th element (kvevents' opt-in epoch) is allowed only when asked for.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvevents.errors import DecodeError
from kvevents.events import KVEventBatch, decode_batch
from kvevents.zeromq.wire import END_SEQ

__all__ = [
    "EVENT_TYPES",
    "batch_problem",
    "decode",
    "inspect_batch",
    "is_end_marker",
    "live_frames_problem",
    "raw_events",
]

EVENT_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
_REQUIRED = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size"),
    "BlockRemoved": ("block_hashes",),
}
_raw = msgspec.msgpack.Decoder()


def live_frames_problem(frames: list[bytes]) -> str | None:
    """A live message is exactly [topic, seq (8 bytes, big-endian), payload]."""
    if len(frames) != 3:
        return f"{len(frames)} frames, want 3 [topic, seq, payload]"
    if len(frames[1]) != 8:
        return f"seq frame of {len(frames[1])} bytes, want 8 (unsigned big-endian)"
    return None


def _tname(v: Any) -> str:
    return "nil" if v is None else type(v).__name__


def batch_problem(payload: bytes, *, allow_epoch: bool = False) -> str | None:
    """What makes `payload` not a strict batch (None if it is one and our decoder reads it)."""
    return inspect_batch(payload, allow_epoch=allow_epoch)[0]


def inspect_batch(payload: bytes, *, allow_epoch: bool = False) -> tuple[str | None, Any, KVEventBatch | None]:
    """(problem or None, the raw msgpack value, the decoded batch or None), decoding each way once."""
    try:
        raw = _raw.decode(payload)
    except (msgspec.DecodeError, ValueError, TypeError, RecursionError) as exc:
        return f"payload is not msgpack: {exc}", None, None
    try:
        batch: KVEventBatch | None = decode_batch(payload)
        why = ""
    except DecodeError as exc:
        batch, why = None, str(exc)
    return _raw_problem(raw, why, allow_epoch), raw, batch


def _raw_problem(raw: Any, decode_error: str, allow_epoch: bool) -> str | None:
    if not isinstance(raw, list):
        return f"batch is a msgpack {_tname(raw)}, want an array [ts, events, dp_rank]"
    n = len(raw)
    if n != 3 and not (allow_epoch and n == 4):
        want = "3 or 4 (epoch allowed)" if allow_epoch else "exactly 3 [ts, events, dp_rank]"
        return f"batch array has {n} elements, want {want}"
    if n == 4 and (isinstance(raw[3], bool) or not isinstance(raw[3], int) or raw[3] < 0):
        return f"batch[3] (epoch) is {_tname(raw[3])} {raw[3]!r}, want a non-negative int"
    if not isinstance(raw[0], float):
        return f"batch[0] (ts) is {_tname(raw[0])}, want float64"
    if not isinstance(raw[1], list):
        return f"batch[1] (events) is {_tname(raw[1])}, want an array"
    if raw[2] is not None and (isinstance(raw[2], bool) or not isinstance(raw[2], int)):
        return f"batch[2] (dp_rank) is {_tname(raw[2])}, want an int or nil"
    for i, ev in enumerate(raw[1]):
        if not isinstance(ev, dict):
            return f"event {i} is a msgpack {_tname(ev)}, want a map tagged by 'type' (positional events are legacy)"
        kind = ev.get("type")
        if kind not in EVENT_TYPES:
            return f"event {i} has type {kind!r}, want one of {', '.join(EVENT_TYPES)}"
        missing = [k for k in _REQUIRED.get(kind, ()) if k not in ev]
        if missing:
            return f"event {i} ({kind}) lacks {', '.join(missing)}"
    if decode_error:
        return f"does not decode: {decode_error}"
    return None


def raw_events(raw: Any) -> list[dict[str, Any]]:
    """The event maps of a decoded payload as plain dicts (fields our structs do not keep, e.g. extra_keys)."""
    if isinstance(raw, list) and len(raw) > 1 and isinstance(raw[1], list):
        return [e if isinstance(e, dict) else {} for e in raw[1]]
    return []


def decode(payload: bytes) -> KVEventBatch | None:
    try:
        return decode_batch(payload)
    except DecodeError:
        return None


def is_end_marker(frames: list[bytes]) -> bool:
    """A DEALER-side end marker in either replay framing: ["", "", ff*8, payload] (vLLM >= 0.26,
    kvevents) or ["", ff*8, payload] (SGLang 0.5.20, vLLM < 0.26); payload "" after a replay, S
    after a snapshot."""
    if len(frames) == 4:
        return frames[0] == b"" and frames[1] == b"" and frames[2] == END_SEQ
    return len(frames) == 3 and frames[0] == b"" and frames[1] == END_SEQ
