"""`kvevents bridge`: engines' ZeroMQ streams into a NATS JetStream stream (kvevents.jetstream.bridge).

Also the NATS connection flags the other commands share (`route --nats`, `record --nats`,
`fetch --nats`, `doctor --nats`): `nats_options(...)` turns them into NatsOptions.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Optional

import typer

from kvevents.cli.app import app, user_error
from kvevents.cli.keys import CLIENT_CERT_HELP, SERVER_KEYS_HELP, with_curve
from kvevents.cli.logtools_common import log_to_stderr, print_checks
from kvevents.cli.nats_trust import BRIDGE_INSECURE_HELP, SIGN_KEY_HELP, bus_trust


def nats_options(
    url: str,
    creds: Optional[str] = None,
    tls_ca: Optional[str] = None,
    tls_cert: Optional[str] = None,
    tls_key: Optional[str] = None,
    name: str = "kvevents",
):  # -> NatsOptions
    """NatsOptions from the command line; a malformed URL or a missing file is a user error (exit 2).

    Credentials and TLS files not given as flags come from KVEVENTS_NATS_CREDS, KVEVENTS_NATS_TLS_CA,
    KVEVENTS_NATS_TLS_CERT and KVEVENTS_NATS_TLS_KEY (so route/record/replay/doctor take them too).
    """
    import os

    from kvevents.jetstream.link import NatsOptions

    creds = creds or os.environ.get("KVEVENTS_NATS_CREDS") or None
    tls_ca = tls_ca or os.environ.get("KVEVENTS_NATS_TLS_CA") or None
    tls_cert = tls_cert or os.environ.get("KVEVENTS_NATS_TLS_CERT") or None
    tls_key = tls_key or os.environ.get("KVEVENTS_NATS_TLS_KEY") or None
    for flag, path in (("--creds", creds), ("--tls-ca", tls_ca), ("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path is not None and not os.path.isfile(path):
            user_error(f"{flag} {path!r}: no such file")
    if tls_key and not tls_cert:
        user_error("--tls-key needs --tls-cert")
    opts = NatsOptions(url, creds=creds, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, name=name)
    try:
        opts.servers()
    except ValueError as exc:
        user_error(str(exc))
    return opts


def say(prog: str, message: str) -> None:
    """One line on stderr, prefixed with the command."""
    sys.stderr.write(f"kvevents {prog}: {' '.join(str(message).split())}\n")
    sys.stderr.flush()


CREDS_HELP = "NATS credentials file (JWT + NKey seed, decentralized auth)."
TLS_CA_HELP = "PEM file of the CA that signed the NATS server's certificate."
TLS_CERT_HELP = "PEM client certificate (mutual TLS)."
TLS_KEY_HELP = "PEM key of --tls-cert."
GIVE_UP_HELP = "Exit 2 if NATS is still unreachable after S seconds (default: retry forever)."


@app.command("bridge")
def bridge_cmd(
    publisher: list[str] = typer.Option(
        ..., "--publisher", help="NAME=ENDPOINT[,REPLAY_ENDPOINT]; repeat for every engine."
    ),
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
    creds: Optional[str] = typer.Option(None, "--creds", help=CREDS_HELP),
    tls_ca: Optional[str] = typer.Option(None, "--tls-ca", help=TLS_CA_HELP),
    tls_cert: Optional[str] = typer.Option(None, "--tls-cert", help=TLS_CERT_HELP),
    tls_key: Optional[str] = typer.Option(None, "--tls-key", help=TLS_KEY_HELP),
    give_up_after: Optional[float] = typer.Option(None, "--give-up-after", help=GIVE_UP_HELP),
    duration: Optional[float] = typer.Option(None, "--duration", help="Stop after S seconds (default: until Ctrl-C)."),
    status_every: float = typer.Option(5.0, "--status-every", help="Seconds between status lines on stderr (0: none)."),
    curve_server_key: list[str] = typer.Option([], "--curve-server-key", help=SERVER_KEYS_HELP),
    curve_client_cert: Optional[str] = typer.Option(None, "--curve-client-cert", help=CLIENT_CERT_HELP),
    sign_key: Optional[str] = typer.Option(None, "--sign-key", help=SIGN_KEY_HELP),
    insecure: bool = typer.Option(False, "--insecure", help=BRIDGE_INSECURE_HELP),
) -> None:
    """Forward engines' KV events (gap-repaired) into NATS JetStream, with periodic snapshots.

    Run two bridges for one engine for high availability: JetStream stores each batch once.
    Exit 0 on Ctrl-C or --duration, 2 on a usage error or NATS unreachable past --give-up-after.
    """
    from kvevents.jetstream.bridge import Bridge
    from kvevents.jetstream.link import StreamOptions
    from kvevents.zeromq.subscriber import parse_source

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
    sources = [parse_source(spec, require_name=True) for spec in publisher]
    with_curve(sources, curve_server_key, curve_client_cert)  # engines' CURVE keys (live, replay, snapshots)
    opts = nats_options(nats_url, creds, tls_ca, tls_cert, tls_key, name="kvevents-bridge")
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
        give_up_after_s=give_up_after,
        sign_key=key,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    t0 = time.monotonic()
    announced = False
    next_status = t0 + status_every
    try:
        bridge.start()
        while not stop.wait(0.1):
            now = time.monotonic()
            if bridge.done:
                break
            if not announced and bridge.wait_connected(0):
                announced = True
                say(
                    "bridge",
                    f"{len(sources)} engine(s) -> {opts.redacted()} stream {stream} "
                    f"(snapshots every {snapshot_every:g}s); Ctrl-C to stop",
                )
            if status_every > 0 and now >= next_status and announced:
                next_status = now + status_every
                c = bridge.counters()
                say(
                    "bridge",
                    f"published {c.get('live_published', 0)} batches ({c.get('duplicates_dropped', 0)} "
                    f"already stored), snapshots {c.get('snapshots_stored', 0)}, publish retries "
                    f"{c.get('publish_retries', 0)}, engine gaps repaired {c.get('subscriber_replayed', 0)}, "
                    f"losses {c.get('subscriber_losses', 0)}",
                )
            if duration is not None and now - t0 >= duration:
                break
    finally:
        bridge.stop()
    if bridge.error is not None:
        raise bridge.error  # NatsUnavailable / ValueError: one line, exit 2


# ---------------------------------------------------------------- faces for the other commands


def jetstream_source(
    url: str, stream: str, prog: str, sign_key: Optional[str] = None, insecure: bool = False, **options: object
):  # -> JetStreamFeed
    """A JetStreamFeed for `route --nats` / `record --nats` / `fetch --nats` (one-line notice while
    NATS is unreachable; no --sign-key and no --insecure: exit 2)."""
    from kvevents.jetstream.feed import JetStreamFeed

    opts = nats_options(url, name=f"kvevents-{prog}")
    key = bus_trust(prog, sign_key, insecure)
    log_to_stderr()
    try:
        return JetStreamFeed(opts, stream, on_unreachable=lambda m: say(prog, m), sign_key=key, **options)  # type: ignore[arg-type]
    except ValueError as exc:
        user_error(str(exc))


def record_positions(path: str) -> dict:
    """Where an existing record log stands per (source, dp_rank), for `record --nats --durable --append`."""
    import os

    from kvevents.jetstream.feed import positions_from_records
    from kvevents.recordlog import select_records

    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return {}
    return positions_from_records(select_records(path, on_damage=lambda d: None))


def replay_from_nats(
    url: str,
    stream: str,
    since_s: float | None,
    output: str | None,
    into_index: bool,
    as_json: bool,
    timeout: float = 30.0,
    **trust: object,
) -> None:
    """`fetch --nats`: what the stream holds, as a cold router reads it (snapshot + tail) or,
    with --since, the live batches stored in the last N seconds; into a record log (-o) or an index."""
    import json

    from kvevents.zeromq.subscriber import Delivery

    if output is None and not into_index:
        user_error("fetch --nats needs -o FILE (a record log) or --into-index")
    if since_s is not None and since_s <= 0:
        user_error(f"--back (seconds) must be > 0, got {since_s:g}")
    src = jetstream_source(
        url,
        stream,
        "fetch",
        start_time=None if since_s is None else time.time() - since_s,
        give_up_after_s=timeout,
        **trust,  # type: ignore[arg-type]
    )
    index = writer = rec = None
    if into_index:
        from kvevents.consumers.indexer import BlockIndex

        index = BlockIndex()
    if output is not None:
        from kvevents.recordlog import Recorder, RecordWriter

        writer = RecordWriter(output, durability="buffered")
        rec = Recorder(writer)
    n = resets = 0
    t0 = time.monotonic()
    try:
        while True:
            items = src.poll(0.1)
            for it in items:
                if isinstance(it, Delivery):
                    n += 1
                    if index is not None:
                        index.apply(it.source, it.batch)
                    if rec is not None:
                        rec.on_delivery(it)
                else:
                    resets += 1
                    if index is not None:
                        index.drop_source(it.source, it.dp_rank)
                    if rec is not None:
                        rec.on_reset(it)
            if src.error is not None:
                raise src.error
            if src.synced and not items:
                break
            if time.monotonic() - t0 > timeout and not src.synced:
                user_error(f"stream {stream} not read within {timeout:g}s")
    finally:
        src.stop()
        if writer is not None:
            writer.close()
    summary = {"stream": stream, "batches": n, "resets": resets, "seconds": round(time.monotonic() - t0, 3)}
    if index is not None:
        summary.update(copies=len(index), workers=index.block_counts())
    if output is not None:
        summary["output"] = output
    if as_json:
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        sys.stdout.write(
            f"read {n} batches ({resets} resets) from stream {stream} in {summary['seconds']:g}s"
            + (f" -> {output}" if output else "")
            + (f"; index: {len(index)} block copies" if index is not None else "")
            + "\n"
        )


def doctor_nats(
    url: str, stream: str, timeout: float, as_json: bool, sign_key: Optional[str] = None, insecure: bool = False
) -> None:
    """`doctor --nats`: the JetStream checklist (kvevents.jetstream.admin.nats_doctor)."""
    import json

    from kvevents.cli.app import CheckFailed
    from kvevents.doctor.nats import nats_doctor

    opts = nats_options(url, name="kvevents-doctor")
    rep = nats_doctor(opts, stream, timeout=timeout, sign_key=bus_trust("doctor", sign_key, insecure))
    if as_json:
        sys.stdout.write(json.dumps(rep.as_dict(), default=str) + "\n")
    else:
        print_checks(f"kvevents doctor {rep.endpoint}", rep.checks)
    failed = [ch.name for ch in rep.checks if ch.status == "fail"]
    if failed:
        raise CheckFailed(f"doctor: {len(failed)} check(s) failed: {', '.join(failed)}")
