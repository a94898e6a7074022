"""Raw msgpack values as the tolerant decoder reads them (schemas/README.md, "What a decoder must accept").

Each check takes one decoded value and the place it came from, and returns it in its contract form
(a hash as a signed int64, from a uint64 or from 8+ big-endian bytes) or raises DecodeError naming
that place; `positional_fields` maps a legacy positional event onto field names. The structs and
the decoder that builds events from these values live in kvevents.events; this module knows no
event type, so it imports nothing of the contract but its error.
"""

from __future__ import annotations

from typing import Any

from kvevents.errors import DecodeError

__all__ = [
    "INT64_MAX",
    "UINT64_MAX",
    "type_name",
    "signed_hashes",
    "signed_hash",
    "hash_value",
    "hash_list",
    "optional_hash",
    "int_value",
    "str_value",
    "token_id_list",
    "positional_fields",
]

INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
_WRAP = 2**64


def type_name(v: Any) -> str:
    """The msgpack-ish name of a value's type for an error message ("nil" for None)."""
    return "nil" if v is None else type(v).__name__


def signed_hashes(hashes: list[int]) -> list[int]:
    """Already-checked 64-bit hashes as signed int64 (uint64 values past INT64_MAX wrap); the list
    itself when none needs it."""
    if hashes and max(hashes) > INT64_MAX:
        return [h - _WRAP if h > INT64_MAX else h for h in hashes]
    return hashes


def signed_hash(h: int | None) -> int | None:
    """One already-checked 64-bit hash (or nil) as a signed int64."""
    return h - _WRAP if h is not None and h > INT64_MAX else h


def hash_value(v: Any, where: str) -> int:
    """A hash as an int64: an int in int64 or uint64 range, or the first 8 bytes of a bytes value."""
    if isinstance(v, bool):
        raise DecodeError(f"{where}: expected an integer or bytes hash, got bool")
    if isinstance(v, int):
        if v > UINT64_MAX or v < -(2**63):
            raise DecodeError(f"{where}: hash {v} does not fit in 64 bits")
        return v - _WRAP if v > INT64_MAX else v
    if isinstance(v, (bytes, bytearray, memoryview)):
        raw = bytes(v)
        if len(raw) < 8:
            raise DecodeError(f"{where}: bytes hash has {len(raw)} bytes, need at least 8")
        return int.from_bytes(raw[:8], "big", signed=True)
    raise DecodeError(f"{where}: expected an integer or bytes hash, got {type_name(v)}")


def hash_list(v: Any, where: str) -> list[int]:
    """An array of hashes, each checked by `hash_value` and named by its index."""
    if not isinstance(v, list):
        raise DecodeError(f"{where}: expected an array of hashes, got {type_name(v)}")
    return [hash_value(h, f"{where}[{i}]") for i, h in enumerate(v)]


def optional_hash(v: Any, where: str) -> int | None:
    """A hash or nil."""
    return None if v is None else hash_value(v, where)


def int_value(v: Any, where: str, *, optional: bool = False) -> Any:
    """An integer (not a bool), or nil when `optional`."""
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise DecodeError(f"{where}: expected an integer{' or nil' if optional else ''}, got {type_name(v)}")
    return v


def str_value(v: Any, where: str) -> str | None:
    """A string or nil."""
    if v is None or isinstance(v, str):
        return v
    raise DecodeError(f"{where}: expected a string or nil, got {type_name(v)}")


def token_id_list(v: Any, where: str) -> list[int]:
    """An array of integer token ids (not bools), returned as is."""
    if not isinstance(v, list):
        raise DecodeError(f"{where}: expected an array of token ids, got {type_name(v)}")
    for i, t in enumerate(v):
        if isinstance(t, bool) or not isinstance(t, int):
            raise DecodeError(f"{where}[{i}]: expected an integer token id, got {type_name(t)}")
    return v


_STORED_POSITIONS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")


def positional_fields(kind: str, items: list[Any], where: str) -> dict[str, Any]:
    """Map a legacy positional event onto field names (SGLang <= 0.5.19, vLLM <= 0.23)."""
    rest = items[1:]
    if kind == "BlockStored":
        if len(rest) < 4:
            raise DecodeError(f"{where} (positional BlockStored): {len(rest)} fields, need at least 4")
        fields = dict(zip(_STORED_POSITIONS, rest))
        for extra in rest[len(_STORED_POSITIONS) : len(_STORED_POSITIONS) + 2]:
            if isinstance(extra, dict):  # SGLang's trailing map, or our own extras map
                for key in ("cache_salt", "session_id", "lora_name"):
                    if key in extra:
                        fields[key] = extra[key]
            elif "lora_name" not in fields and (extra is None or isinstance(extra, str)):
                fields["lora_name"] = extra  # vLLM's positional lora_name
        return fields
    if kind == "BlockRemoved":
        if len(rest) < 1:
            raise DecodeError(f"{where} (positional BlockRemoved): missing block_hashes")
        return {"block_hashes": rest[0], "medium": rest[1] if len(rest) > 1 else None}
    return {}
