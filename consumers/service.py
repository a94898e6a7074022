"""The consumer service: subscribe to many publishers, keep a BlockIndex, answer over HTTP.

`RouterService` is the glue: Subscriber deliveries are applied to the index (a Reset drops that
source's state first), a PrefixRouter scores requests, and a standard-library ThreadingHTTPServer
serves POST /score, GET /workers and GET /metrics. One lock guards the index: the subscriber
thread applies, HTTP threads score.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Annotated, Any, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvevents.subscriber import Delivery, Reset, Source, Subscriber, parse_source

from consumers.indexer import BlockIndex, worker_label
from consumers.metrics import CONTENT_TYPE, ServiceMetrics
from consumers.router import PrefixRouter, WorkerScore

__all__ = ["RouterService", "ScoreRequest", "parse_publisher", "MAX_BODY_BYTES"]

log = logging.getLogger("consumers.service")

MAX_BODY_BYTES = 16 * 1024 * 1024
TokenId = Annotated[int, Field(strict=True, ge=0, le=2**32 - 1)]


class ScoreRequest(BaseModel):
    """POST /score body: the request's token ids and namespace parts the router can see."""

    model_config = ConfigDict(extra="forbid")

    tokens: list[TokenId] = Field(max_length=4_000_000)
    cache_salt: str | None = None
    lora_name: str | None = None
    top_k: int | None = Field(None, ge=1)
    explain: bool = False


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
    """Subscriber + BlockIndex + PrefixRouter (+ HTTP when `serve_http` is called)."""

    def __init__(
        self,
        sources: Sequence[Source | str],
        *,
        page_size: int = 16,
        lora_strict: bool = True,
        medium_weights: Mapping[str, float] | None = None,
        seed: int | None = None,
        stale_after_s: float = 5.0,
        **subscriber_options: Any,
    ) -> None:
        self.index = BlockIndex()
        self.router = PrefixRouter(self.index, page_size, medium_weights=medium_weights, lora_strict=lora_strict, seed=seed)
        self.lock = threading.Lock()
        self.subscriber = Subscriber(
            sources,
            on_delivery=self._on_delivery,
            on_reset=self._on_reset,
            stale_after_s=stale_after_s,
            **subscriber_options,
        )
        self._state: dict[str, _SourceState] = {}
        self._batches: Counter[tuple[str, str]] = Counter()
        self._resets: Counter[tuple[str, str]] = Counter()
        self._score_requests: Counter[int] = Counter()
        self.events_applied = 0
        self.metrics = ServiceMetrics(self)
        self._http: ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None

    # ---------------------------------------------------------------- feed

    def _on_delivery(self, d: Delivery) -> None:
        rank = d.dp_rank if isinstance(d.dp_rank, int) and d.dp_rank >= 0 else 0
        with self.lock:
            self.index.apply(d.source, d.batch)
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
            self.events_applied += len(d.batch.events)

    def _on_reset(self, r: Reset) -> None:
        rank = r.dp_rank if isinstance(r.dp_rank, int) and r.dp_rank >= 0 else 0  # as BlockIndex.apply
        with self.lock:
            self.index.drop_source(r.source, rank)
            self._resets[(r.source, r.reason)] += 1
            st = self._state.get(r.source)
            if st is not None:
                st.ranks.pop(rank, None)

    def process(self, timeout_s: float = 0.0) -> int:
        """Drive the subscriber without its thread: poll once and apply; returns items handled."""
        items = self.subscriber.poll(timeout_s)
        for item in items:
            if isinstance(item, Delivery):
                self._on_delivery(item)
            else:
                self._on_reset(item)
        return len(items)

    def applied_seq(self, source: str, dp_rank: int = 0) -> int | None:
        """The last seq applied for (source, dp_rank), or None (none yet, or reset since)."""
        with self.lock:
            st = self._state.get(source)
            return None if st is None else st.ranks.get(dp_rank)

    def start(self) -> "RouterService":
        """Start the subscriber thread."""
        self.subscriber.start()
        return self

    def stop(self) -> None:
        """Stop HTTP (if serving) and the subscriber; closes every socket."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            if self._http_thread is not None:
                self._http_thread.join(2.0)
            self._http = None
        self.subscriber.stop()

    def __enter__(self) -> "RouterService":
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
        loads: Mapping[str, float] | None = None,
    ) -> list[WorkerScore]:
        """Rank workers for a request (ValueError on bad token ids); `loads` breaks ties."""
        t0 = time.perf_counter()
        with self.lock:
            ranked = self.router.score(tokens, cache_salt, lora_name, loads=loads)
        self.metrics.score_seconds.observe(time.perf_counter() - t0)
        return ranked

    def handle_score(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """POST /score: (HTTP status, JSON object). Every client mistake is a 400 with a message."""
        try:
            raw = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            return self._count(400, {"error": f"body is not valid JSON: {exc}"})
        try:
            req = ScoreRequest.model_validate(raw)
        except ValidationError as exc:
            return self._count(400, {"error": _validation_message(exc)})
        try:
            if req.explain:
                with self.lock:
                    out = self.router.explain(req.tokens, req.cache_salt, req.lora_name)
                out["hashes"] = [str(h) for h in out["hashes"]]
                workers = out["workers"]
            else:
                ranked = self.score(req.tokens, req.cache_salt, req.lora_name)
                workers = [s.as_dict() for s in ranked]
                out = {"pages": len(req.tokens) // self.router.page_size}
        except ValueError as exc:
            return self._count(400, {"error": str(exc)})
        if req.top_k is not None:
            workers = workers[: req.top_k]
        out["workers"] = workers
        out["best"] = workers[0]["worker"] if workers and workers[0]["matched_pages"] else None
        return self._count(200, out)

    def _count(self, status: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self._score_requests[status] += 1
        return status, body

    def workers_view(self) -> dict[str, Any]:
        """GET /workers: per worker blocks (by medium), last seq, epoch, lag, stale."""
        status = self.subscriber.status()
        now = time.time()
        with self.lock:
            counts = self.index.block_counts()
            out: dict[str, Any] = {}
            for name, sst in status.items():
                st = self._state.get(name, _SourceState())
                ranks = sorted(st.ranks) or [0]  # a source with nothing applied yet shows as rank 0
                for rank in ranks:
                    label = worker_label(name, rank)
                    media = counts.get(label, {})
                    out[label] = {
                        "source": name,
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
                    }
            return {"workers": out, "index": self.index.stats()}

    def metrics_snapshot(self) -> dict[str, Any]:
        """Everything /metrics exports, read under the lock at scrape time."""
        status = self.subscriber.status()
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
                "subscriber": self.subscriber.counters(),
                "score_requests": dict(self._score_requests),
            }

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
            }

    # ---------------------------------------------------------------- HTTP

    def serve_http(self, host: str = "127.0.0.1", port: int = 8080) -> tuple[str, int]:
        """Serve HTTP on a background thread; returns the bound (host, port) (port 0: ephemeral)."""
        if self._http is not None:
            raise ValueError("serve_http: already serving")
        handler = type("Handler", (_Handler,), {"service": self})
        try:
            self._http = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise ValueError(f"cannot serve HTTP on {host}:{port}: {exc.strerror or exc}") from None
        self._http.daemon_threads = True
        self._http_thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, name="kvevents-route-http", daemon=True
        )
        self._http_thread.start()
        bound = self._http.server_address
        return str(bound[0]), int(bound[1])


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


class _Handler(BaseHTTPRequestHandler):
    service: RouterService
    protocol_version = "HTTP/1.1"
    server_version = "kvevents-route"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s - %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode() + b"\n")

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        try:
            self._get()
        except Exception as exc:  # noqa: BLE001 - a bug must answer 500, not drop the connection
            log.exception("GET %s failed", self.path)
            self._json(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})

    def _get(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/workers":
            self._json(200, self.service.workers_view())
        elif path == "/metrics":
            self._send(200, self.service.metrics.render(), CONTENT_TYPE)
        elif path in ("/", "/healthz"):
            self._json(200, {"ok": True, "endpoints": ["POST /score", "GET /workers", "GET /metrics"]})
        else:
            self._json(404, {"error": f"no such path: {path}"})

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        path = self.path.split("?", 1)[0]
        if path != "/score":
            self._drain()
            self._json(404, {"error": f"no such path: {path} (POST /score)"})
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            self._json(411, {"error": "a Content-Length header is required"})
            return
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            self._json(413, {"error": f"body of {length} bytes exceeds {MAX_BODY_BYTES}"})
            return
        body = self.rfile.read(length)
        try:
            status, obj = self.service.handle_score(body)
        except Exception as exc:  # noqa: BLE001 - a bug must answer 500, not drop the connection
            log.exception("POST /score failed")
            status, obj = 500, {"error": f"internal error: {type(exc).__name__}: {exc}"}
        self._json(status, obj)

    def _drain(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = 0
        if 0 < length <= MAX_BODY_BYTES:
            self.rfile.read(length)
