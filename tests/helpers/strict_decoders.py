"""Strict external decoders, declared from the engines' published field lists (not from our structs).

They model what other consumers accept: vLLM 0.33's event classes (required keys have no default),
SGLang 0.5.20's, and a batch envelope of exactly 3 elements (`forbid_unknown_fields` makes msgspec
refuse a 4th), as NVIDIA Dynamo's indexer and Rust/Go tuple decoders do. Field lists: vLLM's from
schemas/README.md ("vLLM's events"), SGLang's from the golden wire section.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

__all__ = ["VLLM_STRICT", "SGLANG_STRICT", "VllmBatch", "SGLangBatch", "decode_strict"]


class VllmStored(msgspec.Struct, tag="BlockStored"):
    """vLLM 0.33 BlockStored: the first 7 keys are required (present even when nil)."""

    block_hashes: list[Union[int, bytes]]
    parent_block_hash: Union[int, bytes, None]
    token_ids: list[int]
    block_size: int
    lora_id: Union[int, None]
    medium: Union[str, None]
    lora_name: Union[str, None]
    extra_keys: Union[list[Any], None] = None
    group_idx: Union[int, None] = None
    kv_cache_spec_kind: Union[str, None] = None
    kv_cache_spec_sliding_window: Union[int, None] = None
    locality: Union[str, None] = None
    ownership: Union[str, None] = None
    session_id: Union[str, None] = None
    lookahead_token_ids: Union[list[list[int]], None] = None


class VllmRemoved(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[Union[int, bytes]]
    medium: Union[str, None]
    group_idx: Union[int, None] = None
    locality: Union[str, None] = None
    ownership: Union[str, None] = None


class VllmCleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


class VllmBatch(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """[ts, events, data_parallel_rank]: exactly 3 elements."""

    ts: float
    events: list[Union[VllmStored, VllmRemoved, VllmCleared]]
    data_parallel_rank: Union[int, None]


class SGLangStored(msgspec.Struct, tag="BlockStored"):
    """SGLang 0.5.20 BlockStored: medium, cache_salt and session_id are optional (omitted when None)."""

    block_hashes: list[int]
    parent_block_hash: Union[int, None]
    token_ids: list[int]
    block_size: int
    lora_id: Union[int, None]
    medium: Union[str, None] = None
    cache_salt: Union[str, None] = None
    session_id: Union[str, None] = None


class SGLangRemoved(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Union[str, None] = None


class SGLangCleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


class SGLangBatch(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    ts: float
    events: list[Union[SGLangStored, SGLangRemoved, SGLangCleared]]
    data_parallel_rank: Union[int, None]


VLLM_STRICT = msgspec.msgpack.Decoder(VllmBatch)
SGLANG_STRICT = msgspec.msgpack.Decoder(SGLangBatch)


def decode_strict(payload: bytes) -> tuple[VllmBatch, SGLangBatch]:
    """Both strict decodings of one payload (msgspec.ValidationError if either refuses it)."""
    return VLLM_STRICT.decode(payload), SGLANG_STRICT.decode(payload)
