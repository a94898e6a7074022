"""POST /score over HTTP: what is checked before the body (411, 413, 415), the body read within its
limits, then scored on the event loop (a short one) or on the long-body pool (issue 28 part 2).

Only `application/json` bodies are parsed: text/plain and the form types are what a cross-site page
may POST without a CORS preflight, so /score refuses them (415) before reading a byte. A body up to
INLINE_BODY_BYTES is scored on the event loop (~0.4 ms, cheaper than a thread hop); a longer or
chunked one takes a place at kvevents.consumers.service.score_pool's gate first. Also the JSON
answers (`reply`, `bug`) every route of kvevents.consumers.service.http_api uses.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
from typing import Any, Protocol

import msgspec
from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from kvevents.consumers.service.http_guard import busy_response
from kvevents.consumers.service.score_pool import BodyTooLong, LongBodies, read_body, score_encoded
from kvevents.consumers.service.seams import HttpService

__all__ = ["INLINE_BODY_BYTES", "BodyLimits", "bug", "content_type_problem", "reply", "score"]

log = logging.getLogger("consumers.http")

_json = msgspec.json.Encoder()
INLINE_BODY_BYTES = 64 * 1024  # POST /score bodies up to this are scored on the event loop itself


class BodyLimits(Protocol):
    """What the /score path reads of the server's limits (kvevents.consumers.service.http_api.HttpLimits)."""

    @property
    def max_body_bytes(self) -> int: ...

    @property
    def body_timeout_s(self) -> float: ...


def reply(status: int, obj: Any, headers: dict[str, str] | None = None) -> Response:
    """A JSON answer (one line)."""
    return Response(_json.encode(obj) + b"\n", status, headers=headers, media_type="application/json")


def bug(request: Request, exc: Exception) -> Response:
    """A bug: one logged line and a 500 naming it, never a traceback."""
    log.error("%s %s failed: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
    return reply(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})


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


async def _score_inline(service: HttpService, limits: BodyLimits, request: Request) -> Response:
    """A short body: read and scored on the event loop (the usual request: ~0.4 ms)."""
    try:
        body = await _within(request.body(), limits.body_timeout_s)
    except asyncio.TimeoutError:
        return reply(408, {"error": f"body not received within {limits.body_timeout_s:g} s"}, _CLOSE)
    except ClientDisconnect:  # the client left mid-body: nobody to answer, nothing to log
        return Response(status_code=400)
    if len(body) > limits.max_body_bytes:
        return reply(413, {"error": f"body of {len(body)} bytes exceeds {limits.max_body_bytes}"}, _CLOSE)
    try:
        status, obj = service.handle_score(body)
    except Exception as exc:  # noqa: BLE001 - a bug answers 500 in one logged line, never a traceback
        return bug(request, exc)
    return reply(status, obj)


async def _score_long(
    service: HttpService, limits: BodyLimits, long: LongBodies, request: Request, declared: int | None
) -> Response:
    """A long (or chunked) body: a gate place first, then read into one buffer and scored on the pool."""
    refused = await long.gate.enter()
    if refused is not None:
        body, headers = busy_response(refused)
        return Response(body, 503, headers=headers, media_type="application/json")
    try:
        try:
            read = read_body(request.stream(), declared, limits.max_body_bytes, long.rate)
            allowed_s = limits.body_timeout_s + long.read_allowance(declared or limits.max_body_bytes)
            held = [await _within(read, allowed_s)]
        except asyncio.TimeoutError:
            return reply(408, {"error": f"body not received within {allowed_s:g} s"}, _CLOSE)
        except ClientDisconnect:
            return Response(status_code=400)
        except BodyTooLong as exc:
            return reply(413, {"error": str(exc)}, _CLOSE)
        try:
            status, answer = await long.run(functools.partial(score_encoded, service, held))
        except Exception as exc:  # noqa: BLE001 - as in _score_inline
            return bug(request, exc)
        return Response(answer, status, media_type="application/json")
    finally:
        long.gate.leave()


async def score(service: HttpService, limits: BodyLimits, long: LongBodies, request: Request) -> Response:
    """POST /score: its length, size and type checked, then the body read and scored (inline or long)."""
    length = request.headers.get("content-length")
    if length is None and "chunked" not in request.headers.get("transfer-encoding", "").lower():
        return reply(411, {"error": "a Content-Length header (or Transfer-Encoding: chunked) is required"}, _CLOSE)
    if length is not None and (not length.isdigit() or int(length) > limits.max_body_bytes):
        return reply(413, {"error": f"body of {length} bytes exceeds {limits.max_body_bytes}"}, _CLOSE)
    wrong_type = content_type_problem(request.headers.get("content-type"))
    if wrong_type is not None:
        return reply(415, {"error": wrong_type}, _CLOSE)
    if length is not None and int(length) <= INLINE_BODY_BYTES:
        return await _score_inline(service, limits, request)
    return await _score_long(service, limits, long, request, None if length is None else int(length))
