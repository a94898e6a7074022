"""Event structs, the wire encoder and a tolerant decoder (schemas/README.md, "Wire format").

The public structs mirror vLLM >= 0.26 / SGLang >= 0.5.20: events are msgpack maps tagged by
`"type"`, a batch is an array `[ts, events, data_parallel_rank]` (an opt-in 4th element carries
the publisher's epoch; see schemas/README.md, "Batch"). The keys vLLM 0.33
requires are struct fields without defaults, so msgspec always writes them; optional fields
default to None and are omitted. Decoding is tolerant (legacy positional events, uint64 or
bytes hashes, unknown keys, trailing elements) and fails only with `DecodeError`; the checks of
single raw values it builds events from live in kvevents.wire_values.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Sequence, Union

import msgspec

from kvevents.errors import DecodeError
from kvevents.wire_values import (
    INT64_MAX,
    UINT64_MAX,
    hash_list,
    int_value,
    optional_hash,
    positional_fields,
    signed_hash,
    signed_hashes,
    str_value,
    token_id_list,
    type_name,
)

__all__ = [
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "Event",
    "KVEventBatch",
    "EventEncoding",
    "encode_event",
    "encode_batch",
    "BatchEncoder",
    "decode_batch",
    "event_to_dict",
    "batch_json_schema",
    "SCHEMA_ID",
    "is_rank",
    "rank_of",
    "INT64_MAX",
    "UINT64_MAX",
]

EventEncoding = Literal["map", "array"]


Hash64 = Annotated[
    int,
    msgspec.Meta(
        ge=-(2**63),
        le=2**63 - 1,
        description="Published page hash: the first 8 SHA-256 digest bytes read big-endian as a signed int64.",
    ),
]
_Medium = Annotated[
    Union[str, None],
    msgspec.Meta(description='Cache tier: "GPU", "CPU_PINNED", "STORAGE", ... (nil when unknown).'),
]


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Pages stored: `block_hashes` in page order, chained from `parent_block_hash`."""

    block_hashes: Annotated[list[Hash64], msgspec.Meta(description="One event hash per page, in page order.")]
    parent_block_hash: Annotated[
        Union[Hash64, None],
        msgspec.Meta(description="Last event hash of the parent node; nil for a chain head (under the root)."),
    ]
    token_ids: Annotated[
        list[Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]],
        msgspec.Meta(description="The token ids of these pages, each an unsigned 32-bit value."),
    ]
    block_size: Annotated[int, msgspec.Meta(ge=1, description="Page size in tokens.")]
    lora_id: Annotated[Union[int, None], msgspec.Meta(description="LoRA adapter id, nil unless the engine sets it.")]
    medium: _Medium
    lora_name: Annotated[
        Union[str, None], msgspec.Meta(description="LoRA adapter name, nil unless the engine sets it.")
    ]
    cache_salt: Annotated[
        Union[str, None], msgspec.Meta(description="The tenant salt that seeded the event chain; omitted when nil.")
    ] = None
    session_id: Annotated[Union[str, None], msgspec.Meta(description="Engine session id; omitted when nil.")] = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Pages evicted from `medium`, each hash one page copy (of adapter `lora_name` when it is set)."""

    block_hashes: Annotated[list[Hash64], msgspec.Meta(description="Event hashes of the evicted page copies.")]
    medium: _Medium
    lora_name: Annotated[
        Union[str, None],
        msgspec.Meta(
            description=(
                "kvevents extension: the LoRA adapter the removed copies were stored under; "
                "omitted when nil (strict decoders never see it)."
            )
        ),
    ] = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Every page of the publisher is gone, on every medium."""


Event = Union[BlockStored, BlockRemoved, AllBlocksCleared]


class KVEventBatch(msgspec.Struct, array_like=True, gc=False):
    """One published step: `[ts, events, data_parallel_rank]`, exactly vLLM's and SGLang's shape.

    `epoch` is an opt-in 4th element (PublisherConfig.epoch_in_batch) that only tolerant decoders
    read; decoded as None when absent.
    """

    ts: Annotated[float, msgspec.Meta(description="Publish time, float64 seconds since the Unix epoch.")]
    events: Annotated[list[Event], msgspec.Meta(description="The step's events, in order (may be empty).")]
    data_parallel_rank: Annotated[
        Union[int, None], msgspec.Meta(description="Data-parallel rank of the publisher, or nil.")
    ] = None
    epoch: Annotated[
        Union[Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)], None],
        msgspec.Meta(
            description=(
                "kvevents opt-in extension (off by default): random id fixed per publisher lifetime. "
                "Strict 3-element decoders (vLLM, SGLang, Dynamo) reject a batch that carries it."
            )
        ),
    ] = None


SCHEMA_ID = "urn:kvevents:schema:kvevent-batch:v1"


def is_rank(data_parallel_rank: object) -> bool:
    """True for what a batch may carry as its rank: nil or a non-negative int. A bool is not a
    rank (True == 1 in Python, never on the wire: the decoders refuse it)."""
    r = data_parallel_rank
    return r is None or (isinstance(r, int) and not isinstance(r, bool) and r >= 0)


def rank_of(data_parallel_rank: object) -> int:
    """The dp rank a consumer files a batch under: the batch's rank, or 0 when it is nil or not a
    rank (`is_rank`: a bool, a negative or a non-int). The one rank rule (SGLang and vLLM send nil
    for a single rank); every consumer calls it rather than testing the rank itself."""
    r = data_parallel_rank
    return r if isinstance(r, int) and not isinstance(r, bool) and r >= 0 else 0


def batch_json_schema() -> dict[str, Any]:
    """JSON Schema (2020-12) of one batch payload, generated from the structs above.

    It describes the msgpack data model (map, array, int, float, str, nil) that the encoder writes.
    """
    schema = msgspec.json.schema(KVEventBatch)
    head: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "kvevents KV event batch",
        "description": (
            "One ZeroMQ payload (msgpack): [ts, events, data_parallel_rank], exactly 3 elements by default; "
            "a 4th element (epoch) only when the publisher opts in. Events are maps "
            'tagged by "type". Generated by `kvevents schema` from kvevents.events; see schemas/README.md.'
        ),
    }
    head.update(schema)
    return head


# ---------------------------------------------------------------- encoding

_encoder = msgspec.msgpack.Encoder()


def _event_as_array(ev: Event) -> list[Any]:
    """Legacy positional form. Unsalted stores use vLLM's layout (`..., medium, lora_name`); a store
    with cache_salt or session_id uses SGLang <= 0.5.19's (`..., medium, {"cache_salt": ...}`), with
    lora_name inside that map when set: each legacy decoder reads the streams it can represent."""
    if isinstance(ev, BlockStored):
        out: list[Any] = [
            "BlockStored",
            ev.block_hashes,
            ev.parent_block_hash,
            ev.token_ids,
            ev.block_size,
            ev.lora_id,
            ev.medium,
        ]
        if ev.cache_salt is None and ev.session_id is None:
            out.append(ev.lora_name)
            return out
        extras = {k: v for k, v in (("cache_salt", ev.cache_salt), ("session_id", ev.session_id)) if v is not None}
        if ev.lora_name is not None:
            extras["lora_name"] = ev.lora_name
        out.append(extras)
        return out
    if isinstance(ev, BlockRemoved):
        return ["BlockRemoved", ev.block_hashes, ev.medium]  # the legacy form has no lora_name
    if isinstance(ev, AllBlocksCleared):
        return ["AllBlocksCleared"]
    raise ValueError(f"not a kvevents event: {type(ev).__name__}")


def encode_event(ev: Event, *, event_encoding: EventEncoding = "map") -> bytes:
    """Encode one event (map form by default, legacy positional form with "array")."""
    if event_encoding == "array":
        return _encode(_encoder, _event_as_array(ev))
    if event_encoding != "map":
        raise ValueError(f"event_encoding must be 'map' or 'array', got {event_encoding!r}")
    if not isinstance(ev, (BlockStored, BlockRemoved, AllBlocksCleared)):
        raise ValueError(f"not a kvevents event: {type(ev).__name__}")
    return _encode(_encoder, ev)


def _encode(enc: msgspec.msgpack.Encoder, obj: Any) -> bytes:
    """msgspec encoding with its type and range errors (e.g. a hash past 64 bits) as ValueError."""
    try:
        return enc.encode(obj)
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"cannot encode event data: {exc}") from None


class BatchEncoder:
    """Reusable batch encoder; `encode` writes `[ts, events, rank]`, plus epoch only when it is given
    (the opt-in 4th element: pass None for the strict 3-element wire)."""

    __slots__ = ("_enc", "_array")

    def __init__(self, event_encoding: EventEncoding = "map") -> None:
        if event_encoding not in ("map", "array"):
            raise ValueError(f"event_encoding must be 'map' or 'array', got {event_encoding!r}")
        self._enc = msgspec.msgpack.Encoder()
        self._array = event_encoding == "array"

    def encode(
        self,
        ts: float,
        events: Sequence[Event],
        data_parallel_rank: int | None = None,
        epoch: int | None = None,
    ) -> bytes:
        evs: Any = [_event_as_array(e) for e in events] if self._array else events
        try:
            ts = float(ts)  # always float64 on the wire, even for ts=0
        except (TypeError, ValueError):
            raise ValueError(f"batch ts must be a number, got {ts!r}") from None
        if epoch is None:
            return _encode(self._enc, (ts, evs, data_parallel_rank))
        return _encode(self._enc, (ts, evs, data_parallel_rank, epoch))


_map_batch_encoder = BatchEncoder("map")
_array_batch_encoder = BatchEncoder("array")


def encode_batch(batch: KVEventBatch, *, event_encoding: EventEncoding = "map") -> bytes:
    """Encode a batch as a msgpack array; an epoch of None is left out (3 elements, like SGLang)."""
    if event_encoding == "map":
        enc = _map_batch_encoder
    elif event_encoding == "array":
        enc = _array_batch_encoder
    else:
        raise ValueError(f"event_encoding must be 'map' or 'array', got {event_encoding!r}")
    if not isinstance(batch, KVEventBatch):
        raise ValueError(f"encode_batch expects a KVEventBatch, got {type(batch).__name__}")
    return enc.encode(batch.ts, batch.events, batch.data_parallel_rank, batch.epoch)


def event_to_dict(ev: Event) -> dict[str, Any]:
    """Every field of an event as a plain dict, with `type` first (None fields included)."""
    out: dict[str, Any] = {"type": type(ev).__name__}
    for name in ev.__struct_fields__:
        out[name] = getattr(ev, name)
    return out


# ---------------------------------------------------------------- decoding: fast typed path


class _StoredIn(msgspec.Struct, tag="BlockStored", gc=False):
    block_hashes: list[int]
    token_ids: list[int]
    block_size: int
    parent_block_hash: int | None = None
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None


class _RemovedIn(msgspec.Struct, tag="BlockRemoved", gc=False):
    block_hashes: list[int]
    medium: str | None = None
    lora_name: str | None = None


class _ClearedIn(msgspec.Struct, tag="AllBlocksCleared", gc=False):
    pass


class _BatchIn(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Union[_StoredIn, _RemovedIn, _ClearedIn]]
    data_parallel_rank: int | None = None
    epoch: int | None = None


_fast_decoder = msgspec.msgpack.Decoder(_BatchIn)


def _from_fast(b: _BatchIn) -> KVEventBatch:
    events: list[Event] = []
    append = events.append
    for e in b.events:
        if type(e) is _StoredIn:
            append(
                BlockStored(
                    signed_hashes(e.block_hashes),
                    signed_hash(e.parent_block_hash),
                    e.token_ids,
                    e.block_size,
                    e.lora_id,
                    e.medium,
                    e.lora_name,
                    e.cache_salt,
                    e.session_id,
                )
            )
        elif type(e) is _RemovedIn:
            append(BlockRemoved(signed_hashes(e.block_hashes), e.medium, e.lora_name))
        else:
            append(AllBlocksCleared())
    return KVEventBatch(b.ts, events, b.data_parallel_rank, b.epoch)


# ---------------------------------------------------------------- decoding: generic tolerant path


def _stored(f: dict[str, Any], where: str) -> BlockStored:
    for key in ("block_hashes", "token_ids", "block_size"):
        if key not in f:
            raise DecodeError(f"{where} (BlockStored): missing required key {key!r}")
    return BlockStored(
        block_hashes=hash_list(f["block_hashes"], f"{where}.block_hashes"),
        parent_block_hash=optional_hash(f.get("parent_block_hash"), f"{where}.parent_block_hash"),
        token_ids=token_id_list(f["token_ids"], f"{where}.token_ids"),
        block_size=int_value(f["block_size"], f"{where}.block_size"),
        lora_id=int_value(f.get("lora_id"), f"{where}.lora_id", optional=True),
        medium=str_value(f.get("medium"), f"{where}.medium"),
        lora_name=str_value(f.get("lora_name"), f"{where}.lora_name"),
        cache_salt=str_value(f.get("cache_salt"), f"{where}.cache_salt"),
        session_id=str_value(f.get("session_id"), f"{where}.session_id"),
    )


def _removed(f: dict[str, Any], where: str) -> BlockRemoved:
    if "block_hashes" not in f:
        raise DecodeError(f"{where} (BlockRemoved): missing required key 'block_hashes'")
    return BlockRemoved(
        block_hashes=hash_list(f["block_hashes"], f"{where}.block_hashes"),
        medium=str_value(f.get("medium"), f"{where}.medium"),
        lora_name=str_value(f.get("lora_name"), f"{where}.lora_name"),
    )


def _event(raw: Any, where: str) -> Event:
    if isinstance(raw, dict):
        kind = raw.get("type")
        fields = raw
    elif isinstance(raw, list) and raw:
        kind = raw[0]
        fields = None
    else:
        raise DecodeError(f"{where}: expected an event map or array, got {type_name(raw)}")
    if kind not in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
        raise DecodeError(f"{where}: unknown event type {kind!r}")
    if fields is None:
        fields = positional_fields(kind, raw, where)
    if kind == "BlockStored":
        return _stored(fields, where)
    if kind == "BlockRemoved":
        return _removed(fields, where)
    return AllBlocksCleared()


def _slow(payload: bytes) -> KVEventBatch:
    try:
        raw = msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, RecursionError, ValueError, TypeError, OverflowError) as exc:
        raise DecodeError(f"payload is not valid msgpack: {exc}") from None
    if not isinstance(raw, list):
        raise DecodeError(f"batch: expected an array [ts, events, rank, ...], got {type_name(raw)}")
    if len(raw) < 2:
        raise DecodeError(f"batch: expected at least 2 elements [ts, events], got {len(raw)}")
    ts = raw[0]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise DecodeError(f"batch[0] (ts): expected a number, got {type_name(ts)}")
    if not isinstance(raw[1], list):
        raise DecodeError(f"batch[1] (events): expected an array, got {type_name(raw[1])}")
    events = [_event(e, f"event {i}") for i, e in enumerate(raw[1])]
    rank = int_value(raw[2], "batch[2] (data_parallel_rank)", optional=True) if len(raw) > 2 else None
    epoch = int_value(raw[3], "batch[3] (epoch)", optional=True) if len(raw) > 3 else None
    return KVEventBatch(float(ts), events, rank, epoch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode one payload into a KVEventBatch, accepting every form "What a decoder must accept" lists.

    Raises DecodeError (and nothing else) with what was wrong and where.
    """
    try:
        return _from_fast(_fast_decoder.decode(payload))
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass
    except (TypeError, ValueError, RecursionError, OverflowError):
        pass
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise DecodeError(f"payload must be bytes, got {type_name(payload)}")
    return _slow(payload)
