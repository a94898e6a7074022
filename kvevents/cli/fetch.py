"""`kvevents fetch`: a publisher's replay buffer (ENDPOINT, from seq --since) or what a JetStream
stream holds (--nats) into a record log or a block index (kvevents.recordlog.live). With --nats a
misspelled stream is one line naming the streams there; a long read says how far it goes (the
stream's last seq at start) and shows its progress on stderr."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Optional

import typer

from kvevents.cli.app import user_error
from kvevents.cli.options import (
    CURVE_CLIENT_CERT,
    CURVE_SERVER_KEY,
    NATS_STREAM,
    NatsFlags,
    check_log_target,
    curve_client,
    jetstream_feed,
    nats_feed_flags,
)
from kvevents.cli.output import err_console, out_console, say, warn

NATS_READ_TIMEOUT_S = 30.0  # --nats: the stream must be read (caught up) within this
NATS_ANSWER_S = 5.0  # --nats: how long NATS may take to list its streams (--give-up-after sets it)
PROGRESS_EVERY_S = 5.0  # --nats, not on a terminal: a progress line this often while reading


@nats_feed_flags
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
    stream: str = NATS_STREAM,
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
    curve_server_key: Optional[str] = CURVE_SERVER_KEY,
    curve_client_cert: Optional[str] = CURVE_CLIENT_CERT,
    nats_flags: NatsFlags = NatsFlags(),
) -> None:
    """Pull a publisher's replay buffer (ENDPOINT, from seq --since) or what a JetStream stream holds
    (--nats URL --stream NAME) into a record log."""
    nats_flags.check(nats_url)
    if nats_url is not None:  # as a cold router reads it (or --back N seconds of batches)
        if endpoint is not None:
            user_error("give ENDPOINT or --nats URL, not both")
        if curve_server_key or curve_client_cert:
            user_error("--curve-server-key/--curve-client-cert apply to a replay ENDPOINT (ZeroMQ), not to --nats")
        if output is not None:
            check_log_target(output, force)
        return _from_nats(nats_url, stream, back, output, into_index, as_json, nats_flags)
    if endpoint is None:
        user_error("missing ENDPOINT (a replay endpoint) or --nats URL")
    if into_index or back is not None:
        user_error("--into-index and --back go with --nats; for a record log use `kvevents log index FILE`")
    if output is None:
        user_error("fetch needs -o FILE")
    curve = curve_client(curve_server_key, curve_client_cert)  # bad key files: one line, exit 2
    check_log_target(output, force)
    _from_endpoint(endpoint, since, output, name or endpoint, timeout, curve)


def _from_endpoint(endpoint: str, since: int, output: str, name: str, timeout: float, curve: Any = None) -> None:
    from kvevents.recordlog.live import fetch_replay

    if since < 0:
        user_error(f"--since must be >= 0, got {since}")
    res = fetch_replay(endpoint, since, output, name, timeout=timeout, curve=curve)
    first = res.first_seq
    if first is not None and first > since:
        warn(f"asked from seq {since} but the oldest kept batch is seq {first}: {first - since} batches are gone")
    out_console().print(
        f"fetched {res.batches} batches"
        + (f" (seqs {first}..{res.last_seq})" if res.batches else "")
        + f" from {endpoint} -> {output}",
        highlight=False,
    )


def _from_nats(
    url: str,
    stream: str,
    back_s: Optional[float],
    output: Optional[str],
    into_index: bool,
    as_json: bool,
    flags: NatsFlags,
    timeout: float = NATS_READ_TIMEOUT_S,
) -> None:
    """`fetch --nats`: what the stream holds, as a cold router reads it (snapshot + tail) or, with
    --back, the live batches stored in the last N seconds; into a record log (-o) and/or an index."""
    from kvevents.recordlog.live import drain_feed

    if output is None and not into_index:
        user_error("fetch --nats needs -o FILE (a record log) or --into-index")
    if back_s is not None and back_s <= 0:
        user_error(f"--back (seconds) must be > 0, got {back_s:g}")
    flags.options(url, "fetch")  # a bad URL or a missing file: exit 2 first, then a missing key
    flags.bus_key("fetch")
    last = _last_seq(url, stream, flags)
    start_time = None if back_s is None else time.time() - back_s
    src = jetstream_feed(url, stream, "fetch", flags, start_time=start_time, give_up_after_s=timeout)
    sink = _Sink(output, into_index)  # (after the feed: a refused --sign-key leaves no file behind)
    t0 = time.monotonic()
    try:
        with _Progress(src, stream, last) as progress:
            res = drain_feed(src, sink.on_delivery, sink.on_reset, timeout, on_tick=progress.tick)
    finally:
        src.stop()
        sink.close()
    if not res.synced:
        user_error(f"stream {stream} not read within {timeout:g}s")
    summary: dict[str, Any] = {"stream": stream, "batches": res.batches, "resets": res.resets}
    summary["seconds"] = round(time.monotonic() - t0, 3)
    _print_summary(summary, sink, output, as_json)


def _last_seq(url: str, stream: str, flags: NatsFlags) -> int:
    """The stream's last seq now; a stream that is not there is one line naming those that are."""
    from kvevents.jetstream.admin import stream_positions

    streams = stream_positions(flags.options(url, "fetch"), timeout=flags.give_up_after or NATS_ANSWER_S)
    if stream not in streams:
        there = ", ".join(sorted(streams)) or "none (a kvevents bridge creates its stream)"
        user_error(f"no stream {stream!r} on {url}; streams there: {there}")
    return streams[stream]


class _Progress:
    """How far `fetch --nats` has read against the stream's last seq at start: a bar on a terminal,
    else a line every PROGRESS_EVERY_S (nothing for a read shorter than that)."""

    def __init__(self, feed: Any, stream: str, last: int, clock: Any = time.monotonic) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.feed, self.last, self.clock = feed, last, clock
        console = err_console()
        say("fetch", f"reading stream {stream} up to seq {last} (its last at start)")
        columns = (TextColumn(f"stream {stream}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        self.bar = Progress(*columns, console=console, transient=True) if console.is_terminal else None
        self.task = self.bar.add_task("read", total=max(last, 1)) if self.bar is not None else None
        self.next_line = clock() + PROGRESS_EVERY_S

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def tick(self) -> None:
        at = min(self.feed.read_to, self.last)
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, completed=at)
        elif self.clock() >= self.next_line:
            self.next_line = self.clock() + PROGRESS_EVERY_S
            say("fetch", f"read to seq {at} of {self.last} ({100 * at // max(self.last, 1)}%)")


class _Sink:
    """Where `fetch --nats` puts what it reads: a block index and / or a record log."""

    def __init__(self, output: Optional[str], into_index: bool) -> None:
        self.index: Any = None
        self.writer: Any = None
        self.rec: Any = None
        if into_index:
            from kvevents.consumers.indexer import BlockIndex

            self.index = BlockIndex()
        if output is not None:
            from kvevents.recordlog import Recorder, RecordWriter

            self.writer = RecordWriter(output, durability="buffered")
            self.rec = Recorder(self.writer)

    def on_delivery(self, it: Any) -> None:
        if self.index is not None:
            self.index.apply(it.source, it.batch)
        if self.rec is not None:
            self.rec.on_delivery(it)

    def on_reset(self, it: Any) -> None:
        if self.index is not None:
            self.index.drop_source(it.source, it.dp_rank)
        if self.rec is not None:
            self.rec.on_reset(it)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _print_summary(summary: dict[str, Any], sink: _Sink, output: Optional[str], as_json: bool) -> None:
    index = sink.index
    if index is not None:
        summary.update(copies=len(index), workers=index.block_counts())
    if output is not None:
        summary["output"] = output
    if as_json:
        sys.stdout.write(json.dumps(summary) + "\n")
        return
    sys.stdout.write(
        f"read {summary['batches']} batches ({summary['resets']} resets) from stream {summary['stream']} in "
        f"{summary['seconds']:g}s"
        + (f" -> {output}" if output else "")
        + (f"; index: {len(index)} block copies" if index is not None else "")
        + "\n"
    )
