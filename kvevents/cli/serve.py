"""`kvevents serve`: simulated engine workers publishing their KV events (kvevents.sim.serve), a
status line per second on stdout, optionally an OpenAI-compatible front end (kvevents.sim.http)."""

from __future__ import annotations

import signal
import threading
from typing import Any, Optional

import typer

from kvevents.cli.app import user_error
from kvevents.cli.config import takes_config
from kvevents.cli.helpfmt import in_panel
from kvevents.cli.options import CURVE_ALLOW, CURVE_SECRET, check_endpoint, curve_server
from kvevents.cli.output import out_line, show_plain_bind_once

STARTED = "kvevents serve:"


_WORK, _WIRE, _ENGINE, _MORE = "Workers and workload", "Endpoints and wire", "Engine emulated", "Extras"


@takes_config
def serve(
    workers: int = typer.Option(
        1, min=1, max=64, help="Simulated workers, one publisher each (DP ranks).", rich_help_panel=_WORK
    ),
    rate: float = typer.Option(
        200.0, min=0.0, help="Requests per second, all workers (0: flat out).", rich_help_panel=_WORK
    ),
    duration: Optional[float] = typer.Option(
        None, min=0.0, help="Stop after S seconds (default: Ctrl-C).", rich_help_panel=_WORK
    ),
    seed: int = typer.Option(0, help="Workload seed (worker i: seed + i).", rich_help_panel=_WORK),
    page_size: int = typer.Option(16, min=1, help="Tokens per page.", rich_help_panel=_WORK),
    capacity_pages: int = typer.Option(
        4096, min=1, help="Device pages per worker (evicts beyond).", rich_help_panel=_WORK
    ),
    endpoint: str = typer.Option(
        "tcp://127.0.0.1:5557", help="Worker 0's live PUB endpoint (worker i: port + i).", rich_help_panel=_WIRE
    ),
    replay_endpoint: Optional[str] = typer.Option(
        None,
        help="Worker 0's replay endpoint (worker i: port + i). Default: the port after the last live port; '': none.",
        rich_help_panel=_WIRE,
    ),
    topic: str = typer.Option("", help="Topic frame of every message.", rich_help_panel=_WIRE),
    heartbeat: float = typer.Option(1.0, min=0.0, help="Heartbeat every S seconds (0: none).", rich_help_panel=_WIRE),
    bind: bool = typer.Option(True, help="Bind the live endpoint (else connect).", rich_help_panel=_WIRE),
    epoch_in_batch: bool = typer.Option(
        False,
        "--epoch-in-batch",
        help="Add the epoch as a 4th batch element (strict decoders reject it).",
        rich_help_panel=_WIRE,
    ),
    curve_secret: Optional[str] = in_panel(CURVE_SECRET, "CURVE"),
    curve_allow: Optional[str] = in_panel(CURVE_ALLOW, "CURVE"),
    engine: str = typer.Option(
        "contract",
        "--engine",
        help="contract, or vllm: what a vLLM 0.33 worker emits (no snapshots, no heartbeats).",
        rich_help_panel=_ENGINE,
    ),
    hash_algo: Optional[str] = typer.Option(
        None,
        "--hash-algo",
        help="With --engine vllm: sha256 (default) or sha256_cbor.",
        rich_help_panel=_ENGINE,
    ),
    metrics_port: Optional[int] = typer.Option(
        None, help="Prometheus metrics on 127.0.0.1:PORT (0: any free port).", rich_help_panel=_MORE
    ),
    http: Optional[str] = typer.Option(
        None,
        "--http",
        help="/v1/completions, /metrics per worker (port+i).",
        rich_help_panel=_MORE,
    ),
    prefill_us: float = typer.Option(
        10.0,
        "--prefill-us-per-token",
        min=0.0,
        help="--http: us/new token (10).",
        show_default=False,
        rich_help_panel=_MORE,
    ),
    decode_ms: float = typer.Option(
        1.0,
        "--decode-ms-per-token",
        min=0.0,
        help="--http: ms/max_tokens (1).",
        show_default=False,
        rich_help_panel=_MORE,
    ),
    max_running: int = typer.Option(
        8, "--max-running", min=1, help="--http: run at once (8).", show_default=False, rich_help_panel=_MORE
    ),
) -> None:
    """Run simulated engine workers, each publishing its KV events; a status line per second.

    Ctrl-C: the last status line, then exit 130 (0 at --duration or SIGTERM)."""
    from kvevents.sim.serve import ServeConfig

    _check_choices(metrics_port, engine, hash_algo)
    replay = _replay_endpoint(endpoint, replay_endpoint, workers)
    cfg = ServeConfig(endpoint, replay, topic, workers, seed, page_size, capacity_pages, heartbeat, bind)
    cfg.metrics_port, cfg.engine, cfg.epoch_in_batch = metrics_port, engine, epoch_in_batch
    cfg.hash_algo = hash_algo or "sha256"
    cfg.curve_secret_key_file, cfg.curve_allow_dir = curve_secret, curve_allow
    curve_server(curve_secret, curve_allow)  # bad key files: one line, exit 2
    show_plain_bind_once()
    from kvevents.sim.timing import SimTiming

    if _run(cfg, rate, duration, http, SimTiming(prefill_us * 1e-6, decode_ms * 1e-3, max_running)):
        raise typer.Exit(130)  # Ctrl-C, after the last status line


def _check_choices(metrics_port: Optional[int], engine: str, hash_algo: Optional[str]) -> None:
    from kvevents.sim.worker import ENGINES

    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        user_error(f"--metrics-port must be in 0..65535 (0: a free port), got {metrics_port}")
    if engine not in ENGINES:
        user_error(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if hash_algo is not None and engine != "vllm":
        user_error(
            f"--hash-algo {hash_algo} is vLLM's hash: add --engine vllm (--engine {engine} hashes by the contract)"
        )
    if hash_algo not in (None, "sha256", "sha256_cbor"):
        user_error(f"--hash-algo must be sha256 or sha256_cbor, got {hash_algo!r}")


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


def _run(cfg: Any, rate: float, duration: Optional[float], http: Optional[str], timing: Any) -> bool:
    """Open the fleet, say where each rank listens, serve until SIGTERM, Ctrl-C or --duration, then
    close and print the last status line; True when Ctrl-C stopped it."""
    from kvevents.sim.serve import ServeLoop, SimFleet

    fleet = SimFleet.open(cfg)
    for i, p in enumerate(fleet.pubs):
        metrics = f" metrics http://127.0.0.1:{p.metrics_port}/metrics" if p.metrics_port is not None else ""
        # worker wI is dp rank I; its epoch is in `tail` and /workers: the line fits 80 columns
        out_line(f"{STARTED} worker w{i} live {p.endpoint} replay {p.replay_endpoint or '-'}{metrics}")
    webs = _front_ends(fleet, cfg, http, timing) if http is not None else []
    stop = threading.Event()
    old = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    loop = ServeLoop(fleet, rate, duration)
    interrupted = False
    try:
        loop.run(stop, lambda elapsed: out_line(_status_line(elapsed, fleet.status(loop.served))))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGTERM, old)
        for web in webs:
            web.close()
        unsent = fleet.close(1.0)
        out_line(
            _status_line(loop.elapsed(), fleet.status(loop.served))
            + (f" unsent={unsent}" if unsent else "")
            + " (stopped)"
        )
    return interrupted


def _front_ends(fleet: Any, cfg: Any, http: str, timing: Any) -> list[Any]:
    """--http: a /v1/completions per worker (worker i on port + i), each taking turns with the loop
    on the fleet's lock, a banner line each; a bad or busy address closes the fleet, one line, exit 2."""
    from kvevents.sim.http import BASE_MODEL, serve_http, worker_addresses

    webs: list[Any] = []
    try:
        for rank, (address, sim, pub) in enumerate(
            zip(worker_addresses(http, len(fleet.sims)), fleet.sims, fleet.pubs)
        ):
            webs.append(
                serve_http(
                    address,
                    sim,
                    pub,
                    fleet.lock,
                    timing=timing,
                    engine=cfg.engine,
                    page_size=cfg.page_size,
                    capacity_pages=cfg.capacity_pages,
                    dp_rank=rank,
                )  # fmt: skip
            )
    except ValueError as exc:
        for web in webs:
            web.close()
        fleet.close(0)
        user_error(str(exc))
    for i, web in enumerate(webs):
        out_line(
            f"{STARTED} http {web.url}/v1/completions (worker w{i}; model {BASE_MODEL} = no adapter; {web.url}/metrics)"
        )
    return webs


def _status_line(elapsed: float, s: Any) -> str:
    """One status line within 80 columns (up to ~100,000 requests): requests served, events published,
    live blocks, device hit rate; dropped, replays and snapshots only once there are some."""
    rare = "".join(
        f" {k}={v}" for k, v in (("dropped", s.dropped), ("replays", s.replays), ("snapshots", s.snapshots)) if v
    )
    return (
        f"t={elapsed:.1f}s requests={s.requests} events={s.events} blocks={s.live_blocks} hit={s.device_hit:.1%}{rare}"
    )
