"""kvevents CLI commands for the consumers: `route` (the HTTP router service) and `demo`.

Thin: parse flags, call kvevents.consumers.service.core / kvevents.demo, render.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from typing import Any, Optional

import typer
from rich.console import Console

from kvevents.cli.app import CheckFailed, app, user_error
from kvevents.cli.keys import CLIENT_CERT_HELP, SERVER_KEYS_HELP, with_curve
from kvevents.cli.nats_trust import INSECURE_HELP, MAX_SOURCES_HELP, SIGN_KEY_HELP


def _host_port(spec: str) -> tuple[str, int]:
    host, sep, port = spec.rpartition(":")
    if not sep or not host:
        user_error(f"--http {spec!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    try:
        num = int(port)
    except ValueError:
        user_error(f"--http {spec!r}: port {port!r} is not a number")
    if not 0 <= num <= 65535:
        user_error(f"--http {spec!r}: port must be in 0..65535")
    return host.strip("[]"), num


def _renderer(directory: Optional[str]) -> Any:
    """--tokenizer DIR -> a PromptRenderer (one line and exit 2 when it cannot be loaded)."""
    if directory is None:
        return None
    from kvevents.consumers.prompts import PromptRenderer

    try:
        return PromptRenderer.from_dir(directory)
    except ValueError as exc:
        user_error(f"--tokenizer: {exc}")


@app.command("route")
def route_cmd(
    publisher: list[str] = typer.Option(
        [], "--publisher", help="NAME=ENDPOINT[,REPLAY_ENDPOINT]; repeat for every publisher."
    ),
    nats_url: Optional[str] = typer.Option(
        None, "--nats", help="Read a NATS JetStream stream (kvevents bridge) instead: server URL(s)."
    ),
    stream: str = typer.Option("kvevents", "--stream", help="With --nats: the JetStream stream name."),
    http: str = typer.Option(
        "127.0.0.1:8080",
        "--http",
        help="HOST:PORT to serve POST /score, GET /workers, GET /metrics, GET /openapi.json.",
    ),
    page_size: int = typer.Option(16, "--page-size", help="Tokens per page, as the engines use (>= 1)."),
    lora_strict: bool = typer.Option(
        True, "--lora-strict/--no-lora-strict", help="Credit only copies of the request's lora_name."
    ),
    stale_after: float = typer.Option(5.0, "--stale-after", help="Seconds without a message before a source is stale."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the random tie-break (default: random)."),
    max_connections: int = typer.Option(
        1000, "--max-connections", help="HTTP connections served at once; past it requests get 503."
    ),
    key_mode: list[str] = typer.Option(
        [],
        "--key-mode",
        help="NAME=contract|tokens|auto: how a publisher's blocks are keyed "
        "(auto, the default: detected from its first stored blocks; tokens: any engine, e.g. vLLM); "
        "a bare MODE sets it for every publisher not named.",
    ),
    curve_server_key: list[str] = typer.Option([], "--curve-server-key", help=SERVER_KEYS_HELP),
    curve_client_cert: Optional[str] = typer.Option(None, "--curve-client-cert", help=CLIENT_CERT_HELP),
    tokenizer: Optional[str] = typer.Option(
        None,
        "--tokenizer",
        metavar="DIR",
        help="A Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json with its chat "
        "template): /score then takes prompt (text) or messages (chat) as the engine tokenizes them.",
    ),
    sign_key: Optional[str] = typer.Option(None, "--sign-key", help="With --nats: " + SIGN_KEY_HELP),
    insecure: bool = typer.Option(False, "--insecure", help="With --nats: " + INSECURE_HELP),
    max_sources: int = typer.Option(4096, "--max-sources", help="With --nats: " + MAX_SOURCES_HELP),
) -> None:
    """Subscribe to publishers, keep a block index, and rank workers for requests over HTTP.

    POST /score takes a JSON object: tokens (token ids), or prompt / messages with --tokenizer;
    cache_salt, lora_name, top_k, explain.

    It answers the workers best first (worker, dp_rank, matched_pages, stale, ...).

    Request and response schemas: GET /openapi.json (README: "The router's HTTP API").
    """
    from kvevents.consumers.keying import parse_key_modes
    from kvevents.consumers.service.core import RouterService, parse_publisher
    from kvevents.consumers.service.http_api import HttpLimits

    if page_size < 1:
        user_error(f"--page-size must be >= 1, got {page_size}")
    if not stale_after > 0:
        user_error(f"--stale-after must be > 0, got {stale_after}")
    if max_connections < 1:
        user_error(f"--max-connections must be >= 1, got {max_connections}")
    if (nats_url is None) == (not publisher):
        user_error("give --publisher NAME=ENDPOINT[,REPLAY] ... or --nats URL --stream NAME (one of them)")
    try:
        sources = [parse_publisher(spec) for spec in publisher]
    except ValueError as exc:
        user_error(str(exc))
    with_curve(sources, curve_server_key, curve_client_cert)
    try:
        default_mode, modes = parse_key_modes(key_mode, [s.name or "" for s in sources])
    except ValueError as exc:
        user_error(str(exc))
    host, port = _host_port(http)
    renderer = _renderer(tokenizer)
    # this command prints its own stale / back lines (below): the subscriber's warning would repeat them
    logging.getLogger("kvevents.zeromq.subscriber").setLevel(logging.ERROR)
    if nats_url is not None:  # kvevents.cli.nats: the JetStream feed (one line while NATS is unreachable)
        from kvevents.cli.nats import jetstream_source

        service = RouterService(
            feed=jetstream_source(
                nats_url, stream, "route", sign_key, insecure, stale_after_s=stale_after, max_sources=max_sources
            ),
            page_size=page_size,
            lora_strict=lora_strict,
            seed=seed,
            key_modes=modes,
            default_key_mode=default_mode,
            renderer=renderer,
        )
    else:
        service = RouterService(
            sources,
            page_size=page_size,
            lora_strict=lora_strict,
            seed=seed,
            stale_after_s=stale_after,
            key_modes=modes,
            default_key_mode=default_mode,
            renderer=renderer,
        )
    stop = threading.Event()
    try:
        try:
            service.start()
            bound = service.serve_http(host, port, HttpLimits(max_connections=max_connections))
        except ValueError as exc:
            user_error(str(exc))
        sys.stderr.write(
            f"kvevents route: {f'stream {stream}' if nats_url else f'{len(sources)} publisher(s)'}; http://{bound[0]}:{bound[1]} "
            "(status page at /, POST /score, GET /workers, GET /metrics, GET /openapi.json); Ctrl-C to stop\n"
        )
        sys.stderr.flush()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.wait(0.5):
            for name, stale in service.stale_changes():
                if stale:
                    sys.stderr.write(
                        f"kvevents route: {name}: nothing heard for {stale_after:g} s (stale; /score says so)\n"
                    )
                else:
                    sys.stderr.write(f"kvevents route: {name}: heard again (no longer stale)\n")
                sys.stderr.flush()
    finally:
        service.stop()


@app.command("demo")
def demo_cmd(
    workers: int = typer.Option(4, "--workers", help="Simulated workers (1..64), each with its own publisher."),
    duration: float = typer.Option(15.0, "--duration", help="Seconds of traffic (about; not with --requests)."),
    seed: int = typer.Option(0, "--seed", help="Workload, routing and fault seed."),
    requests: Optional[int] = typer.Option(
        None,
        "--requests",
        help="Run exactly N requests instead of --duration: the same seed then gives the same "
        "requests, policy figures, contract counts and events published (timings and batch counts vary).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (figures + checks) instead of tables."),
    fleet: str = typer.Option(
        "mixed",
        "--fleet",
        help="mixed: half the workers are vLLM 0.33 workers (vLLM's hashes, keyed by tokens); "
        "contract: every worker emits by the contract.",
    ),
    html_out: Optional[str] = typer.Option(
        None, "--html", help="Also write the run as one self-contained HTML page (hit rates over time, faults, checks)."
    ),
) -> None:
    """The main job: simulated workers publish on loopback, a prefix router routes, faults heal, checks run."""
    from kvevents.demo import DemoConfig, DemoProgress, render_result, run_demo

    cfg = DemoConfig(workers=workers, duration=duration, seed=seed, fleet=fleet, requests=requests)
    # the demo injects faults on purpose: the transport's warnings about them would only be noise
    logging.getLogger("kvevents").setLevel(logging.ERROR)
    try:
        cfg.validate()
    except ValueError as exc:
        user_error(str(exc))
    if html_out is not None and not os.path.isdir(os.path.dirname(os.path.abspath(html_out))):
        user_error(f"--html {html_out}: no such directory")
    if as_json:
        result = run_demo(cfg)
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    else:
        err = Console(stderr=True)
        with DemoProgress(cfg.duration, err) as progress:
            result = run_demo(cfg, on_progress=progress)
        out = Console()
        if not out.is_terminal:
            out = Console(width=120)
        render_result(result, out)
    if html_out is not None:
        from kvevents.demo.report import render_report

        try:
            with open(html_out, "w", encoding="utf-8") as fh:
                fh.write(render_report(result))
        except OSError as exc:
            user_error(f"--html {html_out}: {exc.strerror or exc}")
        sys.stderr.write(f"kvevents demo: report written to {html_out}\n")
    if result.get("interrupted"):  # Ctrl-C: the summary of the traffic so far was printed
        sys.stderr.write("kvevents demo: interrupted (Ctrl-C); the figures above cover the traffic until then\n")
        raise typer.Exit(130)
    failed = [name for name, ok in result["checks"].items() if not ok]
    if failed:
        raise CheckFailed(f"demo: {len(failed)} check(s) failed: {', '.join(failed)}")
