"""`kvevents replay FILE --to ENDPOINT`: a record log republished through a real Publisher
(kvevents.recordlog.republish), at the recorded pace or faster; a progress bar on a terminal."""

from __future__ import annotations

import sys
import time
from typing import Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from kvevents.cli.app import user_error
from kvevents.cli.flag_groups import flag_group
from kvevents.cli.options import CurveServerFlags
from kvevents.cli.output import err_console, out_console, warn, warn_damage
from kvevents.recordlog import parse_speed

MAX_SKIPS_SHOWN = 5  # undecodable records named one by one; the summary counts them all


@flag_group(CurveServerFlags, "curve")
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
    curve: CurveServerFlags = CurveServerFlags(),
) -> None:
    """Republish a record log through a real Publisher (new seqs, original payload bytes).

    Related: `kvevents log index FILE` rebuilds a block index offline; `kvevents fetch` pulls a
    publisher's replay buffer (or a JetStream stream) into a log."""
    from kvevents.recordlog.republish import Republisher, first_record, publisher_config
    from kvevents.zeromq.publisher import Publisher

    rate = parse_speed(speed)
    curve.server()  # bad key files: one line, exit 2
    sel: dict[str, Any] = {"from_seq": from_seq, "to_seq": to_seq}
    total = _selected(file, sel, source)
    first = first_record(file, sel, source)
    keys = (curve.curve_secret, curve.curve_allow)
    pub = Publisher(publisher_config(first, to, replay_endpoint, topic, heartbeat, bind, keys))
    rep = Republisher(pub, file, sel, source, rate, loop)
    t0 = time.monotonic()
    try:
        _announce(file, pub, to, bind, total, rate)
        if delay > 0:
            time.sleep(delay)
        _run(rep, total)
        if linger > 0:
            time.sleep(linger)
    except KeyboardInterrupt:
        pass
    finally:
        pub.close()
    out_console().print(
        f"replayed {rep.sent} batches ({rep.loops} pass{'es' if rep.loops > 1 else ''}, {rep.skipped} undecodable "
        f"skipped) in {time.monotonic() - t0:.2f}s",
        highlight=False,
    )


def _selected(file: str, sel: dict[str, Any], source: Optional[str]) -> int:
    """How many records the replay publishes; one source must be chosen in a log of several."""
    from kvevents.recordlog.republish import count_by_source

    total, by_source = count_by_source(file, **sel)
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
    return total


def _announce(file: str, pub: Any, to: str, bind: bool, total: int, rate: Optional[float]) -> None:
    from kvevents.zeromq.wire import should_bind

    verb = "binds" if should_bind(to, bind) else "connects to"
    out_console().print(
        f"replaying {file} -> {pub.endpoint}"
        + (f" (replay {pub.replay_endpoint})" if pub.replay_endpoint else "")
        + f", {total} batches, speed {'max' if rate is None else f'{rate:g}x'} (publisher {verb} it)",
        highlight=False,
    )
    sys.stdout.flush()


def _run(rep: Any, total: int) -> None:
    """Every pass of the republisher under a progress bar (shown on a terminal only)."""
    econ = err_console()
    columns = (TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=econ, disable=not econ.is_terminal, transient=False) as prog:
        task = prog.add_task("replay", total=total)

        def skipped(record: Any, exc: Exception) -> None:
            if rep.skipped <= MAX_SKIPS_SHOWN:
                warn(f"record {record.index} not republished: {exc}")

        rep.run(
            on_damage=warn_damage,
            on_progress=lambda done: prog.update(task, completed=done),
            on_pass_end=lambda: prog.update(task, completed=total),
            on_skip=skipped,
        )
