"""`kvevents route`: the HTTP router service (kvevents.consumers.service.core.RouterService) over
ZeroMQ publishers or a JetStream stream; on stderr until Ctrl-C (then a summary, exit 130): what
each source publishes against --page-size and --key-mode, a likely misconfiguration its sockets
saw (kvevents.published.SourceNotes), stale / heard-again lines."""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

import typer

from kvevents.cli.app import publisher_option, user_error
from kvevents.cli.config import takes_config
from kvevents.cli.helpfmt import in_panel
from kvevents.cli.options import (
    CURVE_CLIENT_CERT,
    CURVE_SERVER_KEYS,
    INSECURE,
    MAX_SOURCES,
    NATS_STREAM,
    SIGN_KEY,
    NatsFlags,
    host_port,
    jetstream_feed,
    nats_flags,
    with_curve,
)
from kvevents.cli.output import err_line
from kvevents.cli.route_front import API_KEY_ENV, READ_ONLY_KEY_ENV, front_security, make_proxy, served, worker_urls
from kvevents.cli.route_options import POLICY_HELP, routing_options
from kvevents.cli.stopping import StopSignals

_TAG = "kvevents route:"


_SOURCES, _FRONT, _PROXY, _COST = "Sources and index", "HTTP front", "Proxy", "Cost routing"


@takes_config
@nats_flags
def route_cmd(
    publisher: list[str] = publisher_option([], "publisher"),
    nats_url: Optional[str] = typer.Option(
        None,
        "--nats",
        help="Read a NATS JetStream stream (kvevents bridge) instead: server URL(s).",
        rich_help_panel=_SOURCES,
    ),
    stream: str = NATS_STREAM,
    http: str = typer.Option(
        "127.0.0.1:8080",
        "--http",
        help="HOST:PORT to serve POST /score, GET /workers, GET /metrics, GET /openapi.json.",
        rich_help_panel=_FRONT,
    ),
    page_size: int = typer.Option(
        16, "--page-size", help="Tokens per page, as the engines use (>= 1).", rich_help_panel=_SOURCES
    ),
    lora_strict: bool = typer.Option(
        True,
        "--lora-strict/--no-lora-strict",
        help="Credit only copies of the request's lora_name.",
        rich_help_panel=_SOURCES,
    ),
    stale_after: float = typer.Option(
        5.0, "--stale-after", help="Seconds without a message before a source is stale.", rich_help_panel=_SOURCES
    ),
    seed: Optional[int] = typer.Option(
        None, "--seed", help="Seed of the random tie-break (default: random).", rich_help_panel=_COST
    ),
    max_connections: int = typer.Option(
        1000,
        "--max-connections",
        help="HTTP requests in service at once (idle connections do not count); past it requests queue "
        "(up to 2,048, for up to 10 s), then get 503 with Retry-After.",
        rich_help_panel=_FRONT,
    ),
    key_mode: list[str] = typer.Option(
        [],
        "--key-mode",
        metavar="[NAME=]MODE",
        help="MODE contract, tokens or auto: how a publisher's blocks are keyed "
        "(auto, the default: detected from its first stored blocks; tokens: any engine, e.g. vLLM); "
        "a bare MODE sets it for every publisher not named.",
        rich_help_panel=_SOURCES,
    ),
    medium_weight: list[str] = typer.Option(
        [],
        "--medium-weight",
        help="NAME=W: the credit of a page held on medium NAME (repeatable; W >= 0). Defaults: GPU 1.0, "
        "CPU_PINNED and CPU (host memory) 0.8, STORAGE, DISK, EXTERNAL and FS 0.5, any other 0.5.",
        rich_help_panel=_SOURCES,
    ),
    curve_server_key: list[str] = in_panel(CURVE_SERVER_KEYS, "CURVE"),
    curve_client_cert: Optional[str] = in_panel(CURVE_CLIENT_CERT, "CURVE"),
    tokenizer: Optional[str] = typer.Option(
        None,
        "--tokenizer",
        metavar="DIR",
        help="A Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json with its chat "
        "template): /score then takes prompt (text) or messages (chat) as the engine tokenizes them.",
        rich_help_panel=_SOURCES,
    ),
    proxy: bool = typer.Option(
        False,
        "--proxy",
        help="Also serve OpenAI's /v1/completions, /v1/chat/completions and /v1/models, each request sent to "
        "the best-ranked worker (README: The proxy).",
        rich_help_panel=_PROXY,
    ),
    worker_url: list[str] = typer.Option(
        [],
        "--worker-url",
        metavar="NAME=URL",
        help="NAME=http://HOST:PORT: where the proxy sends publisher NAME's requests (every dp rank); "
        "NAME#dpR=URL for rank R alone. Repeatable.",
        rich_help_panel=_PROXY,
    ),
    upstream_timeout: float = typer.Option(
        600.0,
        "--upstream-timeout",
        help="Proxy: seconds to wait for a worker's next byte (> 0).",
        rich_help_panel=_PROXY,
    ),
    api_key: Optional[str] = typer.Option(
        None,
        "--api-key",
        envvar=API_KEY_ENV,
        help="A bearer token every endpoint but /healthz requires (Authorization: Bearer KEY).",
        rich_help_panel=_FRONT,
    ),
    read_only_key: Optional[str] = typer.Option(
        None,
        "--read-only-key",
        envvar=READ_ONLY_KEY_ENV,
        help="A second token for GET /workers, /status.json, / and /metrics only (no copies by adapter).",
        rich_help_panel=_FRONT,
    ),
    tls_cert: Optional[str] = typer.Option(
        None, "--tls-cert", help="Serve HTTPS with this PEM certificate (chain).", rich_help_panel=_FRONT
    ),
    tls_key: Optional[str] = typer.Option(
        None, "--tls-key", help="The PEM private key of --tls-cert.", rich_help_panel=_FRONT
    ),
    policy: str = typer.Option("cost", "--policy", help=POLICY_HELP, rich_help_panel=_COST),
    prefill_load_scale: float = typer.Option(
        1.0, "--prefill-load-scale", help="The cost's weight of prefill blocks.", rich_help_panel=_COST
    ),
    temperature: float = typer.Option(
        0.0, "--temperature", help="> 0: draw the pick by softmax(-cost/T); 0: lowest.", rich_help_panel=_COST
    ),
    metrics_url: list[str] = typer.Option(
        [],
        "--metrics-url",
        help="NAME=URL: scrape that publisher's engine /metrics (vLLM or SGLang) for its load.",
        rich_help_panel=_COST,
    ),
    load_stale_after: float = typer.Option(
        5.0, "--load-stale-after", help="Seconds before a load is load_stale.", rich_help_panel=_COST
    ),
    predicted_ttl: float = typer.Option(
        2.0, "--predicted-ttl", help="Seconds a routed request's pages count as predicted.", rich_help_panel=_COST
    ),
    sign_key: Optional[str] = SIGN_KEY,
    insecure: bool = INSECURE,
    max_sources: int = MAX_SOURCES,
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
    from kvevents.consumers.service.http_api import HttpLimits

    _check_numbers(page_size, stale_after, max_connections)
    nats_flags.check(nats_url)
    sources = _sources(publisher, nats_url, curve_server_key, curve_client_cert)
    default_mode, modes = _key_modes(key_mode, sources)
    host, port = host_port("--http", http)
    settings: dict[str, Any] = dict(
        page_size=page_size,
        lora_strict=lora_strict,
        seed=seed,
        key_modes=modes,
        default_key_mode=default_mode,
        medium_weights=_medium_weights(medium_weight),
        renderer=_renderer(tokenizer),
        routing=routing_options(
            policy,
            prefill_load_scale,
            temperature,
            metrics_url,
            load_stale_after,
            predicted_ttl,
            [s.name or "" for s in sources] if sources else None,
        ),
    )
    urls = worker_urls(proxy, worker_url)
    security = front_security(api_key, read_only_key, tls_cert, tls_key, host)
    # this command prints its own stale / back lines (below): the subscriber's warning would repeat them
    logging.getLogger("kvevents.zeromq.subscriber").setLevel(logging.ERROR)
    trust: dict[str, Any] = dict(sign_key=sign_key, insecure=insecure, max_sources=max_sources)
    service = _service(sources, nats_url, stream, stale_after, settings, nats_flags, trust)
    t0 = time.monotonic()
    try:
        try:
            front = make_proxy(service, urls, upstream_timeout, max_connections, security)
            service.start()
            limits = HttpLimits(max_connections=max_connections)
            bound = service.serve_http(host, port, limits, security=security, proxy=front)
        except ValueError as exc:
            user_error(str(exc))
        feeds = f"stream {stream}" if nats_url else f"{len(sources)} publisher(s)"
        scheme = "https" if security.tls else "http"
        err_line(f"{_TAG} {feeds} -> {scheme}://{bound[0]}:{bound[1]} (Ctrl-C to stop)")  # within 80 columns
        for line in served(front):
            err_line(f"{_TAG} {line}")
        interrupted = _report(service, stale_after, page_size)
    finally:
        service.stop()
    err_line(f"{_TAG} stopped after {time.monotonic() - t0:.1f}s: {_summary(service)}")
    if interrupted:
        raise typer.Exit(130)


def _check_numbers(page_size: int, stale_after: float, max_connections: int) -> None:
    if page_size < 1:
        user_error(f"--page-size must be >= 1, got {page_size}")
    if not stale_after > 0:
        user_error(f"--stale-after must be > 0, got {stale_after}")
    if max_connections < 1:
        user_error(f"--max-connections must be >= 1, got {max_connections}")


def _sources(
    publisher: list[str], nats_url: Optional[str], server_keys: list[str], client_cert: Optional[str]
) -> list[Any]:
    """The --publisher sources, with their CURVE keys (none with --nats)."""
    from kvevents.consumers.service.core import parse_publisher

    if (nats_url is None) == (not publisher):
        user_error("give --publisher NAME=ENDPOINT[,REPLAY] ... or --nats URL --stream NAME (one of them)")
    try:
        sources = [parse_publisher(spec) for spec in publisher]
    except ValueError as exc:
        user_error(str(exc))
    return with_curve(sources, server_keys, client_cert)


def _key_modes(key_mode: list[str], sources: list[Any]) -> tuple[str, dict[str, str]]:
    """--key-mode values -> (the default mode, {publisher name: mode})."""
    from kvevents.consumers.keying import parse_key_modes

    try:
        return parse_key_modes(key_mode, [s.name or "" for s in sources])
    except ValueError as exc:
        user_error(str(exc))


def _medium_weights(specs: list[str]) -> dict[str, float]:
    """--medium-weight NAME=W values over the defaults (one line and exit 2 on a bad one)."""
    from kvevents.consumers.router import parse_medium_weights

    try:
        return parse_medium_weights(specs)
    except ValueError as exc:
        user_error(str(exc))


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
    trust: dict[str, Any],
) -> Any:  # RouterService
    """The router service over the sources, or over the JetStream feed (one line while NATS is unreachable)."""
    from kvevents.consumers.service.core import RouterService

    if nats_url is not None:
        feed = jetstream_feed(nats_url, stream, "route", flags, stale_after_s=stale_after, **trust)
        return RouterService(feed=feed, **settings)
    return RouterService(sources, stale_after_s=stale_after, **settings)


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
