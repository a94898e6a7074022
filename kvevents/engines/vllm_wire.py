"""vLLM 0.33's KV event wire, read with every field (kvevents' contract structs keep only their own).

`decode_vllm_batch` keeps what token-derived keying needs and `kvevents.events.decode_batch`
drops: `extra_keys`, `group_idx`, and hashes exactly as sent (uint64 ints or raw digest bytes,
never reinterpreted). It is tolerant like the contract decoder (map or legacy positional events,
unknown keys, 2..n element batches) and validates nothing a consumer can count instead: hash and
token types are checked by whoever uses them. `encode_vllm_batch` writes what a vLLM 0.33 worker
writes: the strict 3-element batch, map events with the required keys always present.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

import msgspec

from kvevents.errors import DecodeError

__all__ = [
    "REMOVED_FIELDS",
    "STORED_FIELDS",
    "VllmAllBlocksCleared",
    "VllmBatch",
    "VllmBlockRemoved",
    "VllmBlockStored",
    "VllmEvent",
    "decode_vllm_batch",
    "encode_vllm_batch",
    "removed_event",
    "stored_event",
]

#: BlockStored fields in vLLM 0.33's order (the first seven are required keys, even when nil).
STORED_FIELDS: tuple[str, ...] = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
)
#: BlockRemoved fields in vLLM 0.33's order (the first two required).
REMOVED_FIELDS: tuple[str, ...] = ("block_hashes", "medium", "group_idx", "locality", "ownership")
_STORED_REQUIRED = 7
_REMOVED_REQUIRED = 2


class VllmBlockStored(msgspec.Struct, tag="BlockStored", gc=False):
    """A BlockStored with every vLLM 0.33 field (and the contract's `cache_salt`); hashes as sent.

    The typed fields make the common payload decode fast; a payload that does not fit them is read
    by the generic path, which keeps whatever was sent (consumers count what they cannot use)."""

    block_hashes: list[Union[int, bytes]]
    parent_block_hash: Union[int, bytes, None] = None
    token_ids: list[int] = msgspec.field(default_factory=list)
    block_size: Any = None
    lora_id: Any = None
    medium: Any = None
    lora_name: Any = None
    extra_keys: Any = None
    group_idx: Any = None
    kv_cache_spec_kind: Any = None
    kv_cache_spec_sliding_window: Any = None
    locality: Any = None
    ownership: Any = None
    session_id: Any = None
    lookahead_token_ids: Any = None
    cache_salt: Any = None


class VllmBlockRemoved(msgspec.Struct, tag="BlockRemoved", gc=False):
    """A BlockRemoved as sent (vLLM's GPU pool sends one hash per event)."""

    block_hashes: list[Union[int, bytes]]
    medium: Any = None
    group_idx: Any = None
    locality: Any = None
    ownership: Any = None
    lora_name: Any = None


class VllmAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", gc=False):
    """reset_prefix_cache(): every block of the worker is gone."""


VllmEvent = Union[VllmBlockStored, VllmBlockRemoved, VllmAllBlocksCleared]


class VllmBatch(msgspec.Struct, array_like=True, gc=False):
    """`[ts, events, data_parallel_rank]`; trailing elements (an epoch, a publisher id) are ignored."""

    ts: float
    events: list[VllmEvent]
    data_parallel_rank: int | None = None


_decoder = msgspec.msgpack.Decoder(VllmBatch)
_encoder = msgspec.msgpack.Encoder()


def _positional(raw: list[Any], where: str) -> VllmEvent:
    kind, rest = raw[0], raw[1:]
    if kind == "BlockStored":
        if len(rest) < 4:
            raise DecodeError(f"{where} (positional BlockStored): {len(rest)} fields, need at least 4")
        fields = dict(zip(STORED_FIELDS, rest))
        for name in ("lora_name", "extra_keys"):  # SGLang's trailing {"cache_salt": ...} map sits here
            extra = fields.get(name)
            if isinstance(extra, dict):
                fields[name] = None
                fields["cache_salt"] = extra.get("cache_salt")
                fields["lora_name"] = extra.get("lora_name", fields.get("lora_name"))
        return VllmBlockStored(**fields)
    if kind == "BlockRemoved":
        if not rest:
            raise DecodeError(f"{where} (positional BlockRemoved): missing block_hashes")
        return VllmBlockRemoved(**dict(zip(REMOVED_FIELDS, rest)))
    if kind == "AllBlocksCleared":
        return VllmAllBlocksCleared()
    raise DecodeError(f"{where}: unknown event type {kind!r}")


def _generic_event(raw: Any, where: str) -> VllmEvent:
    if isinstance(raw, list) and raw:
        ev = _positional(raw, where)
    elif isinstance(raw, dict):
        kind = raw.get("type")
        cls = {
            "BlockStored": VllmBlockStored,
            "BlockRemoved": VllmBlockRemoved,
            "AllBlocksCleared": VllmAllBlocksCleared,
        }.get(kind)  # type: ignore[arg-type]
        if cls is None:
            raise DecodeError(f"{where}: unknown event type {kind!r}")
        names = cls.__struct_fields__
        ev = cls(**{k: v for k, v in raw.items() if k in names})  # type: ignore[operator]
    else:
        raise DecodeError(f"{where}: expected an event map or array, got {type(raw).__name__}")
    if not isinstance(ev, VllmAllBlocksCleared) and not isinstance(ev.block_hashes, list):
        raise DecodeError(f"{where}: block_hashes is not an array")
    return ev


def decode_vllm_batch(payload: bytes) -> VllmBatch:
    """Decode one payload with every vLLM field kept; DecodeError (only) when it is not a batch."""
    try:
        return _decoder.decode(payload)
    except (msgspec.ValidationError, msgspec.DecodeError, TypeError, ValueError, RecursionError, OverflowError):
        pass
    try:
        raw = msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, TypeError, ValueError, RecursionError, OverflowError) as exc:
        raise DecodeError(f"payload is not valid msgpack: {exc}") from None
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise DecodeError("batch: expected an array [ts, events, rank, ...]")
    ts, rank = raw[0], raw[2] if len(raw) > 2 else None
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise DecodeError(f"batch[0] (ts): expected a number, got {type(ts).__name__}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
        raise DecodeError(f"batch[2] (data_parallel_rank): expected an int or nil, got {type(rank).__name__}")
    try:
        events = [_generic_event(e, f"event {i}") for i, e in enumerate(raw[1])]
    except TypeError as exc:
        raise DecodeError(f"malformed event: {exc}") from None
    return VllmBatch(float(ts), events, rank)


def stored_event(
    block_hashes: Sequence[int | bytes],
    parent_block_hash: int | bytes | None,
    token_ids: Sequence[int],
    block_size: int,
    *,
    lora_id: int | None = None,
    medium: str | None = "GPU",
    lora_name: str | None = None,
    **optional: Any,
) -> dict[str, Any]:
    """A BlockStored map in vLLM 0.33's key order: required keys always, optional ones when not None."""
    out: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": list(block_hashes),
        "parent_block_hash": parent_block_hash,
        "token_ids": list(token_ids),
        "block_size": block_size,
        "lora_id": lora_id,
        "medium": medium,
        "lora_name": lora_name,
    }
    unknown = set(optional) - set(STORED_FIELDS[_STORED_REQUIRED:])
    if unknown:
        raise ValueError(f"not a vLLM 0.33 BlockStored field: {sorted(unknown)[0]!r}")
    for name in STORED_FIELDS[_STORED_REQUIRED:]:
        if optional.get(name) is not None:
            out[name] = optional[name]
    return out


def removed_event(block_hashes: Sequence[int | bytes], medium: str | None = "GPU", **optional: Any) -> dict[str, Any]:
    """A BlockRemoved map in vLLM 0.33's key order (vLLM's GPU pool: one hash per event)."""
    out: dict[str, Any] = {"type": "BlockRemoved", "block_hashes": list(block_hashes), "medium": medium}
    unknown = set(optional) - set(REMOVED_FIELDS[_REMOVED_REQUIRED:])
    if unknown:
        raise ValueError(f"not a vLLM 0.33 BlockRemoved field: {sorted(unknown)[0]!r}")
    for name in REMOVED_FIELDS[_REMOVED_REQUIRED:]:
        if optional.get(name) is not None:
            out[name] = optional[name]
    return out


def encode_vllm_batch(ts: float, events: Sequence[dict[str, Any]], data_parallel_rank: int | None = None) -> bytes:
    """The strict 3-element batch `[ts (float64), events, rank]` a vLLM 0.33 worker publishes."""
    try:
        return _encoder.encode((float(ts), list(events), data_parallel_rank))
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"cannot encode vLLM events: {exc}") from None
