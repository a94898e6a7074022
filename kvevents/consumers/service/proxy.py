"""The OpenAI-compatible proxy of `kvevents route --proxy`: /v1/completions, /v1/chat/completions
and /v1/models on the router's HTTP front, each request sent to the worker the router ranks best.

A request is scored by the service as POST /score would score it (kvevents.consumers.service.
proxy_request says what is read from the body), then sent, body unchanged, to the first ranked
worker that has a URL (kvevents.consumers.service.proxy_targets) by one pooled httpx.AsyncClient on
the server's event loop. A ranking by prefix alone (no `cost` in its entries) gives ties to the
worker with fewer blocks in flight; in a cost ranking a worker the index has not listed yet (a
--worker-url heard of before its publisher) goes where its own cost puts it. A connection that
fails before the answer's head arrives is retried on the next worker (up to `attempts` workers); once a head arrived, never. The answer goes
back as it comes: an event stream chunk by chunk, anything else whole, with `x-kvevents-worker` and
`x-kvevents-dp-rank`. While a request is in flight its blocks count as its worker's load
(kvevents.consumers.service.proxy_stats), which the service reads through `set_inflight_source`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse
from starlette.requests import ClientDisconnect

from kvevents.consumers.service.metrics import ProxyMetrics
from kvevents.consumers.service.proxy_request import ModelNames, RoutePlan, plan_request
from kvevents.consumers.service.proxy_stats import InflightBook, ProxyStats, Ticket
from kvevents.consumers.service.proxy_targets import Targets, WorkerUrl
from kvevents.consumers.service.seams import ProxyService
from kvevents.consumers.worker_key import WorkerKey

if TYPE_CHECKING:  # pragma: no cover
    from kvevents.consumers.service.http_api import HttpLimits

__all__ = ["Proxy", "ProxyConfig", "WORKER_HEADER", "RANK_HEADER"]

log = logging.getLogger("kvevents.consumers.service.proxy")

WORKER_HEADER, RANK_HEADER = "x-kvevents-worker", "x-kvevents-dp-rank"
INLINE_BODY_BYTES = 64 * 1024  # a longer body is scored on the thread pool (tokenizing takes a while)
# hop-by-hop headers (RFC 9110 7.6.1) and the ones the two connections set for themselves
_DROP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers"}
    | {"transfer-encoding", "upgrade", "host", "content-length", "date", "server"}
)
_json = msgspec.json.Encoder()


@dataclass(frozen=True)
class ProxyConfig:
    """How the proxy talks to the workers (defaults in the README's "The proxy")."""

    attempts: int = 3  # workers tried for one request when connections fail
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0  # longest wait for the next byte of an answer (route --upstream-timeout)
    down_for_s: float = 5.0  # a worker whose connection failed is tried last for this long
    max_connections: int = 1000  # connections to all workers at once (pooled, kept alive)

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.max_connections < 1:
            raise ValueError("ProxyConfig: attempts and max_connections must be >= 1")
        if not (self.connect_timeout_s > 0 and self.read_timeout_s > 0 and self.down_for_s >= 0):
            raise ValueError("ProxyConfig: timeouts must be > 0")


@dataclass(frozen=True)
class _Row:
    """A worker the proxy may try: its place in the answer, score, key, URL, matched pages, cost."""

    pos: int
    score: float
    key: WorkerKey
    url: str
    matched: int
    cost: float


@dataclass(frozen=True)
class _Candidate:
    key: WorkerKey
    url: str
    prefill: int
    decode: int


class _Failed(Exception):
    def __init__(self, kind: str, detail: str, retry: bool) -> None:
        super().__init__(detail)
        self.kind, self.retry = kind, retry


def _decode(body: bytes) -> Any:
    """The request's JSON: msgspec (~3x faster on token lists), else the standard library, which
    takes what msgspec refuses but an engine may not (numbers past 64 bits)."""
    try:
        return msgspec.json.decode(body)
    except msgspec.DecodeError:
        return json.loads(body)


def _error(status: int, message: str, kind: str = "invalid_request_error") -> Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return Response(_json.encode(body) + b"\n", status, media_type="application/json")


class _Relay(StreamingResponse):
    """A streamed answer whose `finish` runs however the stream ends (done, failed, client gone)."""

    def __init__(self, chunks: AsyncIterator[bytes], status: int, headers: dict[str, str], finish: Callable) -> None:
        super().__init__(chunks, status, headers)
        self._finish: Callable[[], Awaitable[None]] = finish

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except ClientDisconnect:  # the client left: nobody to tell
            pass
        finally:
            await self._finish()


class Proxy:
    """The /v1 endpoints in front of `urls`, routed by `service`'s ranking (see the module docstring)."""

    endpoints = ("POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models")

    def __init__(
        self,
        service: ProxyService,
        urls: Sequence[WorkerUrl],
        config: ProxyConfig | None = None,
        *,
        forward_authorization: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.service = service
        self.config = config or ProxyConfig()
        self.targets = Targets(urls, down_for_s=self.config.down_for_s, clock=clock)
        self.book = InflightBook()
        self.stats = ProxyStats(clock)
        self.models = ModelNames(clock)
        self.forward_authorization = forward_authorization  # False when the router checks its own key
        self.metrics = ProxyMetrics(service.metrics.registry, self.metrics_snapshot)
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listing: asyncio.Task[list[dict[str, Any]] | None] | None = None  # one /v1/models ask at a time
        service.set_inflight_source(self.inflight)
        service.add_status_section("proxy", self.status_view)

    # ---------------------------------------------------------------- what others read

    def inflight(self) -> dict[WorkerKey, tuple[int, int]]:
        """(prefill_blocks, decode_blocks) in flight per worker: the router's own load figure."""
        return self.book.blocks()

    def status_view(self) -> dict[str, Any]:
        """The proxy's part of /status.json: per worker rates, errors, TTFB, blocks in flight."""
        return {
            "workers": self.stats.view(self.book.blocks(), self.book.requests()),
            "urls": self.targets.urls(),
            "retries_total": self.stats.retries,
            "load_only_total": dict(self.stats.unscored),
            "attempts": self.config.attempts,
        }

    def metrics_snapshot(self) -> dict[str, Any]:
        return {
            "counters": self.stats.counters(),
            "blocks": self.book.blocks(),
            "requests": self.book.requests(),
            "retries": self.stats.retries,
            "load_only": dict(self.stats.unscored),
        }

    # ---------------------------------------------------------------- the app's routes

    def mount(self, app: FastAPI, limits: HttpLimits) -> None:
        """Add the /v1 routes to the router's app."""
        body = {"requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}}
        notes: dict[int | str, dict[str, Any]] = {
            200: {"description": "The worker's answer, as it sent it (JSON, or an event stream)."}
        }

        @app.post("/v1/completions", summary="OpenAI completions, sent to the best worker", openapi_extra=body)
        async def completions(request: Request) -> Response:
            return await self._guarded(request, "completions", limits)

        @app.post(
            "/v1/chat/completions", summary="OpenAI chat completions, sent to the best worker", openapi_extra=body
        )
        async def chat(request: Request) -> Response:
            return await self._guarded(request, "chat", limits)

        @app.get("/v1/models", summary="The models the workers serve (their /v1/models, merged)", responses=notes)
        async def models(request: Request) -> Response:
            entries = await self._learn_models(self._upstream_headers(request))
            if entries is None:
                return _error(502, "no worker answered GET /v1/models", "upstream_error")
            return Response(_json.encode({"object": "list", "data": entries}), media_type="application/json")

    async def _guarded(self, request: Request, kind: str, limits: HttpLimits) -> Response:
        try:
            return await self.handle(request, kind, limits)
        except Exception as exc:  # noqa: BLE001 - a bug answers 500 in one logged line, never a traceback
            log.error("%s %s failed: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
            return _error(500, f"internal error: {type(exc).__name__}: {exc}", "internal_error")

    async def handle(self, request: Request, kind: str, limits: HttpLimits) -> Response:
        """One proxied request: read, rank, send (with retries), relay."""
        body = await _read_body(request, limits)
        if isinstance(body, Response):
            return body
        try:
            obj = _decode(body)
        except ValueError as exc:
            return _error(400, f"body is not valid JSON: {exc}")
        if not isinstance(obj, dict):
            return _error(400, "the body must be a JSON object")
        headers = self._upstream_headers(request)
        model = obj.get("model") if isinstance(obj.get("model"), str) else None
        if self.models.should_ask(model):
            await self._ask_models_once(headers)
        plan = plan_request(
            kind, obj, tokenizer=self.service.renderer is not None, lora_name=self.models.lora_name(model)
        )
        candidates = await self._rank(plan, len(body))
        path = "/v1/completions" if kind == "completions" else "/v1/chat/completions"
        return await self._send(path, body, headers, candidates)

    # ---------------------------------------------------------------- ranking

    async def _score(self, score: dict[str, Any], nbytes: int) -> tuple[int, dict[str, Any]]:
        raw = _json.encode(score)
        if nbytes <= INLINE_BODY_BYTES:
            return self.service.handle_score(raw)
        return await run_in_threadpool(self.service.handle_score, raw)

    async def _rank(self, plan: RoutePlan, nbytes: int) -> list[_Candidate]:
        """The workers to try, best first, each with the blocks it would take on."""
        scored_pages: int | None = None
        if plan.score is not None:
            status, answer = await self._score(plan.score, nbytes)
            if status == 200:
                scored_pages = int(answer["pages"])
            else:  # the router could not score it (a chat its renderer refuses, ...): the engine may take it
                plan.why_unscored = "not scorable"
        if scored_pages is None:
            self.stats.routed_by_load(plan.why_unscored or "unknown")
            status, answer = self.service.handle_score(b'{"tokens": []}')  # every worker, ranked by load alone
        pages = plan.pages(scored_pages, self.service.router.page_size)
        return self._candidates(answer.get("workers", []), pages, int(answer.get("pages", 0)))

    def _candidates(self, workers: list[dict[str, Any]], pages: int, scored: int = 0) -> list[_Candidate]:
        keys = [WorkerKey(w["worker"], w["dp_rank"]) for w in workers]
        self.targets.seen(keys)
        by_cost = bool(workers) and "cost" in workers[0]
        rows: list[_Row] = []
        for pos, (w, key) in enumerate(zip(workers, keys)):
            url = self.targets.url_for(key)
            if url is not None:
                score, matched, cost = (
                    float(w.get("score", 0.0)),
                    int(w.get("matched_pages", 0)),
                    float(w.get("cost", 0.0)),
                )
                rows.append(_Row(pos, score, key, url, matched, cost))
        listed, unlisted = set(keys), list[_Row]()
        for key in self.targets.all_keys():  # workers the index does not know yet
            url = self.targets.url_for(key)
            if key not in listed and url is not None:
                unlisted.append(_Row(len(workers) + len(unlisted), 0.0, key, url, 0, 0.0))
        if by_cost:
            rows = self._place_by_cost(rows, unlisted, scored)
        else:  # a prefix-only ranking: ties to fewer blocks in flight
            rows = sorted(rows + unlisted, key=lambda r: (-r.score, self.book.total(r.key), r.pos))
        up = [r for r in rows if not self.targets.is_down(r.url)]
        down = [r for r in rows if self.targets.is_down(r.url)]
        return [_Candidate(r.key, r.url, max(pages - r.matched, 0), pages) for r in up + down]

    def _place_by_cost(self, ranked: list[_Row], unlisted: list[_Row], scored: int) -> list[_Row]:
        """A cost ranking with each worker the index has not listed yet placed by its own cost (no
        match: prefill_load_scale x (its blocks in flight + the scored pages) + its decode blocks, as
        the router costs a listed worker), after the listed ones that cost no more; a drawn pick
        (temperature) stays first."""
        if not unlisted:
            return ranked
        settings = self.service.cost_settings
        scale, first = float(settings.prefill_load_scale), 1 if settings.temperature else 0
        inflight = self.book.blocks()
        out = list(ranked)
        for row in unlisted:
            prefill, decode = inflight.get(row.key, (0, 0))
            cost = scale * max(prefill + scored, 0) + decode
            at = len(out)
            while at > first and out[at - 1].cost > cost:
                at -= 1
            out.insert(at, _Row(row.pos, row.score, row.key, row.url, 0, cost))
        return out

    # ---------------------------------------------------------------- sending

    async def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            cfg = self.config
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(cfg.read_timeout_s, connect=cfg.connect_timeout_s, pool=cfg.connect_timeout_s),
                limits=httpx.Limits(max_connections=cfg.max_connections, max_keepalive_connections=256),
                trust_env=False,  # never an HTTP_PROXY of the environment between the router and its workers
            )
            self._loop = asyncio.get_running_loop()
        return self._client

    def _upstream_headers(self, request: Request) -> dict[str, str]:
        out = {k: v for k, v in request.headers.items() if k not in _DROP}
        if not self.forward_authorization:
            out.pop("authorization", None)
        out.setdefault("accept-encoding", "identity")  # the answer's bytes go back as they come
        return out

    async def _send(self, path: str, body: bytes, headers: dict[str, str], candidates: list[_Candidate]) -> Response:
        if not candidates:
            return _error(503, "no worker to send to: no --worker-url serves a known worker", "upstream_error")
        client = await self._get_client()
        failures: list[str] = []
        for attempt, cand in enumerate(candidates[: self.config.attempts]):
            ticket = self.book.begin(cand.key, cand.prefill, cand.decode)
            self.stats.sent(cand.key, cand.url, retry=attempt > 0)
            t0 = time.perf_counter()
            try:
                resp, chunks, first = await self._open(client, cand, path, body, headers)
            except _Failed as f:
                ticket.end()
                self.stats.failed(cand.key, cand.url, f.kind)
                failures.append(f"{cand.key.label} ({cand.url}): {f}")
                if f.retry:
                    continue
                return _error(504 if f.kind == "timeout" else 502, "; ".join(failures), "upstream_error")
            except BaseException:  # cancelled (the server stops): the blocks leave with the request
                ticket.end()
                raise
            ticket.first_byte()
            ttfb = time.perf_counter() - t0
            self.stats.answered(cand.key, cand.url, resp.status_code, ttfb)
            self.metrics.observe_ttfb(cand.key, ttfb)
            self.targets.answered(cand.url)
            return await self._relay(cand, resp, chunks, first, ticket)
        tried = len(failures)
        return _error(502, f"no worker answered ({tried} tried): " + "; ".join(failures), "upstream_error")

    async def _open(
        self, client: httpx.AsyncClient, cand: _Candidate, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[httpx.Response, AsyncIterator[bytes], bytes]:
        """The answer's head and its first body bytes; _Failed says whether another worker may be tried."""
        req = client.build_request("POST", cand.url + path, content=body, headers=headers)
        try:
            resp = await client.send(req, stream=True)
        except httpx.ReadTimeout:
            raise _Failed("timeout", f"no answer within {self.config.read_timeout_s:g} s", retry=False) from None
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            self.targets.failed(cand.url)
            raise _Failed("connect", f"cannot connect: {exc or type(exc).__name__}", retry=True) from None
        except httpx.TransportError as exc:  # closed before any answer (a stale kept-alive connection, ...)
            raise _Failed("transport", f"{type(exc).__name__}: {exc}", retry=True) from None
        chunks = resp.aiter_raw()
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            first = b""
        except httpx.HTTPError as exc:  # the head came: the worker started, it is not retried elsewhere
            await resp.aclose()
            kind = "timeout" if isinstance(exc, httpx.ReadTimeout) else "stream"
            raise _Failed(kind, f"answer broken off: {type(exc).__name__}: {exc}", retry=False) from None
        return resp, chunks, first

    async def _relay(
        self, cand: _Candidate, resp: httpx.Response, chunks: AsyncIterator[bytes], first: bytes, ticket: Ticket
    ) -> Response:
        headers = {k: v for k, v in resp.headers.items() if k not in _DROP}
        headers[WORKER_HEADER] = cand.key.source
        headers[RANK_HEADER] = str(cand.key.dp_rank)
        if resp.headers.get("content-type", "").startswith("text/event-stream"):

            async def finish() -> None:
                await resp.aclose()
                ticket.end()

            return _Relay(self._stream(cand, first, chunks), resp.status_code, headers, finish)
        parts = [first]
        try:
            async for chunk in chunks:
                parts.append(chunk)
        except httpx.HTTPError as exc:
            self.stats.failed(cand.key, cand.url, "stream")
            return _error(502, f"{cand.key.label}: answer broken off: {type(exc).__name__}: {exc}", "upstream_error")
        finally:
            await resp.aclose()
            ticket.end()
        return Response(b"".join(parts), resp.status_code, headers)

    async def _stream(self, cand: _Candidate, first: bytes, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """An event stream, chunk by chunk as it arrives; broken off, it ends with an error event."""
        if first:
            yield first
        try:
            async for chunk in chunks:
                yield chunk
        except httpx.HTTPError as exc:
            self.stats.failed(cand.key, cand.url, "stream")
            message = f"{cand.key.label}: answer broken off: {type(exc).__name__}: {exc}"
            event = {"error": {"message": message, "type": "upstream_error", "param": None, "code": 502}}
            yield b"data: " + _json.encode(event) + b"\n\n"

    async def _ask_models_once(self, headers: dict[str, str]) -> None:
        """Learn the base models, the requests that arrive meanwhile waiting for the same answer."""
        if self._listing is None or self._listing.done():
            self._listing = asyncio.ensure_future(self._learn_models(headers))
        await asyncio.shield(self._listing)

    async def _learn_models(self, headers: dict[str, str]) -> list[dict[str, Any]] | None:
        """Every worker's /v1/models, merged by id (the first worker listing an id gives its entry)."""
        client = await self._get_client()
        get = {k: v for k, v in headers.items() if k in ("authorization", "accept", "user-agent")}

        async def one(url: str) -> list[Any]:
            try:
                resp = await client.get(url + "/v1/models", headers=get, timeout=5.0)
                data = resp.json().get("data") if resp.status_code == 200 else None
                return data if isinstance(data, list) else []
            except (httpx.HTTPError, ValueError, AttributeError):
                return []

        lists = await asyncio.gather(*(one(u) for u in self.targets.urls()))
        merged: dict[str, Any] = {}
        for entries in lists:
            for e in entries:
                if isinstance(e, dict) and isinstance(e.get("id"), str):
                    merged.setdefault(e["id"], e)
        if not merged:
            self.models.asked()
            return None
        self.models.learn(merged.values())
        return list(merged.values())

    def close(self, timeout_s: float = 2.0) -> None:
        """Close the HTTP client on the loop it lives on (HttpServer.stop calls this first)."""
        client, loop, self._client = self._client, self._loop, None
        if client is None or loop is None or loop.is_closed() or not loop.is_running():
            return
        fut = asyncio.run_coroutine_threadsafe(client.aclose(), loop)
        try:
            fut.result(timeout_s)
        except Exception as exc:  # noqa: BLE001 - stopping goes on
            log.warning("closing the proxy's HTTP client: %s: %s", type(exc).__name__, exc)


async def _read_body(request: Request, limits: HttpLimits) -> bytes | Response:
    """The request's body within the front's limits, or the error to answer (OpenAI's error shape)."""
    length = request.headers.get("content-length")
    if length is None and "chunked" not in request.headers.get("transfer-encoding", ""):
        return _error(411, "a Content-Length header is required")
    if length is not None and (not length.isdigit() or int(length) > limits.max_body_bytes):
        return _error(413, f"body of {length} bytes exceeds {limits.max_body_bytes}")
    try:
        if sys.version_info >= (3, 11):
            async with asyncio.timeout(limits.body_timeout_s):
                body = await request.body()
        else:
            body = await asyncio.wait_for(request.body(), limits.body_timeout_s)
    except asyncio.TimeoutError:
        return _error(408, f"body not received within {limits.body_timeout_s:g} s")
    except ClientDisconnect:
        return Response(status_code=400)
    if len(body) > limits.max_body_bytes:
        return _error(413, f"body of {len(body)} bytes exceeds {limits.max_body_bytes}")
    return body
