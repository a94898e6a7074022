"""`kvevents record`: live batches of ZeroMQ publishers (a gap-repairing Subscriber) or of a JetStream
stream into a record log (kvevents.recordlog.live.LiveRecording); a progress bar on a terminal, a
line per source saying what it publishes or what its sockets saw wrong (kvevents.published);
Ctrl-C prints the summary and exits 130."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvevents.cli.app import CheckFailed, publisher_option, user_error
from kvevents.cli.flag_groups import flag, flag_group
from kvevents.cli.options import (
    NATS_STREAM,
    CurveClients,
    NatsFlags,
    check_log_target,
    jetstream_feed,
    nats_feed_flags,
)
from kvevents.cli.output import err_console, err_line, log_to_stderr, note, out_console, warn, warn_damage
from kvevents.recordlog import START_MODES, Recorder, RecordWriter

SILENCE_HINT_S = 3.0  # nothing received for this long: print what to check


@dataclass(frozen=True)
class LogFileFlags:
    """How record writes its log: continue an existing one, overwrite it, fsync every record."""

    append: bool = flag(False, "--append", help="Append to an existing log (a torn tail is cut first).")
    force: bool = flag(False, "--force", help="Overwrite an existing file.")
    fsync: bool = flag(False, "--fsync", help="fsync every record (survives power loss; slower).")

    def writer(self, output: str) -> RecordWriter:
        """The log's writer; a directory, a special file or (without --append/--force) an existing
        log is one line and exit 2 before anything is written."""
        check_log_target(output, self.append or self.force)
        return RecordWriter(
            output, append=self.append, durability="fsync" if self.fsync else "flush", on_damage=warn_damage
        )


START = typer.Option(
    "snapshot",
    "--from",
    help="Where the log starts. snapshot (default): a reset "
    "marker and the publisher's KVE/SNAPSHOT, then the batches after it (a publisher "
    "without a replay endpoint or without snapshots: as oldest); oldest: the "
    "publisher's kept history first; now: nothing before the first live batch.",
)


@nats_feed_flags
@flag_group(LogFileFlags, "log")
@flag_group(CurveClients, "curve")
def record_cmd(
    publisher: list[str] = publisher_option([], "publisher"),
    output: str = typer.Option(..., "--output", "-o", help="Record log file to write."),
    nats_url: Optional[str] = typer.Option(
        None, "--nats", help="Record a NATS JetStream stream (kvevents bridge) instead: server URL(s)."
    ),
    stream: str = NATS_STREAM,
    durable: Optional[str] = typer.Option(
        None,
        "--durable",
        help="With --nats: a durable consumer name; with --append, recording resumes where it stopped.",
    ),
    count: Optional[int] = typer.Option(None, "--count", "-n", help="Stop after N batches (heartbeats count)."),
    duration: Optional[float] = typer.Option(None, "--duration", "-d", help="Stop after S seconds."),
    topic: str = typer.Option("", "--topic", help="ZeroMQ topic prefix to subscribe to (default: all)."),
    log: LogFileFlags = LogFileFlags(),
    start: str = START,
    curve: CurveClients = CurveClients(),
    nats_flags: NatsFlags = NatsFlags(),
) -> None:
    """Capture live batches, with the subscriber's gap repair, into a record log.

    Replayed batches are written in seq order; a resync is written as a reset marker followed by
    the snapshot batches. Stops at --count, --duration or Ctrl-C (then exit 130, after the
    summary); exit 1 if nothing was received.
    """
    from kvevents.recordlog.live import LiveRecording

    _check_flags(start, count, duration, nats_url, publisher)
    nats_flags.check(nats_url)
    sources = _sources(publisher, curve)
    if nats_url is not None:
        nats_flags.bus_key("record")  # no key and no --insecure: exit 2 before the log is made
    writer = log.writer(output)
    rec = Recorder(writer, count=count, start=start)  # type: ignore[arg-type]
    feed = _feed(rec, sources, topic, nats_url, stream, durable, output if log.append else None, nats_flags)
    session = LiveRecording(
        feed,
        rec,
        writer,
        sources=sources,
        duration=duration,
        acks_first=nats_url is not None,
        on_no_snapshot=_no_snapshot,
    )
    interrupted = _record(session, sources, topic, output, count, duration)
    if rec.error is not None:
        raise rec.error  # one line, exit 2 (the log keeps what was written before)
    _print_summary(session, sources, output, start, nats_url is None, interrupted)
    _finish(session, rec.batches, sources, topic, count, duration, interrupted)


def _finish(
    session: Any,
    batches: int,
    sources: list[Any],
    topic: str,
    count: Optional[int],
    duration: Optional[float],
    interrupted: bool,
) -> None:
    """The exit status: 1 if nothing was received (130 after Ctrl-C, then with the hint as a warning),
    130 after Ctrl-C, else 0 (a warning when --duration ended it before --count)."""
    if session.nothing_received():
        hint = f"nothing received in {session.elapsed():.1f}s; {_silence_hint(sources, topic, session.feed)}"
        if interrupted:
            warn(hint)
            raise typer.Exit(130)
        raise CheckFailed(hint)
    if interrupted:
        raise typer.Exit(130)
    if count is not None and batches < count and not interrupted:
        warn(f"stopped after {duration}s with {batches} of {count} batches")


def _check_flags(
    start: str, count: Optional[int], duration: Optional[float], nats_url: Optional[str], publisher: list[str]
) -> None:
    if start not in START_MODES:
        user_error(f"--from must be one of {', '.join(START_MODES)}, got {start!r}")
    if count is not None and count < 1:
        user_error(f"--count must be >= 1, got {count}")
    if duration is not None and duration <= 0:
        user_error(f"--duration must be > 0, got {duration}")
    if (nats_url is None) == (not publisher):
        user_error("give --publisher NAME=ENDPOINT[,REPLAY] ... or --nats URL --stream NAME (one of them)")


def _sources(publisher: list[str], curve: CurveClients) -> list[Any]:
    """The --publisher sources (unique names), with their CURVE keys."""
    from kvevents.zeromq.subscriber import parse_source

    sources = [parse_source(p, require_name=True) for p in publisher]
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        user_error(f"--publisher names must be unique, got {names}")
    return curve.apply(sources)


def _positions(path: str) -> dict:
    """Where an existing record log stands per (source, dp_rank), for `record --nats --durable --append`."""
    from kvevents.jetstream.feed import positions_from_records
    from kvevents.recordlog import select_records

    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return {}
    return positions_from_records(select_records(path, on_damage=lambda d: None))


def _feed(
    rec: Recorder,
    sources: list[Any],
    topic: str,
    nats_url: Optional[str],
    stream: str,
    durable: Optional[str],
    appended: Optional[str],
    flags: NatsFlags,
) -> Any:
    """The Subscriber of the sources, or with --nats the JetStream feed (resuming at the positions
    of the `appended` log). --from now: the subscriber starts each stream at its first live batch
    (no history replayed only to be left out); --from snapshot stays the Recorder's (it falls back
    to oldest)."""
    from kvevents.zeromq.subscriber import Subscriber

    if nats_url is not None:
        resume = _positions(appended) if appended is not None else None
        return jetstream_feed(
            nats_url,
            stream,
            "record",
            flags,
            on_delivery=rec.on_delivery,
            on_reset=rec.on_reset,
            durable=durable,
            resume=resume,
        )
    return Subscriber(
        sources,
        topic=topic,
        on_delivery=rec.on_delivery,
        on_reset=rec.on_reset,
        start="now" if rec.start == "now" else "oldest",
    )


def _no_snapshot(name: str, exc: Exception) -> None:
    warn(
        f"{name}: no snapshot ({exc}; a publisher with snapshots=False sends none): "
        "recording from its oldest kept batch"
    )


def _record(
    session: Any, sources: list[Any], topic: str, output: str, count: Optional[int], duration: Optional[float]
) -> bool:
    """Run the recording (a progress bar on a terminal); True when Ctrl-C ended it."""
    from kvevents.published import SourceNotes

    econ = err_console()
    notes = SourceNotes()
    log_to_stderr()
    for s in sources:
        note(
            f"connecting to {s.name} at {s.endpoint}" + (f" (replay {s.replay_endpoint})" if s.replay_endpoint else "")
        )
    try:
        session.open()  # opens the sockets here: a bad endpoint is one error line, exit 2
        out_console().print(
            f"recording {len(sources)} source(s) -> {output}"
            + (f" until {count} batches" if count else "")
            + (f" {'or' if count else 'for'} {duration:g}s" if duration else "")
            + " (Ctrl-C stops)",
            highlight=False,
        )
        sys.stdout.flush()
        columns = (TextColumn("recording"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=econ, disable=not econ.is_terminal, transient=True) as prog:
            task = prog.add_task("record", total=count)
            session.wait(
                on_tick=lambda batches: _tick(prog, task, batches, notes, session.feed),
                on_silence=lambda: warn(
                    f"nothing received after {SILENCE_HINT_S:g}s; {_silence_hint(sources, topic, session.feed)}"
                ),
                on_skip=lambda reason: warn(
                    f"a message could not be recorded and was skipped ({reason}); recording goes on"
                ),
                silence_s=SILENCE_HINT_S,
            )
    except KeyboardInterrupt:
        return True
    finally:
        session.close()
    return False


def _tick(prog: Any, task: Any, batches: int, notes: Any, feed: Any) -> None:
    """Every 0.1 s: the progress bar, and any new line per source (what it publishes, a problem);
    a feed that gave up (NATS unreachable past --give-up-after) ends the recording (exit 2)."""
    prog.update(task, completed=batches)
    error = getattr(feed, "error", None)
    if error is not None:
        raise error
    for line in notes.lines(feed.status()):
        err_line(f"kvevents record: {line}")


def _print_summary(session: Any, sources: list[Any], output: str, start: str, zeromq: bool, interrupted: bool) -> None:
    for line in session.summary(start, interrupted, zeromq=zeromq):
        out_console().print(line, highlight=False)


def _silence_hint(sources: list[Any], topic: str, feed: Any = None) -> str:
    """The likely cause the feed's sockets saw, else what `kvevents doctor` would check, naming the
    first source."""
    if not sources:
        return "is a kvevents bridge feeding the stream? `kvevents doctor --nats URL --stream NAME` checks it"
    problems = [f"{n}: {st.problem}" for n, st in (feed.status() if feed is not None else {}).items() if st.problem]
    if problems:
        return "; ".join(problems)
    s = sources[0]
    doctor = f"kvevents doctor {s.endpoint}" + (f" --replay {s.replay_endpoint}" if s.replay_endpoint else "")
    return (
        f"is a publisher running and bound at {s.endpoint}"
        + (f", does its topic start with {topic!r}" if topic else "")
        + f"? `{doctor}` checks the address, the topic and the replay endpoint"
    )
