"""`kvevents record` and `kvevents replay`: capture live streams to a log, publish a log again.

Thin faces over kvevents.recordlog (format, pacing), kvevents.zeromq.subscriber (gap repair),
kvevents.zeromq.publisher (publish_payload keeps the original bytes) and kvevents.consumers.indexer.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from kvevents.cli.app import CheckFailed, app, user_error
from kvevents.cli.keys import (
    ALLOW_HELP,
    CLIENT_CERT_HELP,
    SECRET_HELP,
    SERVER_KEY_HELP,
    SERVER_KEYS_HELP,
    curve_client,
    curve_server,
    with_curve,
)
from kvevents.cli.logtools_common import err_console, log_to_stderr, out_console, warn, warn_damage
from kvevents.cli.nats_trust import INSECURE_HELP, MAX_SOURCES_HELP, SIGN_KEY_HELP, bus_trust
from kvevents.errors import DecodeError
from kvevents.events import decode_batch
from kvevents.recordlog import START_MODES, Recorder, RecordWriter, paced, parse_speed, select_records

SNAPSHOT_TIMEOUT_S = 2.0  # a publisher with snapshots=False never answers KVE/SNAPSHOT
SILENCE_HINT_S = 3.0  # nothing received for this long: print what to check


@app.command("record")
def record_cmd(
    publisher: list[str] = typer.Option([], "--publisher", help="NAME=ENDPOINT[,REPLAY] (repeatable)."),
    output: str = typer.Option(..., "--output", "-o", help="Record log file to write."),
    nats_url: Optional[str] = typer.Option(
        None, "--nats", help="Record a NATS JetStream stream (kvevents bridge) instead: server URL(s)."
    ),
    stream: str = typer.Option("kvevents", "--stream", help="With --nats: the JetStream stream name."),
    durable: Optional[str] = typer.Option(
        None,
        "--durable",
        help="With --nats: a durable consumer name; with --append, recording resumes where it stopped.",
    ),
    count: Optional[int] = typer.Option(None, "--count", "-n", help="Stop after N batches (heartbeats count)."),
    duration: Optional[float] = typer.Option(None, "--duration", "-d", help="Stop after S seconds."),
    topic: str = typer.Option("", "--topic", help="ZeroMQ topic prefix to subscribe to (default: all)."),
    append: bool = typer.Option(False, "--append", help="Append to an existing log (a torn tail is cut first)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
    fsync: bool = typer.Option(False, "--fsync", help="fsync every record (survives power loss; slower)."),
    start: str = typer.Option(
        "snapshot",
        "--from",
        help="Where the log starts. snapshot (default): a reset "
        "marker and the publisher's KVE/SNAPSHOT, then the batches after it (a publisher "
        "without a replay endpoint or without snapshots: as oldest); oldest: the "
        "publisher's kept history first; now: nothing before the first live batch.",
    ),
    curve_server_key: list[str] = typer.Option([], "--curve-server-key", help=SERVER_KEYS_HELP),
    curve_client_cert: Optional[str] = typer.Option(None, "--curve-client-cert", help=CLIENT_CERT_HELP),
    sign_key: Optional[str] = typer.Option(None, "--sign-key", help="With --nats: " + SIGN_KEY_HELP),
    insecure: bool = typer.Option(False, "--insecure", help="With --nats: " + INSECURE_HELP),
    max_sources: int = typer.Option(4096, "--max-sources", help="With --nats: " + MAX_SOURCES_HELP),
) -> None:
    """Capture live batches, with the subscriber's gap repair, into a record log.

    Replayed batches are written in seq order; a resync is written as a reset marker followed by
    the snapshot batches. Stops at --count, --duration or Ctrl-C; exit 1 if nothing was received.
    """
    from kvevents.zeromq.subscriber import Reset, Subscriber, parse_source

    if start not in START_MODES:
        user_error(f"--from must be one of {', '.join(START_MODES)}, got {start!r}")
    if count is not None and count < 1:
        user_error(f"--count must be >= 1, got {count}")
    if duration is not None and duration <= 0:
        user_error(f"--duration must be > 0, got {duration}")
    if (nats_url is None) == (not publisher):
        user_error("give --publisher NAME=ENDPOINT[,REPLAY] ... or --nats URL --stream NAME (one of them)")
    sources = [parse_source(p, require_name=False) for p in publisher]
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        user_error(f"--publisher names must be unique, got {names}")
    with_curve(sources, curve_server_key, curve_client_cert)
    if nats_url is not None:
        bus_trust("record", sign_key, insecure)  # no key and no --insecure: exit 2 before the log is made
    _check_overwrite(output, append or force)
    writer = RecordWriter(output, append=append, durability="fsync" if fsync else "flush", on_damage=warn_damage)
    rec = Recorder(writer, count=count, start=start)  # type: ignore[arg-type]
    if nats_url is not None:  # kvevents.cli.nats: the JetStream feed, resuming at the log's positions
        from kvevents.cli.nats import jetstream_source, record_positions

        sub = jetstream_source(
            nats_url,
            stream,
            "record",
            sign_key,
            insecure,
            max_sources=max_sources,
            on_delivery=rec.on_delivery,
            on_reset=rec.on_reset,
            durable=durable,
            resume=record_positions(output) if append else None,
        )
    else:
        # --from now: the subscriber starts each stream at its first live batch (no history replayed
        # only to be left out); --from snapshot stays the Recorder's (it falls back to oldest)
        sub = Subscriber(
            sources,
            topic=topic,
            on_delivery=rec.on_delivery,
            on_reset=rec.on_reset,
            start="now" if start == "now" else "oldest",
        )
    econ = err_console()
    interrupted = False
    log_to_stderr()
    for s in sources:
        _say(
            f"connecting to {s.name} at {s.endpoint}" + (f" (replay {s.replay_endpoint})" if s.replay_endpoint else "")
        )
    t0 = time.monotonic()
    try:
        for item in sub.poll(0):  # opens the sockets here: a bad endpoint is one error line, exit 2
            (rec.on_reset if isinstance(item, Reset) else rec.on_delivery)(item)
        if start == "snapshot":
            _begin_with_snapshots(rec, sources)
        t0 = time.monotonic()  # the recording window starts once the snapshots are in
        deadline = None if duration is None else t0 + duration
        sub.start()
        out_console().print(
            f"recording {len(sources)} source(s) -> {output}"
            + (f" until {count} batches" if count else "")
            + (f" or {duration:g}s" if duration else "")
            + " (Ctrl-C stops)",
            highlight=False,
        )
        sys.stdout.flush()
        with Progress(
            TextColumn("recording"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=econ,
            disable=not econ.is_terminal,
            transient=True,
        ) as prog:
            task = prog.add_task("record", total=count)
            hinted = skip_told = False
            while not rec.done.is_set():
                wait = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
                if wait <= 0:
                    break
                rec.done.wait(wait)
                prog.update(task, completed=rec.batches)
                if not hinted and _nothing_received(rec) and time.monotonic() - t0 >= SILENCE_HINT_S:
                    hinted = True
                    warn(f"nothing received after {SILENCE_HINT_S:g}s; {_silence_hint(sources, topic)}")
                if rec.skipped and not skip_told:
                    skip_told = True
                    warn(f"a message could not be recorded and was skipped ({rec.skip_reason}); recording goes on")
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if nats_url is not None:
            sub.stop()  # the feed first: all it acknowledges to a durable consumer has been written
        rec.stop()  # no write after this, even from a callback still running
        sub.stop()
        writer.close()
    if rec.error is not None:
        raise rec.error  # one line, exit 2 (the log keeps what was written before)
    counters = sub.counters()
    elapsed = time.monotonic() - t0
    size = os.path.getsize(output)  # the whole file, header included: what `log inspect` reports
    out_console().print(
        f"recorded {rec.batches} batches"
        + (f" after a snapshot of {rec.snapshot_batches} batches" if rec.snapshot_batches else "")
        + f" and {rec.resets} resets from {len(sources)} source(s) in {elapsed:.2f}s -> {output} ({size} bytes); "
        f"repaired gaps {counters.get('gaps', 0)}, replayed {counters.get('replayed', 0)}, "
        f"snapshot batches {counters.get('snapshot_batches', 0)}, losses {counters.get('losses', 0)}"
        + (
            f", left out {rec.history_dropped} from before the start (--from {start})"
            if rec.history_dropped
            else " (history before the first live batch left out: --from now)"
            if start == "now" and nats_url is None
            else ""
        )
        + (f", skipped {rec.skipped} that could not be stored" if rec.skipped else "")
        + (" (interrupted)" if interrupted else ""),
        highlight=False,
    )
    if _nothing_received(rec):
        raise CheckFailed(f"nothing received in {elapsed:.1f}s; {_silence_hint(sources, topic)}")
    if count is not None and rec.batches < count and not interrupted:
        warn(f"stopped after {duration}s with {rec.batches} of {count} batches")


def _say(message: str) -> None:
    sys.stderr.write(f"kvevents: {message}\n")
    sys.stderr.flush()


def _nothing_received(rec: Recorder) -> bool:
    return rec.received == 0 and rec.snapshots_taken == 0


def _silence_hint(sources: list[Any], topic: str) -> str:
    """What `kvevents doctor` would check, naming the first source."""
    if not sources:
        return "is a kvevents bridge feeding the stream? `kvevents doctor --nats URL --stream NAME` checks it"
    s = sources[0]
    doctor = f"kvevents doctor {s.endpoint}" + (f" --replay {s.replay_endpoint}" if s.replay_endpoint else "")
    return (
        f"is a publisher running and bound at {s.endpoint}"
        + (f", does its topic start with {topic!r}" if topic else "")
        + f"? `{doctor}` checks the address, the topic and the replay endpoint"
    )


def _begin_with_snapshots(rec: Recorder, sources: list[Any]) -> None:
    """--from snapshot: each source with a replay endpoint starts with its KVE/SNAPSHOT (else: oldest)."""
    from kvevents.zeromq.engine_requests import EngineRequestError, snapshot
    from kvevents.zeromq.security import client_context

    for s in sources:
        if not s.replay_endpoint:
            continue
        try:
            payloads, seq = snapshot(s.replay_endpoint, timeout=SNAPSHOT_TIMEOUT_S, context=client_context(s.curve))
        except EngineRequestError as exc:
            warn(
                f"{s.name}: no snapshot ({exc}; a publisher with snapshots=False sends none): "
                "recording from its oldest kept batch"
            )
            continue
        rec.begin_with_snapshot(str(s.name), payloads, seq, endpoint=s.endpoint)


def _check_overwrite(path: str, allowed: bool) -> None:
    if os.path.isdir(path):
        user_error(f"{path} is a directory: give a file name for the log, e.g. {os.path.join(path, 'capture.kvlog')}")
    if os.path.exists(path) and not os.path.isfile(path):
        user_error(f"{path} is not a regular file (a FIFO, socket or device): give a file name for the log")
    if not allowed and os.path.exists(path) and os.path.getsize(path) > 0:
        user_error(f"{path} exists: use --append to continue it or --force to overwrite it")


def _scan_sources(path: str, **sel: Any) -> tuple[int, dict[str, int]]:
    n = 0
    by: dict[str, int] = {}
    for r in select_records(path, on_damage=lambda d: None, **sel):
        n += 1
        by[r.source] = by.get(r.source, 0) + 1
    return n, by


@app.command("replay")
def replay_cmd(
    file: str = typer.Argument(..., help="Record log to replay."),
    to: str = typer.Option(
        ...,
        "--to",
        help="Publish on this endpoint, e.g. tcp://127.0.0.1:6557 (bound: tail, route or record connect to it).",
    ),
    bind: bool = typer.Option(
        True,
        "--bind/--connect",
        help="Bind --to (default: a replayer is a publisher for others to reach), or connect to a consumer that binds.",
    ),
    replay_endpoint: Optional[str] = typer.Option(None, "--replay-endpoint", help="Also serve replay/snapshot here."),
    speed: str = typer.Option("1", "--speed", help="1 (recorded timing), 10 (ten times faster), ..., or max."),
    from_seq: Optional[int] = typer.Option(None, "--from-seq", help="First recorded seq to replay."),
    to_seq: Optional[int] = typer.Option(None, "--to-seq", help="Last recorded seq to replay."),
    loop: bool = typer.Option(False, "--loop", help="Replay again and again (Ctrl-C stops)."),
    source: Optional[str] = typer.Option(
        None, "--source", help="Only this recorded source (needed when the log has several)."
    ),
    topic: Optional[str] = typer.Option(None, "--topic", help="Publisher topic (default: the recorded one)."),
    delay: float = typer.Option(0.5, "--delay", help="Seconds to wait before the first batch (subscribers join)."),
    linger: float = typer.Option(
        2.0, "--linger", help="Seconds to keep serving (heartbeats, replay) after the last batch."
    ),
    heartbeat: float = typer.Option(1.0, "--heartbeat", help="Publisher heartbeat interval in seconds (0: off)."),
    curve_secret: Optional[str] = typer.Option(None, "--curve-secret", help=SECRET_HELP),
    curve_allow: Optional[str] = typer.Option(None, "--curve-allow", help=ALLOW_HELP),
) -> None:
    """Republish a record log through a real Publisher (new seqs, original payload bytes).

    Related: `kvevents log index FILE` rebuilds a block index offline; `kvevents fetch` pulls a
    publisher's replay buffer (or a JetStream stream) into a log."""
    rate = parse_speed(speed)
    curve_server(curve_secret, curve_allow)  # bad key files: one line, exit 2
    sel: dict[str, Any] = {"from_seq": from_seq, "to_seq": to_seq}
    total, by_source = _scan_sources(file, **sel)
    if source is not None:
        if source not in by_source:
            user_error(f"source {source!r} is not in {file} (sources: {', '.join(sorted(by_source)) or 'none'})")
        total = by_source[source]
    elif len(by_source) > 1:
        user_error(
            f"{file} holds {len(by_source)} sources ({', '.join(sorted(by_source))}): one endpoint "
            f"replays one publisher, pick it with --source NAME"
        )
    if total == 0:
        user_error(f"no record of {file} to replay (check --from-seq/--to-seq)")
    curve = (curve_secret, curve_allow)
    _publish_log(
        file, to, replay_endpoint, rate, sel, source, topic, loop, total, delay, linger, heartbeat, bind, curve
    )


@app.command("fetch")
def fetch_cmd(
    endpoint: Optional[str] = typer.Argument(
        None, help="A publisher's replay endpoint (its ROUTER), e.g. tcp://127.0.0.1:5558."
    ),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="The record log to write."),
    since: int = typer.Option(0, "--since", min=0, help="With ENDPOINT: the first seq to ask for."),
    name: Optional[str] = typer.Option(
        None, "--name", help="With ENDPOINT: source name to record (default: the endpoint)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
    timeout: float = typer.Option(3.0, "--timeout", help="With ENDPOINT: seconds to wait for each reply."),
    nats_url: Optional[str] = typer.Option(
        None, "--nats", help="Read a NATS JetStream stream (URL) instead of an endpoint."
    ),
    stream: str = typer.Option("kvevents", "--stream", help="With --nats: the JetStream stream name."),
    back: Optional[float] = typer.Option(
        None,
        "--back",
        help="With --nats: only the live batches of the last N seconds (default: snapshot + tail, as a cold router reads it).",
    ),
    into_index: bool = typer.Option(
        False,
        "--into-index",
        help="With --nats: rebuild a block index and print its summary (instead of, or besides, -o).",
    ),
    as_json: bool = typer.Option(False, "--json", help="With --into-index: print the summary as JSON."),
    curve_server_key: Optional[str] = typer.Option(None, "--curve-server-key", help=SERVER_KEY_HELP),
    curve_client_cert: Optional[str] = typer.Option(None, "--curve-client-cert", help=CLIENT_CERT_HELP),
    sign_key: Optional[str] = typer.Option(None, "--sign-key", help="With --nats: " + SIGN_KEY_HELP),
    insecure: bool = typer.Option(False, "--insecure", help="With --nats: " + INSECURE_HELP),
    max_sources: int = typer.Option(4096, "--max-sources", help="With --nats: " + MAX_SOURCES_HELP),
) -> None:
    """Pull a publisher's replay buffer (ENDPOINT, from seq --since) or what a JetStream stream holds
    (--nats URL --stream NAME) into a record log."""
    if nats_url is not None:  # kvevents.cli.nats: as a cold router reads it (or --back N seconds of batches)
        from kvevents.cli.nats import replay_from_nats

        if endpoint is not None:
            user_error("give ENDPOINT or --nats URL, not both")
        if curve_server_key or curve_client_cert:
            user_error("--curve-server-key/--curve-client-cert apply to a replay ENDPOINT (ZeroMQ), not to --nats")
        if output is not None:
            _check_overwrite(output, force)
        trust = {"sign_key": sign_key, "insecure": insecure, "max_sources": max_sources}
        return replay_from_nats(nats_url, stream, back, output, into_index, as_json, **trust)  # type: ignore[arg-type]
    if endpoint is None:
        user_error("missing ENDPOINT (a replay endpoint) or --nats URL")
    if into_index or back is not None:
        user_error("--into-index and --back go with --nats; for a record log use `kvevents log index FILE`")
    if output is None:
        user_error("fetch needs -o FILE")
    curve = curve_client(curve_server_key, curve_client_cert)  # bad key files: one line, exit 2
    _check_overwrite(output, force)
    _fetch(endpoint, since, output, name or endpoint, timeout, curve)


def _publish_log(
    file: str,
    to: str,
    replay_ep: str | None,
    rate: float | None,
    sel: dict[str, Any],
    source: str | None,
    topic: str | None,
    loop: bool,
    total: int,
    delay: float,
    linger: float,
    heartbeat: float,
    bind: bool | None,
    curve: tuple[str | None, str | None] = (None, None),
) -> None:
    from kvevents.zeromq.publisher import Publisher, PublisherConfig
    from kvevents.zeromq.wire import should_bind

    recs = select_records(file, on_damage=lambda d: None, **sel)
    try:
        first = next((r for r in recs if source is None or r.source == source), None)
    finally:
        recs.close()  # type: ignore[attr-defined]
    if topic is None:
        topic = first.topic if first is not None else ""
    # the recorded stream's epoch: our heartbeats and snapshots then agree with the replayed payloads
    epoch = first.epoch if first is not None and first.epoch is not None and 0 <= first.epoch < 2**63 else None
    cfg = PublisherConfig(
        endpoint=to,
        replay_endpoint=replay_ep,
        topic=topic,
        heartbeat_interval_s=heartbeat,
        bind=bind,
        epoch=epoch,
        curve_secret_key_file=curve[0],
        curve_allow_dir=curve[1],
    )
    pub = Publisher(cfg)
    econ = err_console()
    sent = skipped = loops = 0
    t0 = time.monotonic()
    try:
        verb = "binds" if should_bind(to, bind) else "connects to"
        out_console().print(
            f"replaying {file} -> {pub.endpoint}"
            + (f" (replay {pub.replay_endpoint})" if pub.replay_endpoint else "")
            + f", {total} batches, speed {'max' if rate is None else f'{rate:g}x'} (publisher {verb} it)",
            highlight=False,
        )
        sys.stdout.flush()
        if delay > 0:
            time.sleep(delay)
        with Progress(
            TextColumn("replay"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=econ,
            disable=not econ.is_terminal,
            transient=False,
        ) as prog:
            task = prog.add_task("replay", total=total)
            again = True
            while again:
                again = loop
                loops += 1
                prog.update(task, completed=0)
                recs = select_records(file, on_damage=warn_damage if loops == 1 else (lambda d: None), **sel)
                if source is not None:
                    recs = (r for r in recs if r.source == source)
                for i, r in enumerate(paced(recs, rate)):
                    try:  # publish_payload: heartbeats/snapshots then carry this payload's epoch and rank
                        pub.publish_payload(r.payload)
                        sent += 1
                    except DecodeError as exc:
                        skipped += 1
                        if skipped <= 5:
                            warn(f"record {r.index} not republished: {exc}")
                    if i % 64 == 0:
                        prog.update(task, completed=i + 1)
                prog.update(task, completed=total)
        if linger > 0:
            time.sleep(linger)
    except KeyboardInterrupt:
        pass
    finally:
        pub.close()
    el = time.monotonic() - t0
    out_console().print(
        f"replayed {sent} batches ({loops} pass{'es' if loops > 1 else ''}, {skipped} undecodable "
        f"skipped) in {el:.2f}s",
        highlight=False,
    )


def _fetch(endpoint: str, since: int, output: str, name: str, timeout: float, curve: Any = None) -> None:
    from kvevents.zeromq.engine_requests import replay as fetch_replay
    from kvevents.zeromq.security import client_context

    if since < 0:
        user_error(f"--since must be >= 0, got {since}")
    n = 0
    first: int | None = None
    last: int | None = None
    w = RecordWriter(output, durability="buffered")
    try:
        for topic, seq, payload in fetch_replay(endpoint, since, timeout=timeout, context=client_context(curve)):
            try:
                b = decode_batch(payload)
                epoch, rank = b.epoch, b.data_parallel_rank
            except DecodeError:
                epoch = rank = None
            w.write(
                payload,
                source=name,
                endpoint=endpoint,
                topic=topic.decode("utf-8", "replace"),
                seq=seq,
                epoch=epoch,
                dp_rank=rank,
                kind="replay",
            )
            first = seq if first is None else first
            last = seq
            n += 1
    except BaseException:
        w.close()
        if n == 0:
            os.remove(output)  # nothing fetched: leave no empty log behind
        raise
    w.close()
    if first is not None and first > since:
        warn(f"asked from seq {since} but the oldest kept batch is seq {first}: {first - since} batches are gone")
    out_console().print(
        f"fetched {n} batches" + (f" (seqs {first}..{last})" if n else "") + f" from {endpoint} -> {output}",
        highlight=False,
    )
