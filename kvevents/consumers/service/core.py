"""The consumer service: subscribe to many publishers, keep a BlockIndex, answer over HTTP.

`RouterService` is the glue: deliveries from an event feed (a kvevents Subscriber by default, or
any `kvevents.feed.EventFeed`, e.g. the JetStream feed) are applied to the index (a Reset drops
that worker's state first), the /score answer ranks workers by cost from their matched prefix,
their load and the copies predicted by earlier routing decisions (kvevents.consumers.service.scoring;
loads scraped by kvevents.consumers.scraper, or pushed: `set_inflight_source`), and a FastAPI app on uvicorn
(kvevents.consumers.service.http_api) serves POST /score, GET /workers, GET /metrics, /openapi.json and the status page. One lock
guards the index: the feed's thread applies, HTTP requests hash outside it and look up inside.
Workers are `WorkerKey`s throughout; the answers show a key as its source name and dp rank.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any, Callable, Mapping, Sequence

from kvevents.consumers.cost import CostSettings
from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.keying import SourceKeyer
from kvevents.consumers.loads import LoadBoard
from kvevents.consumers.predictions import PredictedBlocks
from kvevents.consumers.prompts import PromptRenderer
from kvevents.consumers.router import LoadHints, PrefixRouter, WorkerScore
from kvevents.consumers.scraper import MetricsScraper
from kvevents.consumers.service.freshness import Freshness
from kvevents.consumers.service.metrics import ServiceMetrics
from kvevents.consumers.service.score_body import MAX_NAME_CHARS, MAX_TOKENS, Body, ScoreBody, ScoreHead
from kvevents.consumers.service.score_request import DecodedScore, LoadEntry, ScoreRequest, decode_score
from kvevents.consumers.service.scoring import FUSED_MAX_BYTES, RoutingOptions, Scorer
from kvevents.consumers.service.seams import InflightSource
from kvevents.consumers.service.status import StatusBoard
from kvevents.consumers.service.worker_rows import worker_row
from kvevents.consumers.worker_key import WorkerKey
from kvevents.events import BlockStored, rank_of
from kvevents.feed import Delivery, EventFeed, FeedLoop, Reset, dispatch
from kvevents.published import mismatch
from kvevents.zeromq.subscriber import Source, Subscriber, parse_source

#: The router's own in-flight (prefill_blocks, decode_blocks) per worker (the proxy's accounting).

__all__ = [
    "InflightSource",
    "RouterService",
    "RoutingOptions",
    "ScoreRequest",
    "LoadEntry",
    "EventFeed",
    "parse_publisher",
    "MAX_BODY_BYTES",
    "MAX_NAME_CHARS",
    "MAX_TOKENS",
]

log = logging.getLogger("kvevents.consumers.service.core")

MAX_BODY_BYTES = 16 * 1024 * 1024


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
        routing: RoutingOptions | None = None,
        clock: Callable[[], float] = time.monotonic,
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
        self.feed: EventFeed = self._make_feed(sources, feed, stale_after_s, subscriber_options)
        self._init_counts()
        self._init_routing(routing or RoutingOptions(), page_size, seed, clock)
        self.freshness = Freshness(self.feed.status, clock)  # /score reads staleness in O(1)
        self.metrics = ServiceMetrics(self)
        self.status = StatusBoard()  # GET / and /status.json: repair activity and /score outcomes
        self._http: Any = None  # kvevents.consumers.service.http_api.HttpServer while serving
        self._status_sections: dict[str, Callable[[], Any]] = {}

    def _make_feed(
        self,
        sources: Sequence[Source | str] | None,
        feed: EventFeed | None,
        stale_after_s: float,
        subscriber_options: dict[str, Any],
    ) -> EventFeed:
        """The feed given, or a Subscriber over `sources` delivering here (kept as `self.subscriber`)."""
        self.subscriber: Subscriber | None = None
        if feed is not None:
            if subscriber_options:
                raise ValueError(f"RouterService: {sorted(subscriber_options)} apply to sources, not to a feed")
            return feed
        self.subscriber = Subscriber(
            sources or [],
            on_delivery=self._on_delivery,
            on_reset=self._on_reset,
            stale_after_s=stale_after_s,
            **subscriber_options,
        )
        return self.subscriber

    def _init_counts(self) -> None:
        """Nothing applied or asked yet: the feed pump's state and the per-source counts, empty."""
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

    def _init_routing(
        self, routing: RoutingOptions, page_size: int, seed: int | None, clock: Callable[[], float]
    ) -> None:
        """What /score weighs besides the index: pushed or scraped loads and earlier routing decisions."""
        self.routing = routing
        self.loads = LoadBoard(clock, routing.load_stale_after_s)  # kvevents.consumers.loads: newest wins per worker
        self.predictions = PredictedBlocks(routing.predicted_ttl_s, clock)  # never in the index
        self.scorer = Scorer(self, routing.cost, self.loads, self.predictions, seed)
        self.scraper = MetricsScraper(
            routing.metrics_urls, self.loads, page_size, pages_per_request=self.scorer.mean_request_pages,
            interval_s=routing.scrape_interval_s, timeout_s=routing.scrape_timeout_s,
        )  # fmt: skip

    # ---------------------------------------------------------------- feed

    def _on_delivery(self, d: Delivery) -> None:
        rank = rank_of(d.dp_rank)
        with self.lock:
            for b in self.keyer.translate(d.source, d.batch, d.payload or None):
                self.index.apply(d.source, b)
                if self.predictions.pages:
                    self._confirm(d.source, b)
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

    def _confirm(self, source: str, batch: Any) -> None:
        """The engine's own BlockStored replaces the pages predicted for that worker."""
        key = WorkerKey.of(source, batch.data_parallel_rank)
        for ev in batch.events:
            if type(ev) is BlockStored:
                self.predictions.confirm(key, ev.block_hashes, ev.lora_name)

    def _on_reset(self, r: Reset) -> None:
        rank = rank_of(r.dp_rank)  # as BlockIndex.apply
        with self.lock:
            self.index.drop_source(r.source, rank)
            self.predictions.drop_worker(r.source, rank)
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

    def set_inflight_source(self, fn: InflightSource | None) -> None:
        """The router's own in-flight count (e.g. its proxy's): `fn()` -> {WorkerKey: (prefill_blocks,
        decode_blocks)}, called once per /score outside the index lock (it must not call into this
        service). A third load source, always current (README, "Load"); None removes it."""
        self.scorer.inflight = fn

    @property
    def cost_settings(self) -> CostSettings:
        """The server's ranking settings (route --policy, --prefill-load-scale, ...)."""
        return self.scorer.settings

    @property
    def inflight_source(self) -> InflightSource | None:
        """The in-flight load source set by `set_inflight_source` (None: none)."""
        return self.scorer.inflight

    def start(self) -> RouterService:
        """Start the subscriber thread (or the feed, and a thread polling it), the load scraper and
        the stale view's refresh."""
        self.scraper.start()
        self.freshness.start()
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
        self.scraper.stop()
        self.freshness.stop()
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

    def handle_score(self, body: Body) -> tuple[int, dict[str, Any]]:
        """POST /score: (HTTP status, JSON object). Every client mistake is a 400 with a message."""
        return self.score_decoded(self.decode_score(body))

    def decode_score(self, body: Body) -> DecodedScore | str:
        """A /score body's fields and token ids (for `score_decoded`), or the 400's message."""
        return decode_score(body)

    def score_decoded(self, decoded: DecodedScore | str) -> tuple[int, dict[str, Any]]:
        """`handle_score` of a body already decoded, so the body need not be kept meanwhile."""
        if isinstance(decoded, str):
            return self._count(400, {"error": decoded})
        req, tokens = decoded
        t0 = time.perf_counter()
        try:
            out = self.answer_score(req, tokens)
        except ValueError as exc:
            return self._count(400, {"error": str(exc)})
        self.metrics.score_seconds.observe(time.perf_counter() - t0)
        workers = out["workers"]
        top_pages = workers[0]["matched_pages"] if workers else 0
        self.status.scored(top_pages)
        self.metrics.score_matched_pages.observe(top_pages)
        return self._count(200, out)

    def answer_score(
        self, req: ScoreHead | ScoreBody | ScoreRequest, tokens: bytes | list[int] | None
    ) -> dict[str, Any]:
        """The /score answer of a decoded body (ValueError: a 400): the request's pages hashed here,
        outside the index lock (packed ids up to FUSED_MAX_BYTES: inside it, as the walk reads them),
        then looked up, ranked and credited (kvevents.consumers.service.scoring)."""
        extra: dict[str, Any] = {}
        if isinstance(req, ScoreRequest) or tokens is None:  # the slow path: prompt or messages maybe
            tokens = self.request_tokens(req)  # type: ignore[arg-type]  # (only ScoreRequest gives None)
        if isinstance(tokens, bytes) and len(tokens) <= FUSED_MAX_BYTES and not req.explain:
            return self.scorer.answer(req, None, len(tokens) // 4 // self.router.page_size, extra, tokens)
        if isinstance(tokens, bytes):
            hashes = self.router.hash_packed(tokens, req.cache_salt)
        else:
            hashes = self.router.hash_array(tokens, req.cache_salt)
        if req.explain:  # the request's hashes, to show them
            extra["hashes"] = [str(h) for h in hashes.tolist()]
        pages = (len(tokens) // 4 if isinstance(tokens, bytes) else len(tokens)) // self.router.page_size
        return self.scorer.answer(req, hashes, pages, extra)

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
                mode = self.keyer.mode(name)
                bad = mismatch(sst, self.router.page_size, mode)
                for rank in ranks:
                    applied = (st.ranks.get(rank), st.epoch, st.lag_s)
                    media = counts.get(WorkerKey(name, rank), {})
                    out.append(worker_row(name, sst, rank, media, applied, now, mode, bad))
            return {"workers": out, "index": self.index.stats()}

    def adapter_counts(self) -> dict[WorkerKey, dict[str, int]]:
        """Per worker: adapter (lora_name, "" for the base model) -> block copies. O(index)."""
        with self.lock:
            return self.index.worker_adapter_counts()

    def add_status_section(self, name: str, view: Callable[[], Any]) -> None:
        """Add `name: view()` to GET /status.json (the proxy's per-worker figures)."""
        self._status_sections[name] = view

    def status_view(self) -> dict[str, Any]:
        """GET /status.json: /workers plus copies by adapter, per-source repairs, /score outcomes."""
        out = self.status.view(self)
        for name, view in self._status_sections.items():
            out[name] = view()
        return out

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
                "http": self.http_counters(),
            }

    def routing_snapshot(self) -> dict[str, Any]:
        """The cost inputs /metrics exports: scraped loads by worker label, scrapes, predicted copies."""
        now = self.loads.clock()
        loads = {
            key.label: {"prefill_blocks": ld.prefill_blocks, "decode_blocks": ld.decode_blocks,
                        "queue": ld.queue, "age_s": max(0.0, now - ld.at)}
            for key, ld in self.loads.snapshot().items()
        }  # fmt: skip
        with self.lock:
            predicted = {key.label: n for key, n in self.predictions.per_worker().items()}
            counters = dict(self.predictions.counters)
        return {
            "loads": loads,
            "scrapes": self.scraper.counters(),
            "predicted": predicted,
            "predicted_counters": counters,
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

    def http_counters(self) -> dict[str, int]:
        """The HTTP front's admission counters (`HttpServer.counters`; empty when not serving)."""
        return self._http.counters() if self._http is not None else {}

    def serve_http(
        self, host: str = "127.0.0.1", port: int = 8080, limits: Any = None, *, security: Any = None, proxy: Any = None
    ) -> tuple[str, int]:
        """Serve HTTP (FastAPI on uvicorn) on a background thread; returns the bound (host, port) (port 0:
        a free one). `limits`: a service.http_api.HttpLimits (defaults otherwise); `security`: a
        service.auth.HttpSecurity (keys, TLS); `proxy`: a service.proxy.Proxy (its /v1 endpoints too)."""
        from kvevents.consumers.service.http_api import HttpLimits, HttpServer, build_app

        if self._http is not None:
            raise ValueError("serve_http: already serving")
        limits = limits or HttpLimits(max_body_bytes=MAX_BODY_BYTES)
        server = HttpServer(build_app(self, limits, security=security, proxy=proxy), limits, security=security)
        if proxy is not None:
            server.on_stop.append(proxy.close)  # its HTTP client lives on the server's event loop
        bound = server.start(host, port)
        self._http = server
        self.status.start()  # one sample a second for the status page's last minutes
        return bound
