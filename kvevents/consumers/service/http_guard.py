"""What a connection or a request may hold at the router's HTTP front (issue 28 part 2).

Working requests and idle sockets are bounded apart, so neither starves the other:
- `Admission`: at most `limit` requests in service (headers read, answer not yet sent); past it a
  request waits its turn in a FIFO of at most `queue` for up to `wait_s`, and only past that is it
  refused (503 with Retry-After). A socket that sent nothing is never in service.
- `PendingConnections`: connections that have not sent a whole request's headers (new ones, and
  kept-alive ones between requests) are at most `limit`; one more closes the oldest of them if it
  has waited `min_age_s` (a burst's connections, accepted before their requests are read, are
  young: they are never closed for it).
- `AdmittedApp`: the ASGI wrapper that puts every HTTP request through an Admission.
- `ensure_fd_limit`: the soft RLIMIT_NOFILE raised to cover every connection the bounds allow.
Everything but `ensure_fd_limit` runs on the server's event loop thread only (no locks).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Callable, Protocol

import msgspec
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["Admission", "AdmittedApp", "PendingConnections", "busy_response", "ensure_fd_limit"]

log = logging.getLogger("consumers.http")

RETRY_AFTER_S = 1  # what a refused client is told to wait


class Admission:
    """At most `limit` holders at once, then a FIFO of at most `queue` waiters of at most `wait_s`
    each; a freed place passes straight to the oldest waiter. `counts` (fixed keys) say what happened."""

    def __init__(self, limit: int, queue: int, wait_s: float, name: str = "requests") -> None:
        if limit < 1 or queue < 0 or not wait_s > 0:
            raise ValueError(f"admission needs limit >= 1, queue >= 0, wait_s > 0 (got {limit}, {queue}, {wait_s})")
        self.limit, self.queue, self.wait_s, self.name = limit, queue, wait_s, name
        self.active = 0
        self._waiters: deque[asyncio.Future[bool]] = deque()
        self.counts = {"admitted": 0, "queued": 0, "refused_queue_full": 0, "refused_wait": 0}

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def enter(self) -> str | None:
        """None once a place is held (give it back with `leave()`), else why the request is refused."""
        if self.active < self.limit and not self._waiters:
            self.active += 1
            self.counts["admitted"] += 1
            return None
        if len(self._waiters) >= self.queue:
            self.counts["refused_queue_full"] += 1
            return f"{self.active} {self.name} in service and {len(self._waiters)} waiting (the most allowed)"
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(fut)
        self.counts["queued"] += 1
        timer = loop.call_later(self.wait_s, self._expire, fut)
        try:
            granted = await fut
        except asyncio.CancelledError:
            self._withdraw(fut)
            raise
        finally:
            timer.cancel()
        if not granted:
            self.counts["refused_wait"] += 1
            return f"waited {self.wait_s:g} s behind {self.active} {self.name} in service"
        self.counts["admitted"] += 1
        return None

    def leave(self) -> None:
        """Give a place back: to the oldest waiter if there is one."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(True)  # the place passes on: `active` stays
                return
        self.active -= 1

    def _expire(self, fut: asyncio.Future[bool]) -> None:
        if not fut.done():
            self._waiters.remove(fut)
            fut.set_result(False)

    def _withdraw(self, fut: asyncio.Future[bool]) -> None:
        """A waiter's task was cancelled: drop it, or hand back the place it was just given."""
        if fut.done() and not fut.cancelled() and fut.result():
            self.leave()
        elif fut in self._waiters:
            self._waiters.remove(fut)


_json = msgspec.json.Encoder()


def busy_response(why: str) -> tuple[bytes, dict[str, str]]:
    """The 503 every refusal answers: a JSON error, Retry-After, and the connection closed."""
    body = _json.encode({"error": f"server busy: {why}; retry after {RETRY_AFTER_S} s"}) + b"\n"
    return body, {"Retry-After": str(RETRY_AFTER_S), "Connection": "close"}


class AdmittedApp:
    """An ASGI app that holds an Admission place for each HTTP request it passes to `app`."""

    def __init__(self, app: ASGIApp, admission: Admission) -> None:
        self.app = app
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = await self.admission.enter()
        if refused is not None:
            body, extra = busy_response(refused)
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            headers += [(k.lower().encode(), v.encode()) for k, v in extra.items()]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.leave()


class Evictable(Protocol):
    def evict(self) -> None: ...


class PendingConnections:
    """The connections that have not sent a request, oldest first; past `limit` the oldest is
    closed once it has waited `min_age_s` (a client sends its request as it connects, so the
    oldest is the likeliest idler). `clock` is injectable for tests."""

    def __init__(self, limit: int, min_age_s: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1:
            raise ValueError(f"max idle connections must be >= 1, got {limit}")
        self.limit, self.min_age_s, self._clock = limit, min_age_s, clock
        self._since: dict[Evictable, float] = {}
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._since)

    def add(self, conn: Evictable) -> None:
        """`conn` waits for a request (again): it becomes the youngest; the oldest past the limit close."""
        now = self._clock()
        self._since.pop(conn, None)
        self._since[conn] = now
        while len(self._since) > self.limit:
            oldest, since = next(iter(self._since.items()))
            if now - since < self.min_age_s:
                break  # all young: a burst being read, not idlers
            del self._since[oldest]
            self.evicted += 1
            oldest.evict()

    def discard(self, conn: Evictable) -> None:
        """`conn` sent a request's headers, or closed."""
        self._since.pop(conn, None)


def ensure_fd_limit(needed: int) -> int:
    """Raise the soft limit on open files to `needed` if it is lower (up to the hard limit);
    the soft limit now in force (-1 where the platform has none). One warning line if short."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return int(soft)
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    except (ValueError, OSError):
        pass
    if soft < needed:
        log.warning("open-file limit %d is below the %d connections the HTTP limits allow", soft, needed)
    return int(soft)
