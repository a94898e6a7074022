"""`kvevents serve`: simulated engine workers publishing their KV events (kvevents.sim.serve), a
status line per second on stdout, optionally an OpenAI-compatible front end (kvevents.sim.http)."""

from __future__ import annotations

import signal
import threading
from typing import Any, Optional

import typer

from kvevents.cli.app import user_error
from kvevents.cli.config import takes_config
from kvevents.cli.flag_groups import flag_group
from kvevents.cli.options import CurveServerFlags, check_endpoint
from kvevents.cli.output import out_line, show_plain_bind_once
from kvevents.cli.serve_options import EngineFlags, SimHttpFlags, WireFlags, WorkloadFlags

STARTED = "kvevents serve:"


_WORK, _WIRE, _ENGINE, _MORE = "Workers and workload", "Endpoints and wire", "Engine emulated", "Extras"


@takes_config
@flag_group(WorkloadFlags, "load", _WORK)
@flag_group(WireFlags, "wire", _WIRE)
@flag_group(CurveServerFlags, "curve", "CURVE")
@flag_group(EngineFlags, "engine", _ENGINE)
@flag_group(SimHttpFlags, "front", _MORE)
def serve(
    load: WorkloadFlags = WorkloadFlags(),
    wire: WireFlags = WireFlags(),
    curve: CurveServerFlags = CurveServerFlags(),
    engine: EngineFlags = EngineFlags(),
    metrics_port: Optional[int] = typer.Option(
        None, help="Prometheus metrics on 127.0.0.1:PORT (0: any free port).", rich_help_panel=_MORE
    ),
    front: SimHttpFlags = SimHttpFlags(),
) -> None:
    """Run simulated engine workers, each publishing its KV events; a status line per second.

    Ctrl-C: the last status line, then exit 130 (0 at --duration or SIGTERM)."""
    from kvevents.sim.serve import ServeConfig

    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        user_error(f"--metrics-port must be in 0..65535 (0: a free port), got {metrics_port}")
    engine.check()
    replay = _replay_endpoint(wire.endpoint, wire.replay_endpoint, load.workers)
    cfg = ServeConfig(
        wire.endpoint,
        replay,
        wire.topic,
        load.workers,
        load.seed,
        load.page_size,
        load.capacity_pages,
        wire.heartbeat,
        wire.bind,
    )
    cfg.metrics_port, cfg.engine, cfg.epoch_in_batch = metrics_port, engine.engine, wire.epoch_in_batch
    cfg.hash_algo = engine.hash_algo or "sha256"
    cfg.curve_secret_key_file, cfg.curve_allow_dir = curve.curve_secret, curve.curve_allow
    curve.server()  # bad key files: one line, exit 2
    show_plain_bind_once()
    if _run(cfg, load.rate, load.duration, front.http, front.timing()):
        raise typer.Exit(130)  # Ctrl-C, after the last status line


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
