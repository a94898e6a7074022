"""`kvevents bridge`: engines' ZeroMQ streams into a NATS JetStream stream (kvevents.jetstream.bridge),
with a status line on stderr every --status-every seconds and a line per engine saying what it
publishes or what its sockets saw wrong (kvevents.published); Ctrl-C: a last status line, exit 130."""

from __future__ import annotations

import time
from typing import Any, Optional

import typer

from kvevents.cli.app import publisher_option, user_error
from kvevents.cli.config import takes_config
from kvevents.cli.flag_groups import flag_group
from kvevents.cli.nats_trust import BRIDGE_INSECURE_HELP, SIGN_KEY_HELP, bus_trust
from kvevents.cli.options import NATS_PANEL, CurveClients, NatsFlags, nats_flags
from kvevents.cli.output import log_to_stderr, say
from kvevents.cli.stopping import StopSignals


@takes_config
@nats_flags
@flag_group(CurveClients, "curve")
def bridge_cmd(
    publisher: list[str] = publisher_option(..., "engine"),
    nats_url: str = typer.Option("nats://127.0.0.1:4222", "--nats", help="NATS server URL(s), comma-separated."),
    stream: str = typer.Option("kvevents", "--stream", help="JetStream stream name (subjects kvevents.<stream>.>)."),
    snapshot_every: float = typer.Option(30.0, "--snapshot-every", help="Seconds between snapshots stored per engine."),
    max_age: float = typer.Option(
        3600.0, "--max-age", help="Seconds live batches are kept (when creating the stream)."
    ),
    max_bytes: Optional[int] = typer.Option(None, "--max-bytes", help="Stream size cap in bytes (when creating it)."),
    replicas: int = typer.Option(1, "--replicas", help="Stream replicas in a NATS cluster (when creating it)."),
    storage: str = typer.Option("file", "--storage", help="file or memory (when creating the stream)."),
    create: bool = typer.Option(True, "--create/--no-create", help="Create the stream if it is missing."),
    duration: Optional[float] = typer.Option(None, "--duration", help="Stop after S seconds (default: until Ctrl-C)."),
    status_every: float = typer.Option(5.0, "--status-every", help="Seconds between status lines on stderr (0: none)."),
    curve: CurveClients = CurveClients(),
    sign_key: Optional[str] = typer.Option(None, "--sign-key", help=SIGN_KEY_HELP, rich_help_panel=NATS_PANEL),
    insecure: bool = typer.Option(False, "--insecure", help=BRIDGE_INSECURE_HELP, rich_help_panel=NATS_PANEL),
    nats_flags: NatsFlags = NatsFlags(),
) -> None:
    """Forward engines' KV events (gap-repaired) into NATS JetStream, with periodic snapshots.

    Run two bridges for one engine for high availability: JetStream stores each batch once.
    Exit 0 on --duration or SIGTERM, 130 on Ctrl-C (after a last status line), 2 on a usage error
    or NATS unreachable past --give-up-after.
    """
    from kvevents.jetstream.bridge import Bridge
    from kvevents.jetstream.link import StreamOptions
    from kvevents.zeromq.subscriber import parse_source

    _check_stream_flags(snapshot_every, max_age, storage, replicas)
    sources = [parse_source(spec, require_name=True) for spec in publisher]
    curve.apply(sources)  # engines' CURVE keys (live, replay, snapshots)
    opts = nats_flags.options(nats_url, "bridge")
    key = bus_trust("bridge", sign_key, insecure)
    log_to_stderr()
    bridge = Bridge(
        sources,
        stream,
        opts,
        snapshot_every_s=snapshot_every,
        stream_options=StreamOptions(max_age, max_bytes, replicas, storage),
        create_stream=create,
        on_unreachable=lambda m: say("bridge", m),
        give_up_after_s=nats_flags.give_up_after,
        sign_key=key,
    )
    started = f"{len(sources)} engine(s) -> {opts.redacted()} stream {stream} (snapshots every {snapshot_every:g}s)"
    interrupted = _watch(bridge, started, duration, status_every)
    if bridge.error is not None:
        raise bridge.error  # NatsUnavailable / ValueError: one line, exit 2
    if interrupted:
        raise typer.Exit(130)


def _check_stream_flags(snapshot_every: float, max_age: float, storage: str, replicas: int) -> None:
    if snapshot_every <= 0:
        user_error(f"--snapshot-every must be > 0, got {snapshot_every:g}")
    if snapshot_every >= max_age:
        user_error(
            f"--snapshot-every ({snapshot_every:g}s) must be below --max-age ({max_age:g}s): "
            "otherwise a cold start can find no snapshot"
        )
    if storage not in ("file", "memory"):
        user_error(f"--storage must be file or memory, got {storage!r}")
    if replicas < 1:
        user_error(f"--replicas must be >= 1, got {replicas}")


def _watch(bridge: Any, started: str, duration: Optional[float], status_every: float) -> bool:
    """Run the bridge until SIGINT / SIGTERM, --duration or its end; say when it is connected, then
    a status line every `status_every` s, and per engine what it publishes or what is wrong. After
    SIGINT a last status line; returns whether SIGINT ended it."""
    from kvevents.published import SourceNotes

    signals = StopSignals()
    stop = signals.stop
    t0 = time.monotonic()
    announced = False
    next_status = t0 + status_every
    notes = SourceNotes()
    try:
        bridge.start()
        while not stop.wait(0.1):
            now = time.monotonic()
            if bridge.done:
                break
            if not announced and bridge.wait_connected(0):
                announced = True
                say("bridge", f"{started}; Ctrl-C to stop")
            for line in notes.lines(bridge.source_status()):
                say("bridge", line)
            if status_every > 0 and now >= next_status and announced:
                next_status = now + status_every
                say("bridge", _status(bridge.counters()))
            if duration is not None and now - t0 >= duration:
                break
    finally:
        bridge.stop()
    for line in notes.lines(bridge.source_status()):  # what was learned since the last turn
        say("bridge", line)
    interrupted = signals.interrupted
    if interrupted:
        say("bridge", f"stopped after {time.monotonic() - t0:.1f}s: {_status(bridge.counters())}")
    return interrupted


def _status(c: dict[str, int]) -> str:
    return (
        f"published {c.get('live_published', 0)} batches ({c.get('duplicates_dropped', 0)} "
        f"already stored), snapshots {c.get('snapshots_stored', 0)}, publish retries "
        f"{c.get('publish_retries', 0)}, engine gap batches replayed {c.get('gap_batches_replayed', 0)}, "
        f"losses {c.get('subscriber_losses', 0)}"
    )
