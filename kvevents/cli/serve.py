"""`kvevents serve`: simulated engine workers publishing their KV events (kvevents.sim.serve), a
status line per second on stdout, optionally an OpenAI-compatible front end (kvevents.sim.http)."""

from __future__ import annotations

import signal
import threading
from typing import Any, Optional

import typer

from kvevents.cli.app import user_error
from kvevents.cli.config import takes_config
from kvevents.cli.options import CURVE_ALLOW, CURVE_SECRET, check_endpoint, curve_server
from kvevents.cli.output import out_line, show_plain_bind_once

STARTED = "kvevents serve:"


@takes_config
def serve(
    endpoint: str = typer.Option("tcp://127.0.0.1:5557", help="Live PUB endpoint of worker 0 (worker i: port + i)."),
    replay_endpoint: Optional[str] = typer.Option(
        None,
        help="Replay ROUTER endpoint of worker 0 (worker i: port + i); default: the port after the last "
        "live port (5558 for one worker); '' for none.",
    ),
    topic: str = typer.Option("", help="Topic frame of every message."),
    workers: int = typer.Option(1, min=1, max=64, help="Simulated workers, one publisher each (as DP ranks)."),
    rate: float = typer.Option(200.0, min=0.0, help="Requests per second over all workers (0: as fast as possible)."),
    duration: Optional[float] = typer.Option(None, min=0.0, help="Stop after this many seconds (default: Ctrl-C)."),
    seed: int = typer.Option(0, help="Workload seed (worker i uses seed + i)."),
    page_size: int = typer.Option(16, min=1, help="Tokens per page."),
    capacity_pages: int = typer.Option(4096, min=1, help="Device pages per worker (eviction beyond)."),
    heartbeat: float = typer.Option(1.0, min=0.0, help="Heartbeat interval in seconds (0: none)."),
    bind: bool = typer.Option(True, help="Bind the live endpoint (the project default: loopback, bound)."),
    metrics_port: Optional[int] = typer.Option(
        None, help="Serve Prometheus metrics on 127.0.0.1:PORT (0: a free port, printed)."
    ),
    engine: str = typer.Option(
        "contract",
        "--engine",
        help="contract: emit by the kvevents contract; vllm: what a vLLM "
        "0.33 worker emits (its hash chain as uint64, extra_keys, group_idx, one removal per hash; "
        "no snapshots, no heartbeats).",
    ),
    hash_algo: str = typer.Option(
        "sha256", "--hash-algo", help="--engine vllm: vLLM's prefix-caching hash, sha256 | sha256_cbor."
    ),
    epoch_in_batch: bool = typer.Option(
        False,
        "--epoch-in-batch",
        help="Add the epoch as a 4th batch element (only tolerant decoders read it; "
        "vLLM-, SGLang- and Dynamo-style strict decoders reject it). Default: the strict 3-element batch.",
    ),
    curve_secret: Optional[str] = CURVE_SECRET,
    curve_allow: Optional[str] = CURVE_ALLOW,
    http: Optional[str] = typer.Option(
        None,
        "--http",
        help="Also serve an OpenAI-compatible /v1/completions on HOST:PORT (0: a free port) feeding worker w0: "
        "token-id prompts, model = adapter, cache_salt.",
    ),
) -> None:
    """Run simulated engine workers, each publishing its KV events; a status line per second."""
    from kvevents.sim.serve import ServeConfig

    _check_choices(metrics_port, engine, hash_algo)
    replay = _replay_endpoint(endpoint, replay_endpoint, workers)
    cfg = ServeConfig(endpoint, replay, topic, workers, seed, page_size, capacity_pages, heartbeat, bind)
    cfg.metrics_port, cfg.engine, cfg.hash_algo, cfg.epoch_in_batch = metrics_port, engine, hash_algo, epoch_in_batch
    cfg.curve_secret_key_file, cfg.curve_allow_dir = curve_secret, curve_allow
    curve_server(curve_secret, curve_allow)  # bad key files: one line, exit 2
    show_plain_bind_once()
    _run(cfg, rate, duration, http)


def _check_choices(metrics_port: Optional[int], engine: str, hash_algo: str) -> None:
    from kvevents.sim.worker import ENGINES

    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        user_error(f"--metrics-port must be in 0..65535 (0: a free port), got {metrics_port}")
    if engine not in ENGINES or hash_algo not in ("sha256", "sha256_cbor"):
        user_error(
            f"--engine must be one of {', '.join(ENGINES)} and --hash-algo sha256 or sha256_cbor, got {engine!r} / {hash_algo!r}"
        )


def _replay_endpoint(endpoint: str, replay_endpoint: Optional[str], workers: int) -> str:
    """--replay-endpoint (default: the port after the last live port), with every rank's live and
    replay endpoints checked: distinct, not colliding, no port past 65535."""
    from kvevents.sim.serve import default_replay_endpoint, rank_endpoints
    from kvevents.zeromq.wire import check_endpoint as check

    check_endpoint("--endpoint", endpoint)
    default_replay = replay_endpoint is None
    replay = default_replay_endpoint(endpoint, workers) if replay_endpoint is None else replay_endpoint
    try:
        if replay:
            check(replay)
        lives, replays = rank_endpoints(endpoint, replay, workers)
    except ValueError as exc:  # a port past 65535 (the default replay port, or a rank's offset port)
        what = (
            "--replay-endpoint (default: the port after the last live port)"
            if default_replay
            else (f"with {workers} workers (rank r uses port + r)")
        )
        user_error(f"{what}: {exc}")
    clash = sorted(set(lives) & set(replays) - {e for e in lives if e.endswith(":*") or e.endswith(":0")})
    if len(set(lives)) < workers and not endpoint.endswith((":*", ":0")):
        user_error(
            f"--endpoint {endpoint!r} gives every worker the same address: use tcp://HOST:PORT or inproc:// "
            "(ranks offset the port / suffix the name) or one worker"
        )
    if clash:
        user_error(
            f"live and replay endpoints collide on {clash[0]} with {workers} workers (rank r uses port + r): "
            f"give --replay-endpoint a port >= live port + {workers}"
        )
    return replay


def _run(cfg: Any, rate: float, duration: Optional[float], http: Optional[str]) -> None:
    """Open the fleet, say where each rank listens, serve until SIGTERM, Ctrl-C or --duration, then
    close and print the last status line."""
    from kvevents.sim.serve import ServeLoop, SimFleet

    fleet = SimFleet.open(cfg)
    for i, p in enumerate(fleet.pubs):
        metrics = f" metrics http://127.0.0.1:{p.metrics_port}/metrics" if p.metrics_port is not None else ""
        out_line(
            f"{STARTED} worker w{i} dp_rank {i} live {p.endpoint} replay {p.replay_endpoint or '-'} "
            f"epoch {p.epoch}{metrics}"
        )
    web = _front_end(fleet, http) if http is not None else None
    stop = threading.Event()
    old = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    loop = ServeLoop(fleet, rate, duration)
    try:
        loop.run(stop, lambda elapsed: out_line(_status_line(elapsed, fleet.status(loop.served))))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
        if web is not None:
            web.close()
        unsent = fleet.close(1.0)
        out_line(_status_line(loop.elapsed(), fleet.status(loop.served)) + f" stopped unsent={unsent}")


def _front_end(fleet: Any, http: str) -> Any:
    """--http: /v1/completions in front of worker w0 (taking turns with the loop on the fleet's lock)."""
    from kvevents.sim.http import BASE_MODEL, serve_http

    try:
        web = serve_http(http, fleet.sims[0], fleet.pubs[0], fleet.lock)
    except ValueError as exc:
        fleet.close(0)
        user_error(str(exc))
    out_line(f"{STARTED} http {web.url}/v1/completions (worker w0; model {BASE_MODEL} = no adapter)")
    return web


def _status_line(elapsed: float, s: Any) -> str:
    return (
        f"t={elapsed:5.1f}s requests={s.requests} batches={s.batches} events={s.events} dropped={s.dropped} "
        f"live_blocks={s.live_blocks} replays={s.replays} snapshots={s.snapshots} device_hit={s.device_hit:.1%}"
    )
