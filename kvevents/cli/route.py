"""`kvevents route`: the HTTP router service (kvevents.consumers.service.core.RouterService) over
ZeroMQ publishers or a JetStream stream; on stderr until Ctrl-C (then a summary, exit 130): what
each source publishes against --page-size and --key-mode, a likely misconfiguration its sockets
saw (kvevents.published.SourceNotes), stale / heard-again lines."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Optional

import typer

from kvevents.cli.app import publisher_option, user_error
from kvevents.cli.config import takes_config
from kvevents.cli.flag_groups import flag_group
from kvevents.cli.options import NATS_STREAM, CurveClients, NatsFlags, host_port, jetstream_feed, nats_feed_flags
from kvevents.cli.output import err_line
from kvevents.cli.route_front import AuthFlags, ProxyFlags, make_proxy, served
from kvevents.cli.route_options import CostFlags, IndexFlags, KeyingFlags
from kvevents.cli.stopping import StopSignals

_TAG = "kvevents route:"


_SOURCES, _FRONT, _PROXY, _COST = "Sources and index", "HTTP front", "Proxy", "Cost routing"

NATS_URL = typer.Option(
    None,
    "--nats",
    help="Read a NATS JetStream stream (kvevents bridge) instead: server URL(s).",
    rich_help_panel=_SOURCES,
)
HTTP = typer.Option(
    "127.0.0.1:8080",
    "--http",
    help="HOST:PORT to serve POST /score, GET /workers, GET /metrics, GET /openapi.json.",
    rich_help_panel=_FRONT,
)
SEED = typer.Option(None, "--seed", help="Seed of the random tie-break (default: random).", rich_help_panel=_COST)
MAX_CONNECTIONS = typer.Option(
    1000,
    "--max-connections",
    help="HTTP requests in service at once (idle connections do not count); past it requests queue "
    "(up to 2,048, for up to 10 s), then get 503 with Retry-After.",
    rich_help_panel=_FRONT,
)
LONG_BODY_RATE = typer.Option(
    48.0,
    "--long-body-rate",
    metavar="MIB_S",
    help="MiB/s at which /score bodies over 64 KiB are read, all of them together (0: unpaced), "
    "so a few huge bodies leave the router's time to normal requests.",
    rich_help_panel=_FRONT,
)
TOKENIZER = typer.Option(
    None,
    "--tokenizer",
    metavar="DIR",
    help="A Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json with its chat "
    "template): /score then takes prompt (text) or messages (chat) as the engine tokenizes them.",
    rich_help_panel=_SOURCES,
)


@dataclass(frozen=True)
class _Front:
    """Where and how the HTTP front serves: address, connection cap, keys and TLS, proxy targets."""

    host: str
    port: int
    max_connections: int
    long_body_rate: float  # MiB/s
    security: Any  # HttpSecurity
    urls: list[Any]  # WorkerUrl
    upstream_timeout: float


@takes_config
@nats_feed_flags  # above AuthFlags: route's own --tls-cert makes its NATS TLS flags --nats-tls-*
@flag_group(IndexFlags, "index", _SOURCES)
@flag_group(KeyingFlags, "keying", _SOURCES)
@flag_group(CurveClients, "curve", "CURVE")
@flag_group(ProxyFlags, "proxy", _PROXY)
@flag_group(AuthFlags, "auth", _FRONT)
@flag_group(CostFlags, "cost", _COST)
def route_cmd(
    publisher: list[str] = publisher_option([], "publisher"),
    nats_url: Optional[str] = NATS_URL,
    stream: str = NATS_STREAM,
    http: str = HTTP,
    index: IndexFlags = IndexFlags(),
    seed: Optional[int] = SEED,
    max_connections: int = MAX_CONNECTIONS,
    long_body_rate: float = LONG_BODY_RATE,
    keying: KeyingFlags = KeyingFlags(),
    curve: CurveClients = CurveClients(),
    tokenizer: Optional[str] = TOKENIZER,
    proxy: ProxyFlags = ProxyFlags(),
    auth: AuthFlags = AuthFlags(),
    cost: CostFlags = CostFlags(),
    nats_flags: NatsFlags = NatsFlags(),
) -> None:
    """Subscribe to publishers, keep a block index, and rank workers for requests over HTTP.

    POST /score takes a JSON object: tokens (token ids), or prompt / messages with --tokenizer;
    cache_salt, lora_name, top_k, explain.

    It answers the workers best first by cost (worker, dp_rank, cost, matched_pages, queue, stale, ...):
    cached prefix against load, load from the body, the engines' --metrics-url pages or the router itself.

    Request and response schemas: GET /openapi.json (README: "The router's HTTP API").
    Ctrl-C prints a summary and exits 130.
    """
    index.check()
    if max_connections < 1:
        user_error(f"--max-connections must be >= 1, got {max_connections}")
    if not long_body_rate >= 0:
        user_error(f"--long-body-rate must be >= 0 MiB/s, got {long_body_rate}")
    nats_flags.check(nats_url)
    sources = _sources(publisher, nats_url, curve)
    modes = keying.modes(sources)
    host, port = host_port("--http", http)
    settings = _settings(index, seed, modes, keying, tokenizer, cost, sources)
    urls = proxy.urls()
    front = _Front(host, port, max_connections, long_body_rate, auth.security(host), urls, proxy.upstream_timeout)
    # this command prints its own stale / back lines (below): the subscriber's warning would repeat them
    logging.getLogger("kvevents.zeromq.subscriber").setLevel(logging.ERROR)
    service = _service(sources, nats_url, stream, index.stale_after, settings, nats_flags)
    feeds = f"stream {stream}" if nats_url else f"{len(sources)} publisher(s)"
    if _run(service, front, feeds, index):
        raise typer.Exit(130)


def _sources(publisher: list[str], nats_url: Optional[str], curve: CurveClients) -> list[Any]:
    """The --publisher sources, with their CURVE keys (none with --nats)."""
    from kvevents.consumers.service.core import parse_publisher

    if (nats_url is None) == (not publisher):
        user_error("give --publisher NAME=ENDPOINT[,REPLAY] ... or --nats URL --stream NAME (one of them)")
    try:
        sources = [parse_publisher(spec) for spec in publisher]
    except ValueError as exc:
        user_error(str(exc))
    return curve.apply(sources)


def _settings(
    index: IndexFlags,
    seed: Optional[int],
    modes: tuple[str, dict[str, str]],
    keying: KeyingFlags,
    tokenizer: Optional[str],
    cost: CostFlags,
    sources: list[Any],
) -> dict[str, Any]:
    """The RouterService's settings from the flags (each checked: one line and exit 2)."""
    default_mode, key_modes = modes
    return dict(
        page_size=index.page_size,
        lora_strict=index.lora_strict,
        seed=seed,
        key_modes=key_modes,
        default_key_mode=default_mode,
        medium_weights=keying.weights(),
        renderer=_renderer(tokenizer),
        routing=cost.routing([s.name or "" for s in sources] if sources else None),
    )


def _renderer(directory: Optional[str]) -> Any:
    """--tokenizer DIR -> a PromptRenderer (one line and exit 2 when it cannot be loaded)."""
    if directory is None:
        return None
    from kvevents.consumers.prompts import PromptRenderer

    try:
        return PromptRenderer.from_dir(directory)
    except ValueError as exc:
        user_error(f"--tokenizer: {exc}")


def _service(
    sources: list[Any],
    nats_url: Optional[str],
    stream: str,
    stale_after: float,
    settings: dict[str, Any],
    flags: NatsFlags,
) -> Any:  # RouterService
    """The router service over the sources, or over the JetStream feed (one line while NATS is unreachable)."""
    from kvevents.consumers.service.core import RouterService

    if nats_url is not None:
        feed = jetstream_feed(nats_url, stream, "route", flags, stale_after_s=stale_after)
        return RouterService(feed=feed, **settings)
    return RouterService(sources, stale_after_s=stale_after, **settings)


def _start(service: Any, front: _Front) -> tuple[Any, tuple[str, int]]:
    """Start the service and its HTTP front: (the proxy, None without --proxy; the bound address)."""
    from kvevents.consumers.service.http_api import HttpLimits

    try:
        proxy = make_proxy(service, front.urls, front.upstream_timeout, front.max_connections, front.security)
        service.start()
        rate = int(front.long_body_rate * 1024 * 1024)
        limits = HttpLimits(max_connections=front.max_connections, long_body_rate=rate)
        bound = service.serve_http(front.host, front.port, limits, security=front.security, proxy=proxy)
    except ValueError as exc:
        user_error(str(exc))
    return proxy, bound


def _run(service: Any, front: _Front, feeds: str, index: IndexFlags) -> bool:
    """Serve until Ctrl-C / SIGTERM or the feed's end, then stop and print the summary; True for Ctrl-C."""
    t0 = time.monotonic()
    try:
        proxy, bound = _start(service, front)
        scheme = "https" if front.security.tls else "http"
        err_line(f"{_TAG} {feeds} -> {scheme}://{bound[0]}:{bound[1]} (Ctrl-C to stop)")  # within 80 columns
        for line in served(proxy):
            err_line(f"{_TAG} {line}")
        interrupted = _report(service, index.stale_after, index.page_size)
    finally:
        service.stop()
    err_line(f"{_TAG} stopped after {time.monotonic() - t0:.1f}s: {_summary(service)}")
    return interrupted


def _report(service: Any, stale_after: float, page_size: int) -> bool:
    """Until SIGINT / SIGTERM (True for SIGINT) or the feed's end: per source what it publishes
    (once learned) or why it cannot be indexed, a likely misconfiguration, stale and heard-again."""
    from kvevents.published import SourceNotes

    signals = StopSignals()
    stop = signals.stop
    notes = SourceNotes(page_size, service.keyer.mode)
    while not stop.wait(0.5):
        for line in notes.lines(service.feed.status()):
            err_line(f"{_TAG} {line}")
        for name, stale in service.stale_changes():
            if stale:
                err_line(f"{_TAG} {name}: nothing heard for {stale_after:g} s (stale; /score says so)")
            else:
                err_line(f"{_TAG} {name}: heard again (no longer stale)")
        for line in service.scraper.take_notices():
            err_line(f"{_TAG} {line}")
        error = getattr(service.feed, "error", None)
        if error is not None:  # the JetStream feed gave up (--give-up-after): one line, exit 2
            raise error
    for line in notes.lines(service.feed.status()):  # what was learned since the last turn
        err_line(f"{_TAG} {line}")
    return signals.interrupted


def _summary(service: Any) -> str:
    """What the router did: batches applied by kind, resets, index copies."""
    s = service.stats()
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(s["batches"].items())) or "none"
    resets = sum(s["resets"].values())
    return f"applied batches {kinds}; resets {resets}; {s['copies']} block copies indexed"
