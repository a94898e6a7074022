"""The consumer service: subscribe to many publishers, keep a BlockIndex, answer over HTTP.

`RouterService` is the glue: deliveries from an event feed (a kvevents Subscriber by default, or
any `kvevents.feed.EventFeed`, e.g. the JetStream feed) are applied to the index (a Reset drops
that worker's state first), a PrefixRouter scores requests, and a FastAPI app on uvicorn
(kvevents.consumers.service.http_api) serves POST /score, GET /workers, GET /metrics, /openapi.json and the status page. One lock
guards the index: the feed's thread applies, HTTP requests hash outside it and look up inside.
Workers are `WorkerKey`s throughout; the answers show a key as its source name and dp rank.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Annotated, Any, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.keying import SourceKeyer
from kvevents.consumers.prompts import MAX_MESSAGES, PromptRenderer
from kvevents.consumers.router import LoadHints, PrefixRouter, WorkerScore
from kvevents.consumers.service.metrics import ServiceMetrics
from kvevents.consumers.service.score_body import (
    MAX_NAME_CHARS,
    MAX_TOKEN_ID,
    MAX_TOKENS,
    ScoreBody,
    ScoreHead,
    decode_fast,
    decode_packed,
)
from kvevents.consumers.service.status import StatusBoard
from kvevents.consumers.worker_key import WorkerKey
from kvevents.events import rank_of
from kvevents.feed import Delivery, EventFeed, FeedLoop, Reset, dispatch
from kvevents.published import mismatch
from kvevents.zeromq.subscriber import Source, Subscriber, parse_source

__all__ = [
    "RouterService",
    "ScoreRequest",
    "EventFeed",
    "parse_publisher",
    "MAX_BODY_BYTES",
    "MAX_NAME_CHARS",
    "MAX_TOKENS",
]

log = logging.getLogger("kvevents.consumers.service.core")

MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_PROMPT_CHARS = 16_000_000  # a text prompt of ~4M tokens at most
TokenId = Annotated[int, Field(strict=True, ge=0, le=MAX_TOKEN_ID)]


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
    top_k: int | None = Field(None, ge=1, description="Return only the best k workers.")
    explain: bool = Field(False, description="Add the request's page hashes and each worker's pages by medium.")


def parse_publisher(spec: str) -> Source:
    """`NAME=ENDPOINT[,REPLAY]` -> Source (ValueError with the spec on a malformed one)."""
    return parse_source(spec, require_name=True)


class _SourceState:
    __slots__ = ("last_seq", "epoch", "lag_s", "last_applied_at", "ranks")

    def __init__(self) -> None:
        self.last_seq: int | None = None
        self.epoch: int | None = None
        self.lag_s: float | None = None
        self.last_applied_at: float | None = None
        self.ranks: dict[int, int] = {}  # dp_rank -> last applied seq


class RouterService:
    """An event feed + BlockIndex + PrefixRouter (+ HTTP when `serve_http` is called).

    Give `sources` (a Subscriber is built over them, `subscriber_options` passed on) or `feed`
    (any EventFeed, e.g. another transport's consumer; the service polls it on its own thread).
    """

    def __init__(
        self,
        sources: Sequence[Source | str] | None = None,
        *,
        feed: EventFeed | None = None,
        page_size: int = 16,
        lora_strict: bool = True,
        medium_weights: Mapping[str, float] | None = None,
        seed: int | None = None,
        stale_after_s: float = 5.0,
        key_modes: Mapping[str, str] | None = None,
        default_key_mode: str = "contract",
        renderer: PromptRenderer | None = None,
        **subscriber_options: Any,
    ) -> None:
        if (sources is None) == (feed is None):
            raise ValueError("RouterService: give either sources or feed")
        self.index = BlockIndex()
        self.renderer = renderer  # text and chat prompts -> token ids (route --tokenizer)
        # per-source keying (kvevents.consumers.keying): contract, tokens (any engine's hashes) or auto-detected
        self.keyer = SourceKeyer(page_size, default_mode=default_key_mode, modes=key_modes)
        self.router = PrefixRouter(
            self.index, page_size, medium_weights=medium_weights, lora_strict=lora_strict, seed=seed
        )
        self.lock = threading.Lock()
        self.subscriber: Subscriber | None = None
        if feed is None:
            self.subscriber = Subscriber(
                sources or [],
                on_delivery=self._on_delivery,
                on_reset=self._on_reset,
                stale_after_s=stale_after_s,
                **subscriber_options,
            )
        elif subscriber_options:
            raise ValueError(f"RouterService: {sorted(subscriber_options)} apply to sources, not to a feed")
        self.feed: EventFeed = feed if feed is not None else self.subscriber  # type: ignore[assignment]
        self._pump: threading.Thread | None = None
        self._stop = threading.Event()
        self._pump_counters: Counter[str] = Counter()  # loop_errors, callback_errors of the feed pump
        self._state: dict[str, _SourceState] = {}
        self._batches: Counter[tuple[str, str]] = Counter()
        self._resets: Counter[tuple[str, str]] = Counter()
        self._count_lock = threading.Lock()  # HTTP threads count requests
        self._score_requests: Counter[int] = Counter()
        self._stale_seen: dict[str, bool] = {}
        self.events_applied = 0
        self.metrics = ServiceMetrics(self)
        self.status = StatusBoard()  # GET / and /status.json: repair activity and /score outcomes
        self._http: Any = None  # kvevents.consumers.service.http_api.HttpServer while serving

    # ---------------------------------------------------------------- feed

    def _on_delivery(self, d: Delivery) -> None:
        rank = rank_of(d.dp_rank)
        with self.lock:
            self.keyer.apply(self.index, d.source, d.batch, d.payload or None)
            st = self._state.get(d.source)
            if st is None:
                st = self._state[d.source] = _SourceState()
            st.last_seq = d.seq
            st.ranks[rank] = d.seq
            st.epoch = d.epoch
            st.last_applied_at = time.time()
            if d.kind != "snapshot" and d.received_at:  # replayed batches lag too; snapshots are rebuilt
                st.lag_s = max(0.0, d.received_at - d.batch.ts)
            self._batches[(d.source, d.kind)] += 1
            self.status.delivered(d.source, d.kind)
            self.events_applied += len(d.batch.events)

    def _on_reset(self, r: Reset) -> None:
        rank = rank_of(r.dp_rank)  # as BlockIndex.apply
        with self.lock:
            self.index.drop_source(r.source, rank)
            self.keyer.reset(r.source, rank)
            self._resets[(r.source, r.reason)] += 1
            self.status.reset(r.source, r.reason)
            st = self._state.get(r.source)
            if st is not None:
                st.ranks.pop(rank, None)

    def process(self, timeout_s: float = 0.0) -> int:
        """Drive the feed without a thread: poll once and apply (kvevents.feed.dispatch: an item
        that fails to apply is logged, counted and skipped); returns items handled."""
        items = list(self.feed.poll(timeout_s))
        failed = dispatch(items, self._on_delivery, self._on_reset)
        if failed:
            self._pump_counters["callback_errors"] += failed
        return len(items)

    def applied_seq(self, source: str, dp_rank: int = 0) -> int | None:
        """The last seq applied for (source, dp_rank), or None (none yet, or reset since)."""
        with self.lock:
            st = self._state.get(source)
            return None if st is None else st.ranks.get(dp_rank)

    def start(self) -> RouterService:
        """Start the subscriber thread (or the feed, and a thread polling it)."""
        if self.subscriber is not None:
            self.subscriber.start()
            return self
        if self._pump is None:
            self.feed.start()
            loop = FeedLoop(
                self.feed.poll, self._on_delivery, self._on_reset, stop=self._stop, counters=self._pump_counters,
                logger=log, name="kvevents-route-feed",
            )  # fmt: skip
            self._pump = loop.start()
        return self

    def stop(self) -> None:
        """Stop HTTP (if serving) and the feed; closes every socket."""
        if self._http is not None:
            self._http.stop()
            self._http = None
        self.status.stop()
        self._stop.set()
        if self._pump is not None:
            self._pump.join(2.0)
            self._pump = None
        self.feed.stop()

    def __enter__(self) -> RouterService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- queries

    def score(
        self,
        tokens: Sequence[int],
        cache_salt: str | None = None,
        lora_name: str | None = None,
        *,
        loads: LoadHints | None = None,
    ) -> list[WorkerScore]:
        """Rank workers for a request (ValueError on bad token ids); `loads` breaks ties."""
        t0 = time.perf_counter()
        with self.lock:
            ranked = self.router.score(tokens, cache_salt, lora_name, loads=loads)
        self.metrics.score_seconds.observe(time.perf_counter() - t0)
        return ranked

    def handle_score(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """POST /score: (HTTP status, JSON object). Every client mistake is a 400 with a message.

        The request is hashed outside the index lock and looked up inside it.
        """
        decoded = _decode_score(body)
        if isinstance(decoded, str):
            return self._count(400, {"error": decoded})
        req, tokens = decoded
        t0 = time.perf_counter()
        extra: dict[str, Any] = {}
        try:
            if isinstance(req, ScoreRequest) or tokens is None:  # the slow path: prompt or messages maybe
                tokens = self.request_tokens(req)  # type: ignore[arg-type]  # (only ScoreRequest gives None)
            if req.explain:  # the hashes as a list, to show them (packed ids never come with explain)
                hashes: Any = self.router.request_hashes(tokens, req.cache_salt)  # type: ignore[arg-type]
                extra["hashes"] = [str(h) for h in hashes]
            elif isinstance(tokens, bytes):
                hashes = self.router.hash_packed(tokens, req.cache_salt)
            else:
                hashes = self.router.hash_array(tokens, req.cache_salt)
            with self.lock:
                ranked = self.router.score_hashes(hashes, req.lora_name)
        except ValueError as exc:
            return self._count(400, {"error": str(exc)})
        self.metrics.score_seconds.observe(time.perf_counter() - t0)
        stale = {name: st.stale for name, st in self.feed.status().items()}
        if req.top_k is not None:
            ranked = ranked[: req.top_k]
        workers = []
        for w in ranked:
            name = w.key.source
            entry: dict[str, Any] = {
                "worker": name,
                "dp_rank": w.key.dp_rank,
                "score": round(w.score, 6),
                "matched_pages": w.matched_pages,
                "matched_tokens": w.matched_tokens,
                "load": w.load,
                "stale": stale.get(name, False),
            }
            if req.explain:
                entry["pages_by_medium"] = dict(w.pages_by_medium)
            workers.append(entry)
        best = workers[0] if workers and workers[0]["matched_pages"] else None
        top_pages = workers[0]["matched_pages"] if workers else 0
        self.status.scored(top_pages)
        self.metrics.score_matched_pages.observe(top_pages)
        out = {
            "pages": (len(tokens) // 4 if isinstance(tokens, bytes) else len(tokens)) // self.router.page_size,
            "page_size": self.router.page_size,
            "best": best["worker"] if best else None,
            "best_dp_rank": best["dp_rank"] if best else None,
            "stale": any(stale.values()),
            "workers": workers,
            **extra,
        }
        return self._count(200, out)

    def request_tokens(self, req: ScoreRequest) -> list[int]:
        """The request's token ids: given, or its `prompt` / `messages` through the model's tokenizer
        (kvevents.consumers.prompts); ValueError (a 400) when none or several are given."""
        given = [name for name in ("tokens", "prompt", "messages") if getattr(req, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of tokens, prompt, messages (got {', '.join(given) or 'none'})")
        if req.tokens is not None:
            return req.tokens
        if self.renderer is None:
            raise ValueError(f"`{given[0]}` needs a tokenizer: start the router with --tokenizer DIR, or send tokens")
        if req.prompt is not None:
            return self.renderer.encode_prompt(req.prompt)
        return self.renderer.encode_chat(
            req.messages,
            add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
            continue_final_message=req.continue_final_message,
        )

    def _count(self, status: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._count_lock:
            self._score_requests[status] += 1
        return status, body

    def score_request_schema(self) -> dict[str, Any]:
        """JSON Schema of the POST /score body (for the OpenAPI document)."""
        return ScoreRequest.model_json_schema()

    def stale_changes(self) -> list[tuple[str, bool]]:
        """(source, stale now) for every source whose staleness changed since the last call."""
        changes = []
        for name, st in self.feed.status().items():
            was = self._stale_seen.get(name, False)
            if st.stale != was:
                changes.append((name, st.stale))
            self._stale_seen[name] = st.stale
        return changes

    def workers_view(self) -> dict[str, Any]:
        """GET /workers: per worker (source name + dp rank) blocks by medium, last seq, epoch, lag, stale,
        the replay framing its publisher answers in ("4-frame" | "3-frame", null: none seen yet), what
        it publishes (page size, hash chain, a mismatch with this router) and a likely misconfiguration."""
        status = self.feed.status()
        now = time.time()
        with self.lock:
            counts = self.index.worker_block_counts()
            out: list[dict[str, Any]] = []
            for name, sst in status.items():
                st = self._state.get(name, _SourceState())
                ranks = sorted(st.ranks) or [0]  # a source with nothing applied yet shows as rank 0
                for rank in ranks:
                    media = counts.get(WorkerKey(name, rank), {})
                    out.append(
                        {
                            "worker": name,
                            "dp_rank": rank,
                            "endpoint": sst.endpoint,
                            "blocks": sum(media.values()),
                            "blocks_by_medium": media,
                            "last_seq": st.ranks.get(rank),
                            "epoch": st.epoch,
                            "lag_s": None if st.lag_s is None else round(st.lag_s, 6),
                            "last_heard_age_s": None if sst.last_heard is None else round(now - sst.last_heard, 3),
                            "stale": sst.stale,
                            "repairing": sst.busy,
                            "key_mode": self.keyer.mode(name),  # contract | tokens | auto (still detecting)
                            # the form of its replay replies (kvevents.zeromq.framing), null until one came
                            "replay_framing": sst.replay_framing,
                            # what it publishes (kvevents.published) and why this router cannot use it
                            "published": {
                                "page_size": sst.page_size,
                                "hash_chain": sst.hash_chain,
                                "mismatch": mismatch(sst, self.router.page_size, self.keyer.mode(name)),
                            },
                            "problem": sst.problem,  # a likely misconfiguration its sockets saw
                        }
                    )
            return {"workers": out, "index": self.index.stats()}

    def adapter_counts(self) -> dict[WorkerKey, dict[str, int]]:
        """Per worker: adapter (lora_name, "" for the base model) -> block copies. O(index)."""
        with self.lock:
            return self.index.worker_adapter_counts()

    def status_view(self) -> dict[str, Any]:
        """GET /status.json: /workers plus copies by adapter, per-source repairs, /score outcomes."""
        return self.status.view(self)

    def metrics_snapshot(self) -> dict[str, Any]:
        """Everything /metrics exports, read under the lock at scrape time."""
        status = self.feed.status()
        with self._count_lock:
            score_requests = dict(self._score_requests)
        with self.lock:
            sources = {
                name: {
                    "last_seq": self._state[name].last_seq if name in self._state else None,
                    "lag_s": self._state[name].lag_s if name in self._state else None,
                    "stale": sst.stale,
                }
                for name, sst in status.items()
            }
            return {
                "batches": dict(self._batches),
                "resets": dict(self._resets),
                "index": dict(self.index.counters),
                "blocks": self.index.block_counts(),
                "entries": self.index.distinct_hashes,
                "sources": sources,
                "subscriber": self._feed_counters(),
                "score_requests": score_requests,
            }

    def _feed_counters(self) -> dict[str, int]:
        """The feed's counters, plus the errors of the service's own pump (a feed without a thread)."""
        out = dict(self.feed.counters())
        for key, n in self._pump_counters.items():
            out[key] = out.get(key, 0) + n
        return out

    def stats(self) -> dict[str, Any]:
        """Plain counters for reports: batches by kind, resets by reason, index counters."""
        with self.lock:
            kinds: Counter[str] = Counter()
            for (_, kind), n in self._batches.items():
                kinds[kind] += n
            reasons: Counter[str] = Counter()
            for (_, reason), n in self._resets.items():
                reasons[reason] += n
            return {
                "batches": dict(kinds),
                "events_applied": self.events_applied,
                "resets": dict(reasons),
                "index": dict(self.index.counters),
                "copies": len(self.index),
                "keying": self.keyer.stats(),
            }

    # ---------------------------------------------------------------- HTTP

    def serve_http(self, host: str = "127.0.0.1", port: int = 8080, limits: Any = None) -> tuple[str, int]:
        """Serve HTTP (FastAPI on uvicorn) on a background thread; returns the bound (host, port)
        (port 0: a free one). `limits`: a kvevents.consumers.service.http_api.HttpLimits (defaults otherwise)."""
        from kvevents.consumers.service.http_api import HttpLimits, HttpServer, build_app

        if self._http is not None:
            raise ValueError("serve_http: already serving")
        limits = limits or HttpLimits(max_body_bytes=MAX_BODY_BYTES)
        server = HttpServer(build_app(self, limits), limits)
        bound = server.start(host, port)
        self._http = server
        self.status.start()  # one sample a second for the status page's last minutes
        return bound


def _decode_score(body: bytes) -> tuple[ScoreHead | ScoreBody | ScoreRequest, bytes | list[int] | None] | str:
    """The /score body's fields and its token ids (packed uint32 bytes on the compiled path, else a
    list; None for a prompt or chat), or the 400's message. The fast decoders take the usual body;
    ScoreRequest the rest."""
    packed = decode_packed(body)  # ~3x cheaper than pydantic at 8,192 tokens: no int object per id
    if packed is not None:
        return packed
    fast = decode_fast(body)  # explain, or not compiled
    if fast is not None:
        return fast, fast.tokens
    try:
        req = ScoreRequest.model_validate_json(body)
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
