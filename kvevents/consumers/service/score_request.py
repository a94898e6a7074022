"""The POST /score body as pydantic reads it (ScoreRequest: the contract, its OpenAPI schema and
every 400's wording) and the decoding of a body: the fast decoders of
kvevents.consumers.service.score_body for the usual body, ScoreRequest for the rest."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvevents.consumers.prompts import MAX_MESSAGES
from kvevents.consumers.service.score_body import (
    MAX_BLOCKS,
    MAX_FACTOR,
    MAX_LOADS,
    MAX_NAME_CHARS,
    MAX_RANK,
    MAX_TOKEN_ID,
    MAX_TOKENS,
    Body,
    ScoreBody,
    ScoreHead,
    decode_fast,
    decode_packed,
)

__all__ = ["DecodedScore", "LoadEntry", "MAX_PROMPT_CHARS", "ScoreRequest", "decode_score"]

MAX_PROMPT_CHARS = 16_000_000  # a text prompt of ~4M tokens at most
TokenId = Annotated[int, Field(strict=True, ge=0, le=MAX_TOKEN_ID)]
Blocks = Annotated[float, Field(strict=True, ge=0, le=MAX_BLOCKS, allow_inf_nan=False)]
Factor = Annotated[float, Field(strict=True, ge=0, le=MAX_FACTOR, allow_inf_nan=False)]


class LoadEntry(BaseModel):
    """One worker's load as the caller knows it (the `loads` of a /score body)."""

    model_config = ConfigDict(extra="forbid")

    worker: str = Field(
        min_length=1, max_length=MAX_NAME_CHARS, description="The publisher's name (--publisher NAME=...)."
    )
    dp_rank: int = Field(0, strict=True, ge=0, le=MAX_RANK, description="Its data-parallel rank.")
    active_prefill_blocks: Blocks = Field(0.0, description="Pages still to prefill on that worker.")
    active_decode_blocks: Blocks = Field(0.0, description="Pages held by its running requests.")
    queue: int | None = Field(None, strict=True, ge=0, le=MAX_TOKENS, description="Requests waiting there.")


class ScoreRequest(BaseModel):
    """POST /score body: the request's token ids and the namespace parts a router can see."""

    model_config = ConfigDict(extra="forbid")

    tokens: list[TokenId] | None = Field(
        None, max_length=MAX_TOKENS, description="Token ids (0 .. 2**32-1) of the prompt (or `prompt`, or `messages`)."
    )
    prompt: str | None = Field(
        None,
        max_length=MAX_PROMPT_CHARS,
        description="A completion prompt as text, tokenized as the engine does (needs `route --tokenizer`).",
    )
    messages: list[dict[str, Any]] | None = Field(
        None,
        max_length=MAX_MESSAGES,
        description="A chat, rendered by the model's chat template and tokenized as the engine does "
        "(needs `route --tokenizer`).",
    )
    add_generation_prompt: bool = Field(True, description="`messages`: end with the assistant turn's opening.")
    continue_final_message: bool = Field(False, description="`messages`: continue the final message instead.")
    cache_salt: str | None = Field(
        None, max_length=MAX_NAME_CHARS, description="The tenant's cache_salt, as the engine was given it (null: none)."
    )
    lora_name: str | None = Field(
        None, max_length=MAX_NAME_CHARS, description="The LoRA adapter's name (null: the base model)."
    )
    top_k: int | None = Field(
        None, ge=1, description="List every matched worker plus this many lowest-cost others (default 8)."
    )
    explain: bool = Field(False, description="Add the request's page hashes and each worker's pages by medium.")
    policy: Literal["cost", "prefix"] | None = Field(
        None, description="cost (lowest cost first) or prefix (longest cached prefix first); null: route --policy."
    )
    prefill_load_scale: Factor | None = Field(None, description="The cost's prefill weight; null: route's.")
    temperature: Factor | None = Field(
        None, description="> 0: draw the pick by softmax over -cost/temperature; 0: lowest cost; null: route's."
    )
    loads: list[LoadEntry] | None = Field(
        None, max_length=MAX_LOADS, description="Loads the caller knows, per worker (newest wins: these are now)."
    )
    route: bool = Field(
        True, description="This answer is a routing decision: credit the pick with the request's pages for a while."
    )


#: A decoded /score body: its fields and its token ids (packed uint32 bytes on the compiled path, a
#: list otherwise, None for a prompt or chat).
DecodedScore = tuple[ScoreHead | ScoreBody | ScoreRequest, bytes | list[int] | None]


def decode_score(body: Body) -> DecodedScore | str:
    """The /score body's fields and its token ids (packed uint32 bytes on the compiled path, else a
    list; None for a prompt or chat), or the 400's message. The fast decoders take the usual body;
    ScoreRequest the rest."""
    packed = decode_packed(body)  # ~3x cheaper than pydantic at 8,192 tokens: no int object per id
    if packed is not None:
        return packed
    fast = decode_fast(body)  # not compiled, or a body the compiled reader leaves (an escaped key, ...)
    if fast is not None:
        return fast, fast.tokens
    try:
        req = ScoreRequest.model_validate_json(body if isinstance(body, (bytes, bytearray)) else bytes(body))
    except ValidationError as exc:
        first: dict[str, Any] = dict(exc.errors()[0]) if exc.error_count() else {}
        if first.get("type") == "json_invalid":
            return f"body is not valid JSON: {first.get('msg', '')}"
        return _validation_message(exc)
    return req, req.tokens


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
