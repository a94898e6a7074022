"""A simulated serving engine: multi-tenant workloads and workers that own a RadixCache and a store.

KV page content is deterministic bytes derived from (extra_key, page position, tokens up to the
page), so a page served across extra keys is caught as wrong content (`content_ok` False and
counted), whether it came from the device tree or the storage tier. Everything is seeded and
synchronous: the same seed gives the same requests, hits and events.
"""

from __future__ import annotations

import hashlib
import random
import struct
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate, islice
from typing import Any, Iterator, Sequence

from kvevents.cache import MemoryStore, PageStore, RadixCache
from kvevents.events import Event
from kvevents.hashing import Namespace, pack_tokens

__all__ = [
    "Request",
    "Workload",
    "SimWorker",
    "ServeResult",
    "page_content",
    "expected_content",
    "ENGINES",
    "make_worker",
    "serve_and_publish",
]

#: `kvevents serve --engine`: contract (SimWorker) or vllm (a vLLM 0.33-faithful VllmSimWorker).
ENGINES = ("contract", "vllm")

_U64 = struct.Struct("<Q")
_DOMAIN = b"kvevents-sim-kv-v1"


def _key_field(extra_key: str | None) -> bytes:
    if extra_key is None:
        return b"\x00"
    raw = extra_key.encode("utf-8")
    return b"\x01" + _U64.pack(len(raw)) + raw


def page_content(namespace: Namespace, packed: bytes, page_size: int) -> list[bytes]:
    """Simulated KV bytes per whole page: a chain over (extra_key, position, page tokens).

    Each page's bytes depend on every token up to its end (through the chain) and on its position;
    cache_salt does not change KV content (same model), only who may share it.
    """
    step = page_size * 4
    prev = hashlib.sha256(_DOMAIN + _key_field(namespace.extra_key)).digest()
    out: list[bytes] = []
    view = memoryview(packed)
    for i, off in enumerate(range(0, len(packed) - len(packed) % step, step)):
        h = hashlib.sha256(prev)
        h.update(_U64.pack(i))
        h.update(view[off : off + step])
        prev = h.digest()
        out.append(prev)
    return out


def expected_content(token_ids: Sequence[int], namespace: Namespace, page_size: int) -> list[bytes]:
    """The content every whole page of this request must have."""
    return page_content(namespace, pack_tokens(token_ids), page_size)


@dataclass
class _Session:
    """A multi-turn conversation: each turn's prompt extends the previous prompt and answer."""

    tokens: list[int]
    namespace: Namespace
    lora_name: str | None
    session_id: str
    turns: int = 1


@dataclass(frozen=True)
class Request:
    """One request: its tokens, namespace and the metadata carried into events."""

    tokens: list[int]
    namespace: Namespace = field(default_factory=Namespace)
    lora_name: str | None = None
    session_id: str | None = None


class Workload:
    """Seeded infinite stream of multi-tenant requests (iterate it, or `take(n)` for the first n).

    Shared system prompts with Zipf-like popularity, LoRA adapters as extra keys, tenant salts,
    multi-turn sessions whose next prompt extends the previous prompt and answer.
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        page_size: int = 16,
        adapters: Sequence[str] = ("lora-a", "lora-b", "lora-c"),
        salts: Sequence[str | None] = (None, "tenant-a", "tenant-b"),
        num_system_prompts: int = 32,
        system_prompt_pages: tuple[int, int] = (2, 16),
        user_tokens: tuple[int, int] = (8, 200),
        answer_tokens: tuple[int, int] = (16, 200),
        adapter_share: float = 0.4,
        session_continue: float = 0.5,
        max_turns: int = 6,
        max_sessions: int = 256,
        zipf_s: float = 1.1,
        vocab_size: int = 32000,
    ) -> None:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be an integer >= 1, got {page_size!r}")
        if not salts:
            raise ValueError("salts must list at least one salt (None is the no-salt tenant)")
        if num_system_prompts < 1 or max_turns < 1 or max_sessions < 1 or vocab_size < 2:
            raise ValueError("num_system_prompts, max_turns, max_sessions must be >= 1, vocab_size >= 2")
        for lo_hi, name in (
            (system_prompt_pages, "system_prompt_pages"),
            (user_tokens, "user_tokens"),
            (answer_tokens, "answer_tokens"),
        ):
            if len(lo_hi) != 2 or lo_hi[0] < 0 or lo_hi[1] < lo_hi[0]:
                raise ValueError(f"{name} must be (low, high) with 0 <= low <= high, got {lo_hi!r}")
        self.seed = seed
        self.page_size = page_size
        self.adapters = tuple(adapters)
        self.salts = tuple(salts)
        self.num_system_prompts = num_system_prompts
        self.system_prompt_pages = system_prompt_pages
        self.user_tokens = user_tokens
        self.answer_tokens = answer_tokens
        self.adapter_share = adapter_share if self.adapters else 0.0
        self.session_continue = session_continue
        self.max_turns = max_turns
        self.max_sessions = max_sessions
        self.zipf_s = zipf_s
        self.vocab_size = vocab_size

    def _tokens(self, rng: random.Random, n: int) -> list[int]:
        v = self.vocab_size
        return [rng.randrange(v) for _ in range(n)]

    def __iter__(self) -> Iterator[Request]:
        rng = random.Random(self.seed)
        prompts = [
            self._tokens(rng, rng.randint(*self.system_prompt_pages) * self.page_size)
            for _ in range(self.num_system_prompts)
        ]
        cum = list(accumulate(1.0 / (i + 1) ** self.zipf_s for i in range(self.num_system_prompts)))
        total = cum[-1]
        sessions: list[_Session] = []
        counter = 0
        while True:
            if sessions and rng.random() < self.session_continue:
                i = rng.randrange(len(sessions))
                s = sessions[i]
                answer = self._tokens(rng, rng.randint(*self.answer_tokens))
                s.tokens = s.tokens + answer + self._tokens(rng, rng.randint(*self.user_tokens))
                s.turns += 1
                if s.turns >= self.max_turns:  # the conversation ends
                    sessions[i] = sessions[-1]
                    sessions.pop()
                yield Request(list(s.tokens), s.namespace, s.lora_name, s.session_id)
                continue
            prompt = prompts[min(bisect_left(cum, rng.random() * total), len(prompts) - 1)]
            salt = self.salts[rng.randrange(len(self.salts))]
            adapter = self.adapters[rng.randrange(len(self.adapters))] if rng.random() < self.adapter_share else None
            ns = Namespace(adapter, salt)
            counter += 1
            sid = f"s{self.seed}-{counter}"
            tokens = prompt + self._tokens(rng, rng.randint(*self.user_tokens))
            if self.max_turns > 1:
                if len(sessions) >= self.max_sessions:  # forget a random old conversation
                    sessions[rng.randrange(len(sessions))] = sessions[-1]
                    sessions.pop()
                sessions.append(_Session(tokens, ns, adapter, sid))
            yield Request(list(tokens), ns, adapter, sid)

    def take(self, n: int) -> list[Request]:
        """The first `n` requests of this seed (always the same ones)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        return list(islice(iter(self), n))


@dataclass(frozen=True)
class ServeResult:
    """What one request got: device hits, storage hits (after the device), content check."""

    num_tokens: int
    device_hit_tokens: int
    storage_hit_tokens: int
    content_ok: bool
    cached_before: int = 0


class SimWorker:
    """A simulated engine worker: a RadixCache (device), a page store, content checks.

    `store=None` gives the worker a private MemoryStore; pass one store to several workers to
    model a shared storage tier. Not thread-safe: drive each worker from one thread.
    """

    def __init__(
        self,
        name: str,
        *,
        page_size: int = 16,
        capacity_pages: int | None = 4096,
        store: PageStore | None = None,
        medium: str = "GPU",
        storage_events: bool = False,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"worker name must be a non-empty str, got {name!r}")
        self.name = name
        self.page_size = page_size
        if store is None:
            # a private store, bounded at 16x the device unless storage events are on (a bounded
            # MemoryStore drops pages silently, which STORAGE events could not report)
            bound = None if capacity_pages is None or storage_events else 16 * max(capacity_pages, 1)
            store = MemoryStore(capacity_pages=bound)
        self.store = store
        self._memo: tuple[Namespace, bytes, list[bytes]] | None = None
        self.cache = RadixCache(
            page_size,
            medium=medium,
            capacity_pages=capacity_pages,
            store=store,
            storage_events=storage_events,
            page_content=self._content,
        )
        self.content_errors = 0
        self.requests = 0
        self.restarts = 0
        self.tokens = 0
        self.device_hit_tokens = 0
        self.storage_hit_tokens = 0

    def _content(self, ns: Namespace, packed: bytes, page_size: int) -> list[bytes]:
        """page_content with a one-request memo: serve() and the cache's insert share the work."""
        memo = self._memo
        if memo is not None and memo[0] == ns and memo[1].startswith(packed):
            return memo[2][: len(packed) // (page_size * 4)]
        out = page_content(ns, packed, page_size)
        self._memo = (ns, packed, out)
        return out

    def serve(self, request: Request) -> ServeResult:
        """Match on device, prefetch the rest from storage, check content, insert the request."""
        tokens, ns = request.tokens, request.namespace
        cache = self.cache
        m = cache.match_prefix(tokens, ns)
        packed = pack_tokens(tokens)
        expected = self._content(ns, packed[: len(packed) // (self.page_size * 4) * self.page_size * 4], self.page_size)
        ok = m.page_data == expected[: len(m.page_data)]
        # continue the storage chain after the device match; a root-only match starts from the
        # request's own namespace seed (prior None), never from another namespace's node
        pages = cache.prefetch_pages(tokens[m.num_tokens :], ns, m.last_storage_hash)
        start = m.num_tokens // self.page_size
        if pages and pages != expected[start : start + len(pages)]:
            ok = False
        cached = cache.insert(tokens, ns, lora_name=request.lora_name, session_id=request.session_id)
        if not ok:
            self.content_errors += 1
        res = ServeResult(len(tokens), m.num_tokens, len(pages) * self.page_size, ok, cached)
        self.requests += 1
        self.tokens += res.num_tokens
        self.device_hit_tokens += res.device_hit_tokens
        self.storage_hit_tokens += res.storage_hit_tokens
        return res

    def take_events(self) -> list[Event]:
        """The events queued since the last take (coalesced by the cache)."""
        return self.cache.take_events()

    def restart(self) -> None:
        """A crash: the device cache is reset (AllBlocksCleared); the store survives."""
        self.cache.reset()
        self.restarts += 1

    def stats(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "tokens": self.tokens,
            "device_hit_tokens": self.device_hit_tokens,
            "storage_hit_tokens": self.storage_hit_tokens,
            "content_errors": self.content_errors,
            "restarts": self.restarts,
            "device_pages": self.cache.num_pages,
        }


def make_worker(
    engine: str,
    name: str,
    *,
    page_size: int = 16,
    capacity_pages: int = 4096,
    hash_algo: str = "sha256",
    dp_rank: int = 0,
) -> Any:
    """A simulated worker of `engine`: SimWorker (the contract) or VllmSimWorker (vLLM 0.33's hashes
    and events, published as vLLM encodes them, rank `dp_rank` in its batches)."""
    if engine == "contract":
        return SimWorker(name, page_size=page_size, capacity_pages=capacity_pages)
    if engine == "vllm":
        from kvevents.sim.vllm import VllmSimWorker

        return VllmSimWorker(
            name, block_size=page_size, capacity_blocks=capacity_pages, hash_algo=hash_algo, dp_rank=dp_rank
        )
    raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")


def serve_and_publish(worker: Any, request: Request, publisher: Any) -> int | None:
    """One engine step: serve `request` on either kind of worker and publish what it queued
    (a vLLM worker's own payload as is); returns the seq, or None when nothing was published."""
    if hasattr(worker, "take_payload"):
        worker.serve_request(request)
        payload = worker.take_payload(time.time())
        return None if payload is None else publisher.publish_payload(payload)
    worker.serve(request)
    events = worker.take_events()
    return publisher.publish(events) if events else None
