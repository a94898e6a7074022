"""What the proxy reads from an OpenAI request to route it: the /score body it asks the router,
and the size of the prompt when the router cannot tokenize it.

A completion's `prompt` as token ids is scored as it is; as text, and a chat's `messages`, through
the router's tokenizer (route --tokenizer: the service renders them as the engine does). Without a
tokenizer, or for a prompt the renderer refuses, the request is routed by load alone, and its size
is estimated at 4 bytes of text per token. `model` names a LoRA adapter unless it is a base model
(`ModelNames`: what the workers' /v1/models list without a `parent`); `cache_salt` is the tenant's
salt, as vLLM takes it. The request's body is forwarded unchanged: the engine tokenizes it itself.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["BYTES_PER_TOKEN", "ModelNames", "RoutePlan", "plan_request"]

BYTES_PER_TOKEN = 4  # the size estimate of a prompt the router cannot tokenize
MODELS_REFRESH_S = 60.0  # the base models are asked again after this, when an unknown name shows up


@dataclass
class RoutePlan:
    """How to rank the workers for one request."""

    score: dict[str, Any] | None  # the /score body (tokens, prompt or messages), None: by load only
    stream: bool
    model: str | None
    extra_tokens: int  # tokens of a batch's further prompts (scored: the first one)
    estimated_tokens: int  # the prompt's estimated size when it is not scored
    why_unscored: str | None = None

    def pages(self, scored_pages: int | None, page_size: int) -> int:
        """The request's pages: the router's count of the scored prompt, else the estimate."""
        base = scored_pages if scored_pages is not None else math.ceil(self.estimated_tokens / page_size)
        return base + math.ceil(self.extra_tokens / page_size)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _text_size(value: Any) -> int:
    """Estimated tokens of a text, or of every string in a chat's messages."""
    if isinstance(value, str):
        return math.ceil(len(value.encode("utf-8", "replace")) / BYTES_PER_TOKEN)
    if isinstance(value, dict):
        return sum(_text_size(v) for v in value.values())
    if isinstance(value, list):
        return sum(_text_size(v) for v in value)
    return 0


def _completion(body: dict[str, Any], tokenizer: bool) -> tuple[dict[str, Any] | None, int, int, str | None]:
    """(score body part, extra tokens, estimated tokens, why unscored) of /v1/completions."""
    prompt = body.get("prompt")
    batch = prompt if isinstance(prompt, list) and prompt and all(isinstance(p, (list, str)) for p in prompt) else None
    first = batch[0] if batch is not None else prompt
    extra = sum(len(p) if _is_ids(p) else _text_size(p) for p in batch[1:]) if batch is not None else 0
    if _is_ids(first):
        return {"tokens": first}, extra, 0, None
    if isinstance(first, str):
        if tokenizer:
            return {"prompt": first}, extra, 0, None
        return None, extra, _text_size(first), "no tokenizer"
    return None, extra, _text_size(prompt), "prompt is neither text nor token ids"


def _chat(body: dict[str, Any], tokenizer: bool) -> tuple[dict[str, Any] | None, int, int, str | None]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None, 0, 0, "messages is not a list"
    if not tokenizer:
        return None, 0, _text_size(messages), "no tokenizer"
    part: dict[str, Any] = {"messages": messages}
    for name in ("add_generation_prompt", "continue_final_message"):  # vLLM's chat request fields
        if isinstance(body.get(name), bool):
            part[name] = body[name]
    return part, 0, 0, None


def plan_request(kind: str, body: dict[str, Any], *, tokenizer: bool, lora_name: str | None) -> RoutePlan:
    """The routing plan of a /v1/completions (`kind` "completions") or /v1/chat/completions ("chat") body."""
    part, extra, estimated, why = (_completion if kind == "completions" else _chat)(body, tokenizer)
    salt = body.get("cache_salt")
    score = None
    if part is not None:
        score = {**part, "lora_name": lora_name}
        if isinstance(salt, str):
            score["cache_salt"] = salt
    model = body.get("model") if isinstance(body.get("model"), str) else None
    return RoutePlan(score, body.get("stream") is True, model, extra, estimated, why)


class ModelNames:
    """Which model names are base models (lora_name None) and which are adapters, as the workers'
    /v1/models say: an entry with a `parent` (vLLM's listing of a LoRA adapter) is an adapter, any
    other a base model. A name no worker listed is taken as an adapter (the simulated worker's
    rule: any model but its own is an adapter). Until a listing arrives, every name is a base model."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._base: set[str] = set()
        self._adapters: set[str] = set()
        self._asked_at: float | None = None

    def learn(self, entries: Iterable[Any]) -> None:
        """Entries of a /v1/models `data` list."""
        base: set[str] = set()
        adapters: set[str] = set()
        for e in entries:
            if isinstance(e, dict) and isinstance(e.get("id"), str):
                (adapters if e.get("parent") else base).add(e["id"])
        with self._lock:
            self._base, self._adapters = base, adapters
            self._asked_at = self.clock()

    def asked(self) -> None:
        """A listing was asked for (and may have failed): do not ask again for a while."""
        with self._lock:
            self._asked_at = self.clock()

    def should_ask(self, model: str | None) -> bool:
        """True when no listing was asked yet, or `model` is unknown and the last one is old."""
        with self._lock:
            if self._asked_at is None:
                return True
            known = model is None or model in self._base or model in self._adapters
            return not known and self.clock() - self._asked_at >= MODELS_REFRESH_S

    def lora_name(self, model: str | None) -> str | None:
        with self._lock:
            if model is None or model in self._base or not (self._base or self._adapters):
                return None
            return model
