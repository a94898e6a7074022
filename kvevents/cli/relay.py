"""`kvevents relay`: republish an engine's stream through kvevents' publisher (kvevents.relay), with
a line per engine rank saying what it publishes or what its sockets saw wrong (kvevents.published)."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import Any, Optional

import typer

from kvevents.cli.app import user_error
from kvevents.cli.config import takes_config
from kvevents.cli.flag_groups import flag, flag_group
from kvevents.cli.options import CLIENT_CERT_HELP, SERVER_KEY_HELP, CurveServerFlags, curve_client, curve_server
from kvevents.cli.output import out_line, show_plain_bind_once

_TAG = "kvevents relay:"


def _default_replay(endpoint: str, ranks: int) -> str:
    """The port right after the relay's last live port (tcp), as `kvevents serve` chooses it."""
    head, _, port = endpoint.rpartition(":")
    if endpoint.startswith("tcp://") and port.isdigit() and int(port) > 0:
        return f"{head}:{int(port) + ranks}"
    if endpoint.startswith("tcp://"):
        return endpoint  # ephemeral: the OS picks a port
    return endpoint + "-replay"


@dataclass(frozen=True)
class EngineCurveFlags:
    """CURVE on the engine side: the engine's public certificate and this relay's client certificate."""

    curve_server_key: Optional[str] = flag(None, "--curve-server-key", help="Engine side: " + SERVER_KEY_HELP)
    curve_client_cert: Optional[str] = flag(None, "--curve-client-cert", help="Engine side: " + CLIENT_CERT_HELP)


@dataclass(frozen=True)
class RepublishFlags:
    """What the relay's publishers keep and send besides the batches."""

    buffer_steps: int = flag(10000, min=0, help="Batches the relay keeps for replay.")
    heartbeat: float = flag(1.0, min=0.0, help="Heartbeat interval in seconds (0: none).")
    metrics_port: Optional[int] = flag(
        None, help="Serve Prometheus metrics on 127.0.0.1:PORT (0: a free port, printed)."
    )

    def settings(self) -> dict[str, Any]:
        """PublisherConfig's settings of these flags; a --metrics-port out of range: one line, exit 2."""
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            user_error(f"--metrics-port must be in 0..65535 (0: a free port), got {self.metrics_port}")
        return {
            "buffer_steps": self.buffer_steps,
            "heartbeat_interval_s": self.heartbeat,
            "metrics_port": self.metrics_port,
        }


def _build(
    spec: str, from_bind: bool, engine_curve: EngineCurveFlags, ranks: int, topic: str, settings: dict[str, Any]
) -> Any:
    """The Relay for the flags; every bad value is one line and exit 2, before a socket opens."""
    from kvevents.relay import Relay
    from kvevents.zeromq.publisher_config import PublisherConfig
    from kvevents.zeromq.source import parse_source

    try:
        engine = parse_source(spec)
    except ValueError as exc:
        user_error(str(exc).replace("--publisher", "--from"))
    engine.bind = from_bind
    engine.curve = curve_client(engine_curve.curve_server_key, engine_curve.curve_client_cert)
    curve_server(settings.get("curve_secret_key_file"), settings.get("curve_allow_dir"))
    try:
        config = PublisherConfig(**settings)
    except ValueError as exc:
        first = str(exc).splitlines()
        user_error(f"relay publisher settings: {' '.join(first[1:3]) if len(first) > 2 else exc}")
    try:
        return Relay(engine, config, ranks=ranks, topic=topic)
    except ValueError as exc:
        user_error(str(exc))
    except OSError as exc:  # zmq.ZMQError: an address in use, a bad interface
        user_error(f"relay: cannot open {config.endpoint}: {exc}")


_ENGINE, _OUT = "Engine side", "Republished"


@takes_config
@flag_group(RepublishFlags, "republish", _OUT)
@flag_group(CurveServerFlags, "curve", _OUT)
@flag_group(EngineCurveFlags, "engine_curve", _ENGINE)
def relay(
    source: str = typer.Option(
        ...,
        "--from",
        metavar="NAME=ENDPOINT[,REPLAY]",
        help="The engine's rank-0 live PUB endpoint and replay ROUTER endpoint (rank r: ports + r).",
        rich_help_panel=_ENGINE,
    ),
    endpoint: str = typer.Option(
        ..., "--endpoint", help="The relay's rank-0 live PUB endpoint (rank r: port + r).", rich_help_panel=_OUT
    ),
    replay_endpoint: Optional[str] = typer.Option(
        None,
        "--replay-endpoint",
        help="The relay's replay ROUTER (default: the port after the last live port).",
        rich_help_panel=_OUT,
    ),
    ranks: int = typer.Option(
        1, "--data-parallel-size", min=1, max=64, help="The engine's dp ranks.", rich_help_panel=_ENGINE
    ),
    from_bind: bool = typer.Option(
        False,
        "--from-bind",
        help="Bind the engine-side SUB (vLLM's PUB connects to a tcp://HOST:PORT endpoint).",
        rich_help_panel=_ENGINE,
    ),
    bind: bool = typer.Option(
        True, help="Bind the relay's live endpoint (consumers connect to it).", rich_help_panel=_OUT
    ),
    topic: str = typer.Option("", help="The engine's topic; the relay republishes under it.", rich_help_panel=_ENGINE),
    republish: RepublishFlags = RepublishFlags(),
    curve: CurveServerFlags = CurveServerFlags(),
    engine_curve: EngineCurveFlags = EngineCurveFlags(),
    duration: Optional[float] = typer.Option(None, min=0.0, help="Stop after this many seconds (default: Ctrl-C)."),
) -> None:
    """Republish an engine's KV events with replay, snapshots, DESCRIBE, heartbeats and CURVE."""
    settings: dict[str, Any] = {
        "endpoint": endpoint,
        "bind": bind,
        "replay_endpoint": replay_endpoint or _default_replay(endpoint, ranks),
        "topic": topic,
        **republish.settings(),
        "curve_secret_key_file": curve.curve_secret,
        "curve_allow_dir": curve.curve_allow,
    }
    show_plain_bind_once()
    r = _build(source, from_bind, engine_curve, ranks, topic, settings)
    _say_started(r)
    interrupted = _run(r, duration)
    _stop(r)
    if interrupted:
        raise typer.Exit(130)


def _say_started(r: Any) -> None:
    """A line per rank: where it reads from and republishes on, its epoch, its metrics."""
    for rank, (src, pub) in enumerate(zip(r.sources, r.publishers)):
        metrics = f" metrics http://127.0.0.1:{pub.metrics_port}/metrics" if pub.metrics_port is not None else ""
        out_line(
            f"{_TAG} rank {rank} from {src.endpoint} (replay {src.replay_endpoint or '-'}) -> live {pub.endpoint} "
            f"replay {pub.replay_endpoint or '-'} epoch {pub.epoch}{metrics}"
        )


def _stop(r: Any) -> None:
    """Stop the relay; a last line of what it relayed, the resets and what it could not republish."""
    s = r.stats()
    r.stop()
    kinds = ", ".join(f"{k} {v}" for k, v in s["relayed"].items())
    resets = ", ".join(f"{k} {v}" for k, v in s["resets"].items()) or "none"
    warm = (
        f" (live includes {s['warm_start_batches']} read from the engine's ring at start)"
        if s["warm_start_batches"]
        else ""
    )
    out_line(f"{_TAG} relayed {kinds}{warm}; resets {resets}; not republished {s['failed']}")


def _run(r: Any, duration: Optional[float]) -> bool:
    """Relay until --duration, SIGTERM or Ctrl-C (True when interrupted by Ctrl-C); a line per
    engine rank once what it publishes is known, or when its sockets show a misconfiguration."""
    from kvevents.published import SourceNotes

    notes = SourceNotes()
    stop = {"flag": False}

    def _on_term(signum: int, frame: Any) -> None:
        stop["flag"] = True

    old = signal.signal(signal.SIGTERM, _on_term)
    deadline = None if duration is None else time.monotonic() + duration
    r.start()
    try:
        while not stop["flag"] and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.1)
            for line in notes.lines(r.subscriber.status()):
                out_line(f"{_TAG} {line}")
    except KeyboardInterrupt:
        return True
    finally:
        signal.signal(signal.SIGTERM, old)
    return False
