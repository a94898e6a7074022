"""Filling a JetStream stream with a record log's batches, as a fleet's bridges would have stored them.

Two ways (benchmarks/peer_coldstart.py times a router's cold start from what they leave):

- `fill_from_log` (the "log" path): every live record published once, in log order, with exactly the
  message layout `kvevents.jetstream.bridge.Bridge` stores a live batch in (subject
  `live_subject(stream, source, rank)`, the payload bytes unchanged, headers Kve-Source / Kve-Seq /
  Kve-Epoch / Kve-Rank / Kve-Kind=live and the bridge's own `msg_id` as Nats-Msg-Id), through
  nats-py's pipelined JetStream publish. No snapshot is stored: a cold router reads the whole
  history, from each source's seq 0 (the same batches `kvevents log index` applies).
- `fill_via_bridge` (the "bridge" path): the fleet itself. One real zeromq Publisher per source (the
  engines: benchmarks/fleet_engines.py, a child process) publishes the log's batches, then one real
  Bridge over all of them (here) stores their history and a first round of snapshots; once its
  Subscriber is past every engine's last batch, a second round is asked for
  (`Bridge.request_snapshot`), so the newest snapshot of every source stands after all its batches
  and purges the first (a fleet in its steady state). A cold router then reads the snapshots and
  the tail after them. The Bridge's Subscriber gets a zmq.Context of its own with room for its
  sockets (ZeroMQ's default is 1,023 per context; zmq.Context.instance(), the Subscriber's
  default, would refuse a few hundred sources: "Too many open files").

Neither is timed: they only prepare the stream.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Callable

from kvevents.events import rank_of
from kvevents.jetstream.bridge import Bridge, msg_id
from kvevents.jetstream.link import (
    H_EPOCH,
    H_KIND,
    H_RANK,
    H_SEQ,
    H_SOURCE,
    NatsOptions,
    StreamOptions,
    close,
    connect,
    ensure_stream,
    epoch_text,
    live_subject,
)
from kvevents.recordlog.format import Record
from kvevents.recordlog.reader import RecordReader

__all__ = ["fill_from_log", "fill_via_bridge", "live_message", "stream_state", "STREAM_OPTIONS"]

#: The benchmark's stream: kept a day (a 10M-copy fill takes minutes), file storage, no byte cap.
STREAM_OPTIONS = StreamOptions(max_age_s=86_400.0)
_WINDOW = 4096  # publishes in flight before their acks are collected


def live_message(stream: str, rec: Record) -> tuple[str, bytes, dict[str, str]]:
    """(subject, payload, headers) of one live record as `Bridge` stores a live batch."""
    if rec.seq is None:
        raise ValueError(f"record {rec.index} of {rec.source}: no seq, cannot be stored as a live batch")
    rank = rank_of(rec.dp_rank)
    headers = {
        H_SOURCE: rec.source,
        H_SEQ: str(rec.seq),
        H_EPOCH: epoch_text(rec.epoch),
        H_RANK: str(rank),
        H_KIND: "live",
        "Nats-Msg-Id": msg_id(rec.source, rank, rec.seq, rec.epoch, rec.payload),
    }
    return live_subject(stream, rec.source, rank), rec.payload, headers


async def _collect(pending: deque, keep: int, tally: dict[str, int]) -> None:
    """Await the oldest acks until at most `keep` publishes are in flight; a failed one raises."""
    while len(pending) > keep:
        ack = await pending.popleft()
        tally["duplicates" if ack.duplicate else "stored"] += 1


async def _publish_log(url: str, stream: str, log_path: str) -> dict[str, int]:
    nc = await connect(NatsOptions(url), give_up_after_s=10.0)
    tally = {"stored": 0, "duplicates": 0, "skipped_records": 0}
    try:
        js = nc.jetstream(timeout=30.0, publish_async_max_pending=2 * _WINDOW)
        await ensure_stream(js, stream, STREAM_OPTIONS)
        pending: deque = deque()
        for rec in RecordReader(log_path):
            if rec.kind not in ("live", "replay"):  # resets and snapshot batches are not stored as live batches
                tally["skipped_records"] += 1
                continue
            subject, payload, headers = live_message(stream, rec)
            pending.append(await js.publish_async(subject, payload, headers=headers))
            if len(pending) >= _WINDOW:
                await _collect(pending, _WINDOW // 2, tally)
        await _collect(pending, 0, tally)
    finally:
        await close(nc)
    return tally


def fill_from_log(url: str, stream: str, log_path: str) -> dict[str, int]:
    """Publish the log's live records into `stream` (created if missing); counts stored / duplicates."""
    return asyncio.run(_publish_log(url, stream, log_path))


def stream_state(url: str, stream: str) -> dict[str, int]:
    """The stream's message and byte counts (JetStream's own figures)."""

    async def run() -> dict[str, int]:
        nc = await connect(NatsOptions(url), give_up_after_s=10.0)
        try:
            info = await nc.jetstream(timeout=30.0).stream_info(stream)
            return {"messages": int(info.state.messages), "bytes": int(info.state.bytes)}
        finally:
            await close(nc)

    return asyncio.run(run())


# ---------------------------------------------------------------- the bridge path


class _Engines:
    """benchmarks/fleet_engines.py as a child process: the log's engines, serving until closed."""

    def __init__(self, log_path: str) -> None:
        script = Path(__file__).resolve().parent / "fleet_engines.py"
        self.proc = subprocess.Popen(
            [sys.executable, str(script), log_path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            raise RuntimeError(f"fleet_engines.py exited {self.proc.returncode} before its engines were up")
        self.table: dict[str, list] = json.loads(line)  # source -> [endpoint, replay, batches, live blocks]

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(60.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10.0)


def _wait(what: str, done: Callable[[], bool], progress: Callable[[], str], timeout_s: float) -> None:
    """Wait until `done()`, a progress line on stderr every 10 s; RuntimeError after `timeout_s`."""
    t0 = last = time.monotonic()
    while not done():
        now = time.monotonic()
        if now - t0 > timeout_s:
            raise RuntimeError(f"{what}: not done after {timeout_s:.0f} s ({progress()})")
        if now - last >= 10.0:
            print(f"  {what}: {progress()}", file=sys.stderr, flush=True)
            last = now
        time.sleep(0.5)


class _Fill:
    """What the bridge has forwarded and stored so far, against what the engines published."""

    def __init__(self, bridge: Bridge, published: dict[str, int]) -> None:
        self.bridge, self.published = bridge, published

    def snapshots(self) -> int:
        return self.bridge.counters().get("snapshots_stored", 0)

    def behind(self) -> int:
        """Sources whose Subscriber has not reached the engine's last published seq yet (by history
        replay, or by a reset and the engine's snapshot: either way the bridge is past it)."""
        status = self.bridge.status()
        return sum(1 for name, n in self.published.items() if (status.get(name, {}).get("next_seq") or 0) < n)

    def check(self) -> None:
        if self.bridge.error is not None:
            raise RuntimeError(f"the bridge stopped: {self.bridge.error}")

    def progress(self) -> str:
        self.check()
        odd = {k: v for k, v in self.bridge.counters().items() if v and ("fail" in k or "reset" in k or "retr" in k)}
        return f"{self.behind()} sources behind, {self.snapshots()} snapshots stored; {odd}"


def fill_via_bridge(url: str, stream: str, log_path: str, timeout_s: float = 3600.0) -> dict[str, int]:
    """Engines -> Bridge -> `stream`: history, then a snapshot of every source after all of it.

    Returns the bridge's counts, `batches` (the log's, published by the engines) and `copies`,
    the live blocks the engines hold (what their snapshots rebuild in a router)."""
    from fleet_engines import big_context

    from kvevents.zeromq.subscriber import Source

    engines = _Engines(log_path)
    n = len(engines.table)
    published = {name: row[2] for name, row in engines.table.items()}
    sub_ctx = big_context(8 * n)  # the Subscriber's default, zmq.Context.instance(), caps at 1,023 sockets
    bridge = None
    try:
        srcs = [Source(row[0], row[1], name) for name, row in engines.table.items()]
        bridge = Bridge(
            srcs, stream, NatsOptions(url), snapshot_every_s=86_400.0, stream_options=STREAM_OPTIONS,
            request_timeout_s=30.0, publish_timeout_s=30.0, context=sub_ctx,
        )  # fmt: skip
        bridge.start()
        if not bridge.wait_connected(30.0):
            raise RuntimeError(f"bridge not connected to {url}")
        fill = _Fill(bridge, published)
        done = lambda: bridge.error is not None or (fill.snapshots() >= n and not fill.behind())  # noqa: E731
        _wait("history and first snapshots", done, fill.progress, timeout_s)
        fill.check()
        time.sleep(2.0)  # the last forwarded batches reach the stream (the snapshots' Kve-From lies after them)
        bridge.request_snapshot()  # now every source's newest snapshot stands after all its batches
        _wait("second snapshots", lambda: bridge.error is not None or fill.snapshots() >= 2 * n, fill.progress,
              timeout_s)  # fmt: skip
        fill.check()
        counts = {k: v for k, v in bridge.counters().items() if not k.startswith("subscriber_")}
        counts["copies"] = sum(row[3] for row in engines.table.values())
        counts["batches"] = sum(published.values())
        return counts
    finally:
        if bridge is not None:
            bridge.stop()
        engines.close()
        sub_ctx.destroy(linger=0)
