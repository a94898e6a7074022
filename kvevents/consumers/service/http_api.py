"""The HTTP front of `kvevents route`: a FastAPI app served by uvicorn on a background thread.

One asyncio loop takes every connection (no thread per connection): keep-alive (TCP_NODELAY and
one write per response: kvevents.consumers.http_wire), a timeout for a connection's first byte,
one for a request's headers and one for its body, and a large listen backlog. Requests in service
are capped and past the cap they queue (then 503); connections that sent no request are capped
apart, the oldest closed past it (kvevents.consumers.service.http_guard). POST /score needs an
application/json body; one up to INLINE_BODY_BYTES is scored on the event loop, a longer one on a
small pool behind a gate of its own (kvevents.consumers.service.score_http, score_pool); the
service looks up inside the index lock and hashes a body's ids there too, as the walk reads them, up
to 16,384 tokens (longer ones before taking it: kvevents.consumers.service.scoring).
OpenAPI is served at /openapi.json, generated from the models below. With keys, every request's key
is checked first (kvevents.consumers.service.auth); with a proxy, its /v1 routes are served too
(kvevents.consumers.service.proxy); with a certificate, over HTTPS.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from kvevents.consumers.service.auth import ACCESS_KEY, READ, AuthMiddleware, HttpSecurity, tenant_redacted
from kvevents.consumers.service.http_guard import Admission, AdmittedApp, PendingConnections, ensure_fd_limit
from kvevents.consumers.service.http_wire import OneWrite, set_nodelay
from kvevents.consumers.service.metrics import CONTENT_TYPE
from kvevents.consumers.service.score_http import INLINE_BODY_BYTES, bug, reply
from kvevents.consumers.service.score_http import score as score_request
from kvevents.consumers.service.score_pool import LongBodies
from kvevents.consumers.service.seams import HttpService, ProxyFront
from kvevents.consumers.service.status import render_page

__all__ = ["ErrorBody", "HttpLimits", "HttpServer", "INLINE_BODY_BYTES", "ScoreResponse", "WorkerEntry", "build_app"]

log = logging.getLogger("consumers.http")

# the page loads nothing from anywhere: its script and styles are inline, it only fetches /status.json
_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data:; connect-src 'self'",
}


def default_long_bodies() -> int:
    """Long /score bodies scored at once by default: the cores but one (the event loop's), 1 to 4.
    On 2 cores two at once took the loop's core too (a normal request's p99 x3 against x0.6)."""
    return max(1, min(4, (os.cpu_count() or 2) - 1))


class HttpLimits(BaseModel):
    """Connection handling of the router's HTTP server (defaults documented in the README)."""

    backlog: int = Field(default=2048, ge=1)  # pending connections the kernel queues (capped by somaxconn)
    max_connections: int = Field(default=1000, ge=1)  # requests in service at once; past it they queue
    max_queued: int = Field(default=2048, ge=0)  # requests waiting for a place; past it 503 (Retry-After)
    queue_wait_s: float = Field(default=10.0, gt=0)  # a request waits at most this for a place, then 503
    max_idle: int = Field(default=4096, ge=1)  # connections that sent no request; past it the oldest closes
    idle_timeout_s: float = Field(default=10.0, gt=0)  # a new connection's first byte must arrive within this
    keep_alive_s: float = Field(default=5.0, gt=0)  # an idle keep-alive connection is closed after this
    header_timeout_s: float = Field(default=10.0, gt=0)  # a request's headers, from its first byte, within this
    body_timeout_s: float = Field(default=10.0, gt=0)  # and its body within this (else 408)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1)  # a longer body is refused (413)
    long_bodies: int = Field(default_factory=default_long_bodies, ge=1)  # /score bodies over 64 KiB
    # read and scored at once (as many pool threads): one core per body, one left for the event loop
    long_queue: int = Field(default=8, ge=0)  # more of them wait, unread; past it 503 (Retry-After)
    long_body_rate: int = Field(default=48 * 1024 * 1024, ge=0)  # bytes/s long bodies are read at, all
    # together (0: unpaced), so their reading leaves the event loop time for normal requests

    def open_files(self) -> int:
        """File descriptors every connection these limits allow may take (plus a margin)."""
        return self.max_connections + self.max_queued + self.max_idle + 256


# ---------------------------------------------------------------- documented shapes (OpenAPI)


class WorkerEntry(BaseModel):
    """One worker (a publisher's dp rank): its cost for the request and what it is made of."""

    worker: str = Field(description="The publisher's name as given to --publisher (NAME=...).")
    dp_rank: int = Field(description="The data-parallel rank whose blocks these are.")
    cost: float = Field(
        description="prefill_load_scale x max(active_prefill_blocks + request pages - overlap credit, 0) "
        "+ active_decode_blocks; the overlap credit is `score` plus predicted_blocks at the GPU weight."
    )
    score: float = Field(
        description="Matched prefix pages weighted by their best medium (by default GPU 1.0, CPU_PINNED and CPU 0.8, "
        "STORAGE, DISK, EXTERNAL and FS 0.5, others 0.5; route --medium-weight NAME=W sets them)."
    )
    matched_pages: int = Field(description="Consecutive whole pages of the request's prefix this worker holds.")
    matched_tokens: int = Field(description="matched_pages x page size.")
    overlap_blocks: int = Field(description="matched_pages plus the predicted pages that continue them.")
    predicted_blocks: int = Field(description="Pages credited by earlier routing decisions, not yet stored.")
    active_prefill_blocks: float = Field(description="Pages still to prefill there (its newest load).")
    active_decode_blocks: float = Field(description="Pages held by its running requests (its newest load).")
    queue: int | None = Field(description="Requests waiting there (null: no load source says).")
    load: float = Field(description="The caller's load hint (PrefixRouter.set_load; 0 unless set).")
    load_source: str | None = Field(description="request | metrics | inflight: where its load came from (null: none).")
    load_stale: bool = Field(description="Its load is older than --load-stale-after (or its scrape never answered).")
    stale: bool = Field(description="Nothing heard from this worker's publisher for --stale-after seconds.")
    pages_by_medium: dict[str, int] | None = Field(
        default=None, description="With explain only: matched pages by the medium credited for each."
    )


class ScoreResponse(BaseModel):
    """POST /score answer."""

    pages: int = Field(description="Whole pages in the request (a partial last page is never cached).")
    page_size: int = Field(description="Tokens per page (route --page-size).")
    policy: str = Field(description="The ranking used: cost or prefix.")
    pick: str | None = Field(description="Where to send the request: workers[0] (null only with no worker known).")
    pick_dp_rank: int | None = Field(description="Its dp rank.")
    best: str | None = Field(description="The pick when it holds a page of the prefix, else null.")
    best_dp_rank: int | None = Field(description="Its dp rank (null with best).")
    routed: bool = Field(description="The pick was credited the request's pages as predicted copies.")
    stale: bool = Field(description="True when any publisher is stale: the index may hold blocks that are gone.")
    workers: list[WorkerEntry] = Field(
        description="Every worker that matched a page, plus those of the top_k lowest-cost ones that did not, best first."
    )
    workers_total: int = Field(description="Workers known (those not listed are not built).")
    hashes: list[str] | None = Field(
        default=None, description="With explain only: the request's int64 page hashes, as strings."
    )


class ErrorBody(BaseModel):
    """Every error: one line saying what was wrong."""

    error: str


# ---------------------------------------------------------------- the app


def _status(service: HttpService, request: Request) -> dict[str, Any]:
    """/status.json for this caller: without copies by adapter for the read-only key (tenant information)."""
    view = service.status_view()
    return tenant_redacted(view) if request.scope.get(ACCESS_KEY) == READ else view


def build_app(
    service: HttpService, limits: HttpLimits, *, security: HttpSecurity | None = None, proxy: ProxyFront | None = None
) -> FastAPI:
    """The FastAPI app: POST /score, GET /workers, GET /metrics, GET /status.json, GET / (the page), /healthz;
    the proxy's /v1 endpoints with `proxy`; every request's key checked first with `security`'s keys."""
    app = FastAPI(
        title="kvevents route",
        summary="Ranks workers by the longest cached prefix of a request, from their KV events.",
        version="1",
        docs_url=None,
        redoc_url=None,
    )
    score_body = service.score_request_schema()
    long = LongBodies(limits.long_bodies, limits.long_queue, limits.queue_wait_s, limits.long_body_rate)
    app.state.long_bodies = long  # HttpServer.stop closes its pool

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        detail = exc.detail if exc.status_code != 404 else f"no such path: {request.url.path}"
        return reply(exc.status_code, {"error": str(detail)}, dict(exc.headers or {}))

    @app.post(
        "/score",
        summary="Rank workers for a request",
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": score_body}}}},
        responses={
            200: {"model": ScoreResponse, "description": "Workers, best first."},
            400: {"model": ErrorBody, "description": "Not JSON, or a field is wrong (named in the message)."},
            408: {"model": ErrorBody, "description": "The body did not arrive within the body timeout."},
            411: {"model": ErrorBody, "description": "Neither Content-Length nor Transfer-Encoding: chunked."},
            413: {"model": ErrorBody, "description": "Body over the size limit."},
            415: {"model": ErrorBody, "description": "The body is not application/json (charset, if given, UTF-8)."},
            503: {
                "model": ErrorBody,
                "description": "Busy: every place in service and in the queue taken, or the wait for one too long "
                "(requests, or bodies over 64 KiB); Retry-After says when to try again.",
            },
        },
    )
    async def score(request: Request) -> Response:
        return await score_request(service, limits, long, request)

    _add_views(app, service, proxy)
    if proxy is not None:
        proxy.mount(app, limits)
    if security is not None and security.keyed:
        app.add_middleware(AuthMiddleware, security=security)
    return app


def _add_views(app: FastAPI, service: HttpService, proxy: ProxyFront | None) -> None:
    """The read-only routes: GET /workers, /metrics, /status.json, / (the page), /healthz."""

    @app.get("/workers", summary="Per worker: blocks by medium, last seq, epoch, lag, stale, replay framing")
    def workers(request: Request) -> Response:
        try:
            return reply(200, service.workers_view())
        except Exception as exc:  # noqa: BLE001 - as above
            return bug(request, exc)

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    def metrics(request: Request) -> Response:
        try:
            return Response(service.metrics.render(), 200, media_type=CONTENT_TYPE)
        except Exception as exc:  # noqa: BLE001 - as above
            return bug(request, exc)

    @app.get(
        "/status.json", summary="The status page's data: /workers plus copies by adapter, repairs, /score outcomes"
    )
    def status_json(request: Request) -> Response:
        try:
            return reply(200, _status(service, request), {"Cache-Control": "no-store"})
        except Exception as exc:  # noqa: BLE001 - as above
            return bug(request, exc)

    @app.get(
        "/", summary="The status page (HTML, self-contained; readable without JavaScript)", response_class=Response
    )
    def page(request: Request) -> Response:
        try:
            body = render_page(_status(service, request))
        except Exception as exc:  # noqa: BLE001 - as above
            return bug(request, exc)
        return Response(body, 200, media_type="text/html; charset=utf-8", headers=_PAGE_HEADERS)

    @app.get("/healthz", summary="What is served here")
    def root() -> Response:
        return reply(
            200,
            {
                "ok": True,
                "endpoints": [
                    "POST /score",
                    "GET /workers",
                    "GET /metrics",
                    "GET /status.json",
                    "GET /",
                    "GET /openapi.json",
                    *(proxy.endpoints if proxy is not None else ()),
                ],
            },
        )


# ---------------------------------------------------------------- uvicorn on a thread


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol plus TCP_NODELAY, one write per response (kvevents.consumers.http_wire),
    timeouts and a place among the pending connections: a new connection must send a byte within
    `idle_timeout_s`, then a request's headers are due within `header_timeout_s` of its first byte
    (between keep-alive requests uvicorn's keep-alive timeout waits for that byte). Until its
    headers are in, a connection is one of `pending` (the oldest closed past their cap)."""

    header_timeout_s = 10.0
    idle_timeout_s = 10.0
    pending: PendingConnections = PendingConnections(4096)  # each server's subclass has its own

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        set_nodelay(transport.get_extra_info("socket"))  # issue 30: whatever socket the listener made
        self._wire = OneWrite(transport, self.loop)
        super().connection_made(cast(asyncio.Transport, self._wire))
        self._heads_due = False  # a request's first byte came: its headers are due
        self._timer: asyncio.TimerHandle | None = self.loop.call_later(self.idle_timeout_s, self._late)
        self.pending.add(self)

    def on_response_complete(self) -> None:
        self._wire.flush()  # head, body and end as one send
        super().on_response_complete()
        if self._between_requests() and not self.transport.is_closing():
            self.pending.add(self)  # waiting for the next request (uvicorn's keep-alive timer runs)

    def data_received(self, data: bytes) -> None:
        if self._between_requests() and not self._heads_due:
            self._heads_due = True  # bytes of a request: its headers are due
            self._disarm()
            self._timer = self.loop.call_later(self.header_timeout_s, self._late)
        super().data_received(data)
        if not self._between_requests():  # the headers are in: the body timeout (in the app) takes over
            self._heads_due = False
            self._disarm()
            self.pending.discard(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.pending.discard(self)
        super().connection_lost(exc)

    def evict(self) -> None:
        """Close this connection (it sent no request and the pending connections are over their cap)."""
        if not self.transport.is_closing():
            self.transport.close()

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _late(self) -> None:
        self._timer = None
        if self._between_requests() and not self.transport.is_closing():
            self.transport.close()


class HttpServer:
    """uvicorn serving `app` on its own thread and event loop; `start()` returns the bound address.
    Requests pass an Admission (in service, then queued); connections that sent none are capped."""

    def __init__(self, app: FastAPI, limits: HttpLimits, *, security: HttpSecurity | None = None) -> None:
        self.limits = limits
        self.app = app
        self.admission = Admission(limits.max_connections, limits.max_queued, limits.queue_wait_s)
        self.pending = PendingConnections(limits.max_idle)
        protocol = type(
            "RouteProtocol",
            (_Protocol,),
            {
                "header_timeout_s": limits.header_timeout_s,
                "idle_timeout_s": limits.idle_timeout_s,
                "pending": self.pending,
            },
        )
        tls = security if security is not None and security.tls else None
        if tls is not None:
            tls.check_tls()  # ValueError naming the file, before the server thread would fail on it
        self.scheme = "https" if tls is not None else "http"
        self.on_stop: list[Callable[[], None]] = []  # called first by stop(), while the event loop still runs
        self.config = uvicorn.Config(
            AdmittedApp(app, self.admission),
            http=protocol,
            lifespan="off",
            access_log=False,
            log_config=None,
            log_level="error",  # not a line per malformed request or dropped client
            timeout_keep_alive=int(max(1, round(limits.keep_alive_s))),
            limit_concurrency=None,  # uvicorn's counts every open socket, idle ones too: the Admission counts requests
            backlog=limits.backlog,
            server_header=False,
            ssl_certfile=tls.tls_cert if tls is not None else None,  # uvicorn's own TLS
            ssl_keyfile=tls.tls_key if tls is not None else None,
        )
        self.server = uvicorn.Server(self.config)
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    def counters(self) -> dict[str, int]:
        """What admission did so far: requests admitted, queued, refused; idle connections closed;
        the same for long /score bodies (`long_*`)."""
        out = dict(self.admission.counts)
        out["idle_closed"] = self.pending.evicted
        long = getattr(self.app.state, "long_bodies", None)
        if isinstance(long, LongBodies):
            out.update({f"long_{k}": n for k, n in long.counts().items()})
        return out

    def start(self, host: str, port: int) -> tuple[str, int]:
        """Bind (port 0: a free one), listen, serve on a thread; ValueError if the address is unusable."""
        try:
            tcp = socket.IPPROTO_TCP
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=tcp, flags=socket.AI_PASSIVE)
            # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto
            # says TCP, and with 0 every keep-alive answer (uvicorn writes headers, then body) waited
            # ~40 ms in Nagle's algorithm for the client's delayed ACK (issue 30)
            sock = socket.socket(infos[0][0], socket.SOCK_STREAM, tcp)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(infos[0][4])
                sock.listen(self.limits.backlog)
            except OSError:
                sock.close()
                raise
        except OSError as exc:
            raise ValueError(f"cannot serve HTTP on {host}:{port}: {exc.strerror or exc}") from None
        ensure_fd_limit(self.limits.open_files())
        self._sock = sock
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, name="kvevents-route-http", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        if not self.server.started:
            self.stop()
            raise ValueError(f"HTTP server on {host}:{port} did not start")
        bound = sock.getsockname()
        return str(bound[0]), int(bound[1])

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close every connection, join the thread, release the port."""
        for hook in self.on_stop:
            try:
                hook()
            except Exception as exc:  # noqa: BLE001 - stopping goes on whatever a hook says
                log.warning("stopping the HTTP server: %s: %s", type(exc).__name__, exc)
        self.on_stop.clear()
        self.server.should_exit = True
        self.server.force_exit = True  # do not wait for keep-alive clients to leave
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        long = getattr(self.app.state, "long_bodies", None)
        if isinstance(long, LongBodies):
            long.close()
