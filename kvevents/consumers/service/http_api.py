"""The HTTP front of `kvevents route`: a FastAPI app served by uvicorn on a background thread.

One asyncio loop takes every connection (no thread per connection): keep-alive (TCP_NODELAY and
one write per response: kvevents.consumers.http_wire), a timeout for a connection's first byte,
one for a request's headers and one for its body, and a large listen backlog. Requests in service
are capped and past the cap they queue (then 503); connections that sent no request are capped
apart, the oldest closed past it (kvevents.consumers.service.http_guard). POST /score needs an
application/json body; one up to INLINE_BODY_BYTES is scored on the event loop (a thread hop costs
more than the usual request), a longer one on a small pool behind a gate of its own
(kvevents.consumers.service.score_pool); the service hashes outside the index lock, looks up inside.
OpenAPI is served at /openapi.json, generated from the models below.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, cast

import msgspec
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from kvevents.consumers.service.http_guard import (
    Admission,
    AdmittedApp,
    PendingConnections,
    busy_response,
    ensure_fd_limit,
)
from kvevents.consumers.service.http_wire import OneWrite, set_nodelay
from kvevents.consumers.service.metrics import CONTENT_TYPE
from kvevents.consumers.service.score_pool import BodyTooLong, LongBodies, read_body, score_encoded
from kvevents.consumers.service.status import render_page

if TYPE_CHECKING:  # pragma: no cover
    from kvevents.consumers.service.core import RouterService

__all__ = ["ErrorBody", "HttpLimits", "HttpServer", "ScoreResponse", "WorkerEntry", "build_app"]

log = logging.getLogger("consumers.http")

_json = msgspec.json.Encoder()
# the page loads nothing from anywhere: its script and styles are inline, it only fetches /status.json
_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data:; connect-src 'self'",
}
INLINE_BODY_BYTES = 64 * 1024  # POST /score bodies up to this are scored on the event loop itself


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

    def open_files(self) -> int:
        """File descriptors every connection these limits allow may take (plus a margin)."""
        return self.max_connections + self.max_queued + self.max_idle + 256


# ---------------------------------------------------------------- documented shapes (OpenAPI)


class WorkerEntry(BaseModel):
    """One worker (a publisher's dp rank) and its credit for the request, best first."""

    worker: str = Field(description="The publisher's name as given to --publisher (NAME=...).")
    dp_rank: int = Field(description="The data-parallel rank whose blocks these are.")
    score: float = Field(
        description="Matched prefix pages weighted by their best medium (by default GPU 1.0, CPU_PINNED and CPU 0.8, "
        "STORAGE, DISK, EXTERNAL and FS 0.5, others 0.5; route --medium-weight NAME=W sets them)."
    )
    matched_pages: int = Field(description="Consecutive whole pages of the request's prefix this worker holds.")
    matched_tokens: int = Field(description="matched_pages x page size.")
    load: float = Field(description="Load hint used to break ties (0 unless set).")
    stale: bool = Field(description="Nothing heard from this worker's publisher for --stale-after seconds.")
    pages_by_medium: dict[str, int] | None = Field(
        default=None, description="With explain only: matched pages by the medium credited for each."
    )


class ScoreResponse(BaseModel):
    """POST /score answer."""

    pages: int = Field(description="Whole pages in the request (a partial last page is never cached).")
    page_size: int = Field(description="Tokens per page (route --page-size).")
    best: str | None = Field(description="Name of the best worker, or null when no worker matches a page.")
    best_dp_rank: int | None = Field(description="Its dp rank (null with best).")
    stale: bool = Field(description="True when any publisher is stale: the index may hold blocks that are gone.")
    workers: list[WorkerEntry] = Field(description="Every known worker (or the top_k), best first.")
    hashes: list[str] | None = Field(
        default=None, description="With explain only: the request's int64 page hashes, as strings."
    )


class ErrorBody(BaseModel):
    """Every error: one line saying what was wrong."""

    error: str


# ---------------------------------------------------------------- the app


def _reply(status: int, obj: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(_json.encode(obj) + b"\n", status, headers=headers, media_type="application/json")


def _bug(request: Request, exc: Exception) -> Response:
    log.error("%s %s failed: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
    return _reply(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})


async def _within(step: Any, timeout_s: float) -> Any:
    """`step` awaited, or asyncio.TimeoutError after `timeout_s`. On 3.11+ a timer on this task:
    wait_for wraps the step in a task of its own, ~3 loop turns and ~60 us per request."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout_s):
            return await step
    return await asyncio.wait_for(step, timeout_s)


_CLOSE = {"Connection": "close"}  # an error answered before the body is read: do not drain it


def content_type_problem(value: str | None) -> str | None:
    """None for an application/json Content-Type (charset, if given, UTF-8), else the 415's message.
    Only JSON is parsed: text/plain and form bodies are what cross-site pages may POST unasked."""
    if value is None:
        return "a Content-Type of application/json is required"
    media, _, params = value.partition(";")
    if media.strip().lower() != "application/json":
        return f"Content-Type must be application/json, not {value.strip()[:100]!r}"
    for param in params.split(";"):
        name, _, charset = param.partition("=")
        if name.strip().lower() == "charset" and charset.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return f"application/json is UTF-8, not charset {charset.strip()[:40]!r}"
    return None


async def _score_inline(service: RouterService, limits: HttpLimits, request: Request) -> Response:
    """A short body: read and scored on the event loop (the usual request: ~0.4 ms)."""
    try:
        body = await _within(request.body(), limits.body_timeout_s)
    except asyncio.TimeoutError:
        return _reply(408, {"error": f"body not received within {limits.body_timeout_s:g} s"}, _CLOSE)
    except ClientDisconnect:  # the client left mid-body: nobody to answer, nothing to log
        return Response(status_code=400)
    if len(body) > limits.max_body_bytes:
        return _reply(413, {"error": f"body of {len(body)} bytes exceeds {limits.max_body_bytes}"}, _CLOSE)
    try:
        status, obj = service.handle_score(body)
    except Exception as exc:  # noqa: BLE001 - a bug answers 500 in one logged line, never a traceback
        return _bug(request, exc)
    return _reply(status, obj)


async def _score_long(
    service: RouterService, limits: HttpLimits, long: LongBodies, request: Request, declared: int | None
) -> Response:
    """A long (or chunked) body: a gate place first, then read into one buffer and scored on the pool."""
    refused = await long.gate.enter()
    if refused is not None:
        body, headers = busy_response(refused)
        return Response(body, 503, headers=headers, media_type="application/json")
    try:
        try:
            read = read_body(request.stream(), declared, limits.max_body_bytes)
            held = [await _within(read, limits.body_timeout_s)]
        except asyncio.TimeoutError:
            return _reply(408, {"error": f"body not received within {limits.body_timeout_s:g} s"}, _CLOSE)
        except ClientDisconnect:
            return Response(status_code=400)
        except BodyTooLong as exc:
            return _reply(413, {"error": str(exc)}, _CLOSE)
        try:
            status, answer = await long.run(functools.partial(score_encoded, service, held))
        except Exception as exc:  # noqa: BLE001 - as in _score_inline
            return _bug(request, exc)
        return Response(answer, status, media_type="application/json")
    finally:
        long.gate.leave()


def build_app(service: RouterService, limits: HttpLimits) -> FastAPI:
    """The FastAPI app: POST /score, GET /workers, GET /metrics, GET /status.json, GET / (the page), /healthz."""
    app = FastAPI(
        title="kvevents route",
        summary="Ranks workers by the longest cached prefix of a request, from their KV events.",
        version="1",
        docs_url=None,
        redoc_url=None,
    )
    score_body = service.score_request_schema()
    long = LongBodies(limits.long_bodies, limits.long_queue, limits.queue_wait_s)
    app.state.long_bodies = long  # HttpServer.stop closes its pool

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        detail = exc.detail if exc.status_code != 404 else f"no such path: {request.url.path}"
        return _reply(exc.status_code, {"error": str(detail)}, dict(exc.headers or {}))

    @app.post(
        "/score",
        summary="Rank workers for a request",
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": score_body}}}},
        responses={
            200: {"model": ScoreResponse, "description": "Workers, best first."},
            400: {"model": ErrorBody, "description": "Not JSON, or a field is wrong (named in the message)."},
            408: {"model": ErrorBody, "description": "The body did not arrive within the body timeout."},
            411: {"model": ErrorBody, "description": "No Content-Length."},
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
        length = request.headers.get("content-length")
        if length is None and "chunked" not in request.headers.get("transfer-encoding", ""):
            return _reply(411, {"error": "a Content-Length header is required"}, _CLOSE)
        if length is not None and (not length.isdigit() or int(length) > limits.max_body_bytes):
            return _reply(413, {"error": f"body of {length} bytes exceeds {limits.max_body_bytes}"}, _CLOSE)
        wrong_type = content_type_problem(request.headers.get("content-type"))
        if wrong_type is not None:
            return _reply(415, {"error": wrong_type}, _CLOSE)
        if length is not None and int(length) <= INLINE_BODY_BYTES:
            return await _score_inline(service, limits, request)
        return await _score_long(service, limits, long, request, None if length is None else int(length))

    @app.get("/workers", summary="Per worker: blocks by medium, last seq, epoch, lag, stale, replay framing")
    def workers(request: Request) -> Response:
        try:
            return _reply(200, service.workers_view())
        except Exception as exc:  # noqa: BLE001 - as above
            return _bug(request, exc)

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    def metrics(request: Request) -> Response:
        try:
            return Response(service.metrics.render(), 200, media_type=CONTENT_TYPE)
        except Exception as exc:  # noqa: BLE001 - as above
            return _bug(request, exc)

    @app.get(
        "/status.json", summary="The status page's data: /workers plus copies by adapter, repairs, /score outcomes"
    )
    def status_json(request: Request) -> Response:
        try:
            return _reply(200, service.status_view(), {"Cache-Control": "no-store"})
        except Exception as exc:  # noqa: BLE001 - as above
            return _bug(request, exc)

    @app.get(
        "/", summary="The status page (HTML, self-contained; readable without JavaScript)", response_class=Response
    )
    def page(request: Request) -> Response:
        try:
            body = render_page(service.status_view())
        except Exception as exc:  # noqa: BLE001 - as above
            return _bug(request, exc)
        return Response(body, 200, media_type="text/html; charset=utf-8", headers=_PAGE_HEADERS)

    @app.get("/healthz", summary="What is served here")
    def root() -> Response:
        return _reply(
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
                ],
            },
        )

    return app


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

    def __init__(self, app: FastAPI, limits: HttpLimits) -> None:
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
            out.update({f"long_{k}": n for k, n in long.gate.counts.items()})
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
