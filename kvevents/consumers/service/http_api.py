"""The HTTP front of `kvevents route`: a FastAPI app served by uvicorn on a background thread.

One asyncio loop takes every connection (no thread per connection): keep-alive (TCP_NODELAY and
one write per response: kvevents.consumers.http_wire), a timeout for a
request's headers and one for its body, a cap on connections in service (503 past it) and a large
listen backlog. POST /score is scored on the event loop (a thread hop costs more than the usual
request), a body over INLINE_BODY_BYTES on the thread pool so the loop keeps serving meanwhile;
the service hashes outside the index lock and looks up inside.
OpenAPI is served at /openapi.json, generated from the models below.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, cast

import msgspec
import uvicorn
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from kvevents.consumers.service.http_wire import OneWrite, set_nodelay
from kvevents.consumers.service.metrics import CONTENT_TYPE
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


class HttpLimits(BaseModel):
    """Connection handling of the router's HTTP server (defaults documented in the README)."""

    backlog: int = Field(default=2048, ge=1)  # pending connections the kernel queues (capped by somaxconn)
    max_connections: int = Field(default=1000, ge=1)  # connections in service; past it requests get 503
    keep_alive_s: float = Field(default=5.0, gt=0)  # an idle keep-alive connection is closed after this
    header_timeout_s: float = Field(default=10.0, gt=0)  # a request's headers must be complete within this
    body_timeout_s: float = Field(default=10.0, gt=0)  # and its body within this (else 408)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1)  # a longer body is refused (413)


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


async def _chunked_body(request: Request, limit: int) -> bytes | None:
    """A chunked body (no Content-Length to check first), read up to `limit` bytes: None as soon as
    it passes them, the rest unread."""
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


async def _body_within(request: Request, timeout_s: float, limit: int | None = None) -> bytes | None:
    """The whole body (a chunked one: up to `limit` bytes, else None), or asyncio.TimeoutError after
    `timeout_s`. On 3.11+ a timer on this task: wait_for wraps the read in a task of its own, ~3 loop
    turns and ~60 us per request."""
    read = request.body() if limit is None else _chunked_body(request, limit)
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout_s):
            return await read
    return await asyncio.wait_for(read, timeout_s)


async def _score(service: RouterService, limits: HttpLimits, request: Request) -> Response:
    """POST /score: the body read within its limits (length, size, time), then scored. A chunked body
    (Transfer-Encoding: chunked, no Content-Length) is taken too, cut off at the size limit."""
    length = request.headers.get("content-length")
    chunked = length is None and "chunked" in request.headers.get("transfer-encoding", "").lower()
    if length is None and not chunked:
        error = "a Content-Length header (or Transfer-Encoding: chunked) is required"
        return _reply(411, {"error": error}, {"Connection": "close"})
    if length is not None and (not length.isdigit() or int(length) > limits.max_body_bytes):
        return _reply(
            413, {"error": f"body of {length} bytes exceeds {limits.max_body_bytes}"}, {"Connection": "close"}
        )
    try:
        body = await _body_within(request, limits.body_timeout_s, limits.max_body_bytes if chunked else None)
    except asyncio.TimeoutError:
        return _reply(408, {"error": f"body not received within {limits.body_timeout_s:g} s"}, {"Connection": "close"})
    except ClientDisconnect:  # the client left mid-body: nobody to answer, nothing to log
        return Response(status_code=400)
    if body is None or len(body) > limits.max_body_bytes:
        too_long = (
            f"{'a chunked body' if body is None else f'body of {len(body)} bytes'} exceeds {limits.max_body_bytes}"
        )
        return _reply(413, {"error": too_long}, {"Connection": "close"})
    try:
        if len(body) <= INLINE_BODY_BYTES:  # the usual request: ~0.4 ms, cheaper than a thread hop
            status, obj = service.handle_score(body)
        else:  # a long one on the pool, so the loop keeps accepting and reading meanwhile
            status, obj = await run_in_threadpool(service.handle_score, body)
    except Exception as exc:  # noqa: BLE001 - a bug answers 500 in one logged line, never a traceback
        return _bug(request, exc)
    return _reply(status, obj)


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
            411: {"model": ErrorBody, "description": "Neither Content-Length nor Transfer-Encoding: chunked."},
            413: {"model": ErrorBody, "description": "Body over the size limit."},
            503: {"description": "Too many connections in service (uvicorn's plain-text Service Unavailable)."},
        },
    )
    async def score(request: Request) -> Response:
        return await _score(service, limits, request)

    _add_views(app, service)
    return app


def _add_views(app: FastAPI, service: RouterService) -> None:
    """The read-only routes: GET /workers, /metrics, /status.json, / (the page), /healthz."""

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


# ---------------------------------------------------------------- uvicorn on a thread


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol plus TCP_NODELAY, one write per response (kvevents.consumers.http_wire)
    and a header timeout: a connection waiting for a request's headers (a new one, or between
    keep-alive requests once bytes arrive) is closed after `header_timeout_s`."""

    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        set_nodelay(transport.get_extra_info("socket"))  # issue 30: whatever socket the listener made
        self._wire = OneWrite(transport, self.loop)
        super().connection_made(cast(asyncio.Transport, self._wire))
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm()

    def on_response_complete(self) -> None:
        self._wire.flush()  # head, body and end as one send
        super().on_response_complete()

    def data_received(self, data: bytes) -> None:
        if self.cycle is None or self.cycle.response_complete:
            self._arm()  # bytes of a next request: its headers are due
        super().data_received(data)
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # the headers are in: the body timeout (in the app) takes over

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
            self.transport.close()


class HttpServer:
    """uvicorn serving `app` on its own thread and event loop; `start()` returns the bound address."""

    def __init__(self, app: FastAPI, limits: HttpLimits) -> None:
        self.limits = limits
        protocol = type("RouteProtocol", (_Protocol,), {"header_timeout_s": limits.header_timeout_s})
        self.config = uvicorn.Config(
            app,
            http=protocol,
            lifespan="off",
            access_log=False,
            log_config=None,
            log_level="error",  # not a line per malformed request or dropped client
            timeout_keep_alive=int(max(1, round(limits.keep_alive_s))),
            limit_concurrency=limits.max_connections,
            backlog=limits.backlog,
            server_header=False,
        )
        self.server = uvicorn.Server(self.config)
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

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
