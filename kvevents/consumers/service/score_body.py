"""The POST /score body's limits, and its fast decoders (msgspec) for the usual well-formed body.

The pydantic model in kvevents.consumers.service.score_request (ScoreRequest) stays the contract: it documents the
body (OpenAPI) and words every 400. The decoders here accept only what ScoreRequest accepts (strict
types, the same bounds, no unknown field) and return None for anything else, which the service
then hands to ScoreRequest. `decode_packed` (compiled only) finds the top-level token array and
reads its ids straight into the packed uint32 form the page hash needs (no int object per id; the
GIL let go for a long body, issue 28), then decodes the other fields from the rest of the body;
`decode_fast` builds the list. At 8,192 tokens: ScoreRequest ~350 us, decode_fast ~170 us,
decode_packed ~100 us; at 4M tokens decode_packed holds the GIL for well under a millisecond.
"""

from __future__ import annotations

import mmap
import re
import struct
from typing import Annotated, Literal, Union

import msgspec

from kvevents import native

__all__ = [
    "Body",
    "MAX_BLOCKS",
    "MAX_FACTOR",
    "MAX_LOADS",
    "MAX_NAME_CHARS",
    "MAX_RANK",
    "MAX_TOKENS",
    "MAX_TOKEN_ID",
    "LoadItem",
    "ScoreBody",
    "ScoreHead",
    "decode_fast",
    "decode_packed",
    "pack_json_ids_py",
    "split_json_tokens_py",
]

MAX_NAME_CHARS = 256  # lora_name / cache_salt longer than this are refused (400): per-request strings stay small
MAX_TOKENS = 4_000_000
MAX_TOKEN_ID = 2**32 - 1
MAX_LOADS = 65_536  # `loads` entries in one body
MAX_BLOCKS = 1e12  # a load's blocks
MAX_FACTOR = 1e6  # prefill_load_scale, temperature
MAX_RANK = 2**31 - 1

#: A /score body as the server holds it: bytes, or the buffer a long one is read into.
Body = Union[bytes, bytearray, mmap.mmap]
_Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)]
_TopK = Annotated[int, msgspec.Meta(ge=1)]
_Blocks = Annotated[float, msgspec.Meta(ge=0, le=MAX_BLOCKS)]
_Factor = Annotated[float, msgspec.Meta(ge=0, le=MAX_FACTOR)]


class LoadItem(msgspec.Struct, forbid_unknown_fields=True):
    """One `loads` entry as kvevents.consumers.service.load_entry.LoadEntry accepts it."""

    worker: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_CHARS)]
    dp_rank: Annotated[int, msgspec.Meta(ge=0, le=MAX_RANK)] = 0
    active_prefill_blocks: _Blocks = 0.0
    active_decode_blocks: _Blocks = 0.0
    queue: Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS)] | None = None


_Loads = Annotated[list[LoadItem], msgspec.Meta(max_length=MAX_LOADS)]


class ScoreBody(msgspec.Struct, forbid_unknown_fields=True):
    """A /score body as ScoreRequest would accept it (a subset: ScoreRequest's lax top_k/explain go there)."""

    tokens: Annotated[list[Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKEN_ID)]], msgspec.Meta(max_length=MAX_TOKENS)]
    cache_salt: _Name | None = None
    lora_name: _Name | None = None
    top_k: _TopK | None = None
    explain: bool = False
    policy: Literal["cost", "prefix"] | None = None
    prefill_load_scale: _Factor | None = None
    temperature: _Factor | None = None
    loads: _Loads | None = None
    route: bool = True


class ScoreHead(msgspec.Struct, forbid_unknown_fields=True):
    """A /score body's other fields (its token array is read apart, by `split_json_tokens`)."""

    tokens: msgspec.Raw
    cache_salt: _Name | None = None
    lora_name: _Name | None = None
    top_k: _TopK | None = None
    explain: bool = False
    policy: Literal["cost", "prefix"] | None = None
    prefill_load_scale: _Factor | None = None
    temperature: _Factor | None = None
    loads: _Loads | None = None
    route: bool = True


_decoder = msgspec.json.Decoder(ScoreBody)
_head_decoder = msgspec.json.Decoder(ScoreHead)
_IDS = re.compile(
    rb"[ \t\n\r]*\[[ \t\n\r]*(?:(?:0|[1-9][0-9]{0,9})(?:[ \t\n\r]*,[ \t\n\r]*(?:0|[1-9][0-9]{0,9}))*)?[ \t\n\r]*\][ \t\n\r]*"
)


def decode_fast(body: Body) -> ScoreBody | None:
    """The body decoded, or None when it is not a plainly valid one (ScoreRequest then decides)."""
    try:
        return _decoder.decode(body)
    except msgspec.MsgspecError:
        return None


def decode_packed(body: Body) -> tuple[ScoreHead, bytes] | None:
    """The body's other fields and its token ids as little-endian uint32 bytes; None when not
    compiled or when the body is not plainly valid (its tokens the plain form, its keys unescaped)."""
    if not native.active():
        return None
    found = native.split_json_tokens(body)
    if found is None:
        return None
    start, stop, packed = found
    if len(packed) > 4 * MAX_TOKENS:
        return None
    try:
        head = _head_decoder.decode(b"".join((body[:start], b"[]", body[stop:])))
    except msgspec.MsgspecError:
        return None
    return head, packed


def pack_json_ids_py(text: bytes) -> bytes | None:
    """The pure-Python twin of native.pack_json_u32: uint32 bytes of a JSON array of plain ids
    (digits only, no leading zero, 0..2**32-1, JSON whitespace), None for any other text."""
    if _IDS.fullmatch(text) is None:
        return None
    inner = text.strip(b" \t\n\r")[1:-1]
    ids = [int(part) for part in inner.split(b",")] if inner.strip(b" \t\n\r") else []
    if any(i > MAX_TOKEN_ID for i in ids):
        return None
    return struct.pack(f"<{len(ids)}I", *ids)


_WS = b" \t\n\r"


def split_json_tokens_py(body: bytes) -> tuple[int, int, bytes] | None:
    """The pure-Python twin of native.split_json_tokens: (start, stop, packed ids) of the top-level
    "tokens" array of a JSON object with plain keys and one "tokens" key, None for any other text."""
    i, n, found = _ws(body, 0), len(body), None
    end: int | None
    if body[i : i + 1] != b"{":
        return None
    i = _ws(body, i + 1)
    while True:
        after = _skip_string(body, i)
        if after is None or b"\\" in body[i:after]:
            return None
        key, i = body[i + 1 : after - 1], _ws(body, after)
        if body[i : i + 1] != b":":
            return None
        i = _ws(body, i + 1)
        if key == b"tokens":
            stop = _array_end(body, i)
            if found is not None or stop is None or (ids := pack_json_ids_py(body[i:stop])) is None:
                return None
            found, end = (i, stop, ids), stop
        else:
            end = _skip_value(body, i)
            if end is None:
                return None
        i = _ws(body, end)
        if body[i : i + 1] == b"}":
            return found if _ws(body, i + 1) == n else None
        if body[i : i + 1] != b",":
            return None
        i = _ws(body, i + 1)


def _ws(body: bytes, i: int) -> int:
    while i < len(body) and body[i] in _WS:
        i += 1
    return i


def _skip_string(body: bytes, i: int) -> int | None:
    """Past the string opening at i, or None (not one, or unterminated)."""
    if body[i : i + 1] != b'"':
        return None
    i += 1
    while i < len(body):
        c = body[i]
        if c == 0x22:
            return i + 1
        i += 2 if c == 0x5C else 1
    return None


def _array_end(body: bytes, i: int) -> int | None:
    """Past a bracketed run of digits, commas and whitespace opening at i (pack_json_ids_py judges it)."""
    if body[i : i + 1] != b"[":
        return None
    stop = body.find(b"]", i)
    return stop + 1 if stop >= 0 else None


def _skip_value(body: bytes, i: int) -> int | None:
    """Past the value at i, following only its structure (brackets matched, at most 64 deep)."""
    stack: list[int] = []
    while True:
        if i >= len(body):
            return None
        c = body[i]
        if c == 0x22:
            if (j := _skip_string(body, i)) is None:
                return None
            i = j
        elif c in b"{[":
            if len(stack) == 64:
                return None
            stack.append(0x7D if c == 0x7B else 0x5D)
            i += 1
        elif c in b"}]":
            if not stack or stack.pop() != c:
                return None
            i += 1
        elif stack:
            i += 1
        else:
            while i < len(body) and body[i] not in b",}]" and body[i] not in _WS:
                i += 1
        if not stack:
            return i
