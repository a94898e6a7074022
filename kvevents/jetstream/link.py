"""What the JetStream bridge and source share: subjects, headers, connection options, the stream.

Subjects are `kvevents.<stream>.<source>.<dp_rank>` (live batches, payload bytes unchanged) and
`kvevents.<stream>.<source>.<dp_rank>.snap` (snapshot parts and their end marker). nats-py is
asyncio; `LoopThread` runs one event loop on a daemon thread so synchronous code can drive it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Coroutine, TypeVar

from kvevents.errors import KVEventsError

__all__ = [
    "ROOT",
    "H_SEQ",
    "H_EPOCH",
    "H_RANK",
    "H_KIND",
    "H_SNAP",
    "H_PART",
    "H_PARTS",
    "H_FROM",
    "H_SOURCE",
    "NatsOptions",
    "StreamOptions",
    "NatsUnavailable",
    "LoopThread",
    "check_token",
    "live_subject",
    "snap_subject",
    "stream_filter",
    "parse_subject",
    "connect",
    "close",
    "ensure_stream",
    "retry",
    "epoch_text",
    "parse_epoch",
]

log = logging.getLogger("kvevents.nats")

ROOT = "kvevents"
H_SOURCE = "Kve-Source"
H_SEQ = "Kve-Seq"  # live: the engine seq; snapshot: the seq S it covers (-1: nothing published yet)
H_EPOCH = "Kve-Epoch"  # the engine's epoch (KVE/DESCRIBE or the batch), "" when unknown
H_RANK = "Kve-Rank"
H_KIND = "Kve-Kind"  # "live" | "part" | "end"
H_SNAP = "Kve-Snap"  # snapshot id: the parts and end marker of one snapshot share it
H_PART = "Kve-Part"  # part index 0..N-1
H_PARTS = "Kve-Parts"  # N, on the end marker
H_FROM = "Kve-From"  # stream seq from which the batches after S are found (cold start reads from there)

_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")
T = TypeVar("T")


class NatsUnavailable(KVEventsError, ConnectionError):
    """NATS could not be reached (or the stream used) within the time allowed."""


def check_token(what: str, value: str) -> str:
    """`value` if it can be one NATS subject token and stream name (letters, digits, - and _)."""
    if not isinstance(value, str) or not _TOKEN.match(value):
        raise ValueError(f"{what} {value!r}: use letters, digits, '-' and '_' only (it becomes a NATS subject token)")
    return value


def live_subject(stream: str, source: str, rank: int) -> str:
    return f"{ROOT}.{stream}.{source}.{rank}"


def snap_subject(stream: str, source: str, rank: int) -> str:
    return f"{ROOT}.{stream}.{source}.{rank}.snap"


def stream_filter(stream: str) -> str:
    return f"{ROOT}.{stream}.>"


def parse_subject(subject: str) -> tuple[str, int, bool] | None:
    """(source, dp_rank, is_snapshot) of one of our subjects, None for anything else."""
    parts = subject.split(".")
    if len(parts) not in (4, 5) or parts[0] != ROOT or (len(parts) == 5 and parts[4] != "snap"):
        return None
    try:
        rank = int(parts[3])
    except ValueError:
        return None
    return parts[2], rank, len(parts) == 5


def epoch_text(epoch: int | None) -> str:
    return "" if epoch is None else str(epoch)


def parse_epoch(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        return None


#: URL schemes nats-py connects with (an http:// URL would be tried as a host name, then fail on DNS).
NATS_SCHEMES = ("nats", "tls", "ws", "wss")


@dataclass
class NatsOptions:
    """How to reach NATS: what nats-py's `connect` takes, from the command line.

    `url`: one or more comma-separated server URLs (`nats://host:4222`, `tls://host:4222`,
    `ws://` / `wss://`, `nats://user:pass@host:4222`, `nats://token@host:4222`). `creds`: a
    decentralized-auth credentials file (JWT + NKey seed). `tls_ca` / `tls_cert` / `tls_key`:
    PEM files for server verification and client certificates (a `tls://` URL alone uses the system CAs).
    """

    url: str = "nats://127.0.0.1:4222"
    creds: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    name: str = "kvevents"
    connect_timeout_s: float = 2.0

    def servers(self) -> list[str]:
        out = [u.strip() for u in self.url.split(",") if u.strip()]
        if not out:
            raise ValueError("--nats: expected a URL such as nats://127.0.0.1:4222")
        for u in out:
            scheme, sep, _rest = u.partition("://")
            if not sep:
                raise ValueError(
                    f"--nats {u!r}: expected a URL such as nats://127.0.0.1:4222 (schemes nats, tls, ws, wss)"
                )
            if scheme.lower() not in NATS_SCHEMES:
                raise ValueError(
                    f"--nats {u!r}: {scheme}:// is not a NATS scheme: use nats://HOST:4222 (or tls://, ws://, wss://)"
                )
        return out

    def redacted(self) -> str:
        """The URL list without passwords or tokens (for messages)."""
        return ",".join(re.sub(r"://[^@/]*@", "://***@", u) for u in self.servers())

    def connect_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"servers": self.servers(), "name": self.name}
        if self.creds:
            kw["user_credentials"] = self.creds
        if self.tls_ca or self.tls_cert:
            ctx = ssl.create_default_context(cafile=self.tls_ca)
            if self.tls_cert:
                ctx.load_cert_chain(self.tls_cert, self.tls_key)
            kw["tls"] = ctx
        return kw


@dataclass
class StreamOptions:
    """Retention of the stream when kvevents creates it (an existing stream is used as it is)."""

    max_age_s: float = 3600.0
    max_bytes: int | None = None
    replicas: int = 1
    storage: str = "file"  # "file" | "memory"
    duplicate_window_s: float = 120.0

    def config(self, stream: str) -> Any:
        from nats.js.api import StorageType, StreamConfig

        if self.max_age_s <= 0:
            raise ValueError(f"--max-age must be > 0 seconds, got {self.max_age_s:g}")
        if self.storage not in ("file", "memory"):
            raise ValueError(f"--storage must be file or memory, got {self.storage!r}")
        return StreamConfig(
            name=stream,
            subjects=[stream_filter(stream)],
            max_age=self.max_age_s,
            max_bytes=self.max_bytes if self.max_bytes else -1,
            num_replicas=max(1, self.replicas),
            storage=StorageType.FILE if self.storage == "file" else StorageType.MEMORY,
            duplicate_window=min(self.duplicate_window_s, self.max_age_s),
        )


class LoopThread:
    """One asyncio event loop on a daemon thread; synchronous callers submit coroutines to it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self.submit(coro).result(timeout)

    def stop(self, timeout: float = 3.0) -> None:
        """Cancel what still runs, stop the loop, join the thread."""
        if not self._thread.is_alive():
            return

        async def _cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks(self.loop) if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.run(_cancel_all(), timeout)
        except Exception:  # noqa: BLE001 - best effort while shutting down
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


class _ConnectWatch:
    """nats-py's callbacks for one `connect`: errors kept quietly (for the retry message), drops warned."""

    def __init__(self, opts: NatsOptions, stop: Callable[[], bool]) -> None:
        self.opts = opts
        self.stop = stop
        self.last_error: str | None = None  # nats-py's own words for the newest failure
        self.nc: Any = None  # the connection, once made

    async def error(self, exc: Exception) -> None:
        """nats-py's error_cb: keep the newest reason, at debug level only."""
        self.last_error = " ".join(str(exc).split()) or type(exc).__name__
        log.debug("nats: %s", exc)

    async def disconnected(self) -> None:
        """nats-py's disconnected_cb: a warning, unless stopping or closing on purpose."""
        if not self.stop() and not (self.nc is not None and id(self.nc) in _closing):
            log.warning("nats: disconnected from %s, reconnecting", self.opts.redacted())

    async def reconnected(self) -> None:
        """nats-py's reconnected_cb: a warning, so a drop and its end both show in the log."""
        log.warning("nats: reconnected to %s", self.opts.redacted())

    def why(self, exc: Exception) -> str:
        """One line saying why a connect failed (nats-py's "no servers" replaced by the reason it saw)."""
        why = " ".join(str(exc).split()) or type(exc).__name__
        if type(exc).__name__ == "NoServersError" and self.last_error is not None:
            why = self.last_error
        return why


async def _connect_once(kw: dict[str, Any], opts: NatsOptions, watch: _ConnectWatch) -> Any:
    """One connect attempt; once connected, nats-py is left to reconnect by itself, forever."""
    import nats

    nc = await nats.connect(
        **kw,
        allow_reconnect=True,
        max_reconnect_attempts=1,  # the first connect: `connect` retries, with backoff
        reconnect_time_wait=0.5,
        connect_timeout=opts.connect_timeout_s,
        error_cb=watch.error,
        disconnected_cb=watch.disconnected,
        reconnected_cb=watch.reconnected,
    )
    nc.options["max_reconnect_attempts"] = -1  # connected once: nats-py reconnects by itself, forever
    watch.nc = nc
    return nc


async def connect(
    opts: NatsOptions,
    *,
    on_unreachable: Callable[[str], object] | None = None,
    give_up_after_s: float | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> Any:
    """Connect to NATS, retrying with backoff (0.2 s doubling to 5 s) until connected.

    The first failure is reported once through `on_unreachable` (one line, no traceback); later
    failures are logged at debug level. Once connected, nats-py reconnects by itself, forever.
    Raises NatsUnavailable after `give_up_after_s` (None: never gives up).
    """
    kw = opts.connect_kwargs()
    watch = _ConnectWatch(opts, stop)
    t0 = time.monotonic()
    delay = 0.2
    reported = False
    while True:
        try:
            return await _connect_once(kw, opts, watch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any connect failure is "unreachable": retry
            why = watch.why(exc)
            msg = f"NATS unreachable at {opts.redacted()} ({why}); retrying with backoff up to 5s"
            if reported:
                log.debug("%s", msg)
            elif on_unreachable is not None:
                on_unreachable(msg)
            else:
                log.warning("%s", msg)
            reported = True
            if stop() or (give_up_after_s is not None and time.monotonic() - t0 >= give_up_after_s):
                raise NatsUnavailable(f"NATS unreachable at {opts.redacted()} ({why})") from None
            await asyncio.sleep(delay)
            delay = min(5.0, delay * 2)


_closing: set[int] = set()


async def close(nc: Any, timeout: float = 2.0) -> None:
    """Close a connection from `connect` quietly (no disconnect warning, no error if already gone)."""
    _closing.add(id(nc))
    try:
        await asyncio.wait_for(nc.close(), timeout)
    except Exception:  # noqa: BLE001 - closing: nothing left to do about it
        pass
    finally:
        _closing.discard(id(nc))


async def ensure_stream(js: Any, stream: str, opts: StreamOptions | None, *, create: bool = True) -> Any:
    """The stream's info; created with `opts` when missing and `create` (else ValueError)."""
    from nats.js.errors import NotFoundError

    try:
        return await js.stream_info(stream)
    except NotFoundError:
        if not create:
            raise ValueError(f"JetStream stream {stream!r} does not exist (and creating it is off)") from None
    cfg = (opts or StreamOptions()).config(stream)
    log.info("creating JetStream stream %s on %s (max age %gs)", stream, cfg.subjects[0], cfg.max_age)
    return await js.add_stream(cfg)


async def retry(
    op: Callable[[], Awaitable[T]], what: str, *, attempts: int | None = None, stop: Callable[[], bool] = lambda: False
) -> T:
    """Run `op` until it succeeds, backing off 0.1 s doubling to 2 s (NATS down, stream leader moving).

    A ValueError (a mistake retrying cannot fix) is raised at once.
    """
    delay = 0.1
    n = 0
    while True:
        try:
            return await op()
        except (asyncio.CancelledError, ValueError):
            raise
        except Exception as exc:  # noqa: BLE001 - transient JetStream errors: retry
            n += 1
            if stop() or (attempts is not None and n >= attempts):
                raise
            if n == 1 or n % 20 == 0:
                log.warning("%s failed (%s: %s), retrying", what, type(exc).__name__, exc)
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)
