"""The feed's ways of reading its stream into its backlog: what is stored when it starts, by an
ephemeral pull consumer, then the live tail on an ordered push consumer (the default); or a durable
pull consumer throughout (`durable=`, acknowledged once deliveries are consumed).

All hold back when the backlog is full (`Backlog.room`), so a slow `poll()` side slows the server,
never loses a message: the push callback answers flow control late, and a pull waits until a whole
request fits (`request_size`; asked for whatever room there was, most requests were a message or
two and the catch-up was 1.3x slower). The catch-up pulls because a push consumer's server sends
ahead of flow control into nats-py's own queue: at a cold start of millions of copies that
read-ahead, made among the index's long-lived objects, left the process's memory fragmented
(benchmarks/README.md, the JetStream cold starts). Its requests are answered into an inbox whose
callback puts each message in the backlog (nats-py's `fetch` awaits each message in turn: 1.4x
slower). Once nothing is left pending, the live tail goes on from the next stream seq by push (a
pull's linger would add latency).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from collections import Counter
from typing import Any, Callable

from kvevents.jetstream.backlog import Backlog
from kvevents.jetstream.link import stream_filter
from kvevents.jetstream.messages import CaughtUp, QueueItem, StoredMsg

__all__ = ["StreamReader", "read_durable", "read_ordered", "request_size", "wait_for_event"]

log = logging.getLogger("kvevents.jetstream")

FETCH_BATCH = 512  # messages one pull asks for (fewer when the backlog's bound is smaller)
FETCH_WAIT_S = 0.5
REQUEST_GRACE_S = 5.0  # a pull request unanswered this long past its expiry: the server is gone
CATCH_UP_WAIT_S = 0.2  # a catch-up fetch that gets nothing this long: all stored is handed over
ACK_WAIT_S = 30.0  # the server redelivers what is not acknowledged in this long
INACTIVE_S = 10.0  # the server drops a catch-up consumer left behind this long (a reader gone)
CAUGHT_UP_EVERY_S = 0.2  # how often an ordered reader not synced yet asks whether it is caught up


async def wait_for_event(event: threading.Event, timeout_s: float) -> bool:
    """Wait on the loop, without blocking it, until another thread sets `event` (False: timed out)."""
    deadline = time.monotonic() + timeout_s
    while not event.is_set():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def request_size(q: Backlog[QueueItem], stopped: Callable[[], bool]) -> int:
    """Wait until a whole request fits in the backlog (FETCH_BATCH, or all of a smaller bound), then
    what one pull asks for: the room there is, at least 1, at most FETCH_BATCH."""
    await q.room(stopped, FETCH_BATCH)
    return max(1, min(FETCH_BATCH, q.max_items - q.held()[0]))


def _stored(msg: Any, ack: Any = None) -> StoredMsg:
    return StoredMsg(msg.subject, dict(msg.headers or {}), msg.data, msg.metadata.sequence.stream, ack)


@dataclasses.dataclass(frozen=True)
class StreamReader:
    """One feed's reading of `stream` into its backlog `q`, until `stopped()`; `counts` hears
    `catch_up_messages`, `catch_up_consumers` (each consumer made) and `catch_ups_done`."""

    nc: Any
    js: Any
    stream: str
    q: Backlog[QueueItem]
    stopped: Callable[[], bool]
    counts: Counter[str] = dataclasses.field(default_factory=Counter)

    async def read(self, cfg: Any, synced: Callable[[], bool]) -> None:
        """Everything from `cfg`'s start: what is stored by `catch_up`, then the tail by
        `read_ordered` (a CaughtUp in between while `synced()` is False)."""
        rest = await self.catch_up(cfg)
        if rest is not None:
            self.counts["catch_ups_done"] += 1
            if not synced():
                self.q.put(CaughtUp())
            await read_ordered(self.js, self.stream, rest, self.q, self.stopped, synced)

    async def catch_up(self, cfg: Any) -> Any:
        """Pull from `cfg`'s start on an ephemeral pull consumer (no acks) until nothing is pending;
        the config the tail goes on from (`cfg` itself if nothing was stored, else the next stream
        seq), or None when stopped first. A consumer seq that skips (a message dropped on the way),
        a request left unanswered or refused (the server restarting) starts a new consumer after
        the last message handed over."""
        from nats.js.api import AckPolicy, DeliverPolicy

        js, stream, q, stopped, counts = self.js, self.stream, self.q, self.stopped, self.counts
        pulled = dataclasses.replace(
            cfg, ack_policy=AckPolicy.NONE, inactive_threshold=INACTIVE_S, filter_subject=stream_filter(stream)
        )
        puller = _Puller(self.nc, q, counts)
        try:
            while not stopped():
                try:
                    if puller.consumer is None:
                        at = pulled
                        if puller.after is not None:
                            at = dataclasses.replace(
                                pulled,
                                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                opt_start_seq=puller.after,
                                opt_start_time=None,
                            )
                        counts["catch_up_consumers"] += 1
                        info = await js.add_consumer(stream, config=at)
                        await puller.bind(stream, str(info.name))
                    got = await puller.pull(await request_size(q, stopped), CATCH_UP_WAIT_S)
                    if puller.broken:
                        raise RuntimeError(f"catch-up request ended by {puller.broken}")
                    if got and puller.pending == 0:
                        return _from(cfg, puller.after)  # all stored when it was read is handed over
                    if not got and await _nothing_pending(js, stream, puller.consumer):
                        return _from(cfg, puller.after)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - NATS restarting: a new consumer after the last handed over
                    log.debug("catch-up: %s", exc)
                    await puller.close()
                    await asyncio.sleep(FETCH_WAIT_S)
            return None
        finally:
            await puller.close()


class _Puller:
    """Pull requests for one ephemeral consumer, answered into an inbox whose callback puts each
    message in the backlog as it arrives (nats-py's fetch waits on each message in turn)."""

    def __init__(self, nc: Any, q: Backlog[QueueItem], counts: Counter[str]) -> None:
        self.nc, self.q, self.counts = nc, q, counts
        self.consumer: str | None = None
        self.after: int | None = None  # the next stream seq once a message was handed over
        self.pending: int | None = None  # what the server had left after the last message
        self.broken = ""  # why the current consumer is not to be used again
        self._sub: Any = None
        self._next = ""
        self._inbox = ""
        self._seq = 0  # the consumer seq of the last message handed over
        self._want = self._got = 0
        self._done = asyncio.Event()

    async def bind(self, stream: str, consumer: str) -> None:
        await self.close()
        self._inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(
            self._inbox, cb=self._on_msg, pending_msgs_limit=1 << 22, pending_bytes_limit=1 << 30
        )
        self.consumer, self._next, self._seq, self.broken = (
            consumer,
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}",
            0,
            "",
        )

    async def pull(self, n: int, wait_s: float) -> int:
        """Ask for up to `n` messages, waiting at most `wait_s` for them; how many were handed over."""
        self._want, self._got = n, 0
        self._done.clear()
        body = json.dumps({"batch": n, "expires": int(wait_s * 1e9)}).encode()
        await self.nc.publish(self._next, body, reply=self._inbox)
        try:  # the server ends a request by its batch, or by a status (408 at expiry)
            await asyncio.wait_for(self._done.wait(), wait_s + REQUEST_GRACE_S)
        except asyncio.TimeoutError:
            self.broken = self.broken or "no answer"
        return self._got

    async def _on_msg(self, msg: Any) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status is not None:
            if status not in ("100", "404", "408"):  # 409: the consumer deleted, a leader change, ...
                self.broken = f"status {status} {msg.headers.get('Description', '')}".strip()
            if status != "100":
                self._done.set()
            return
        if self.broken:
            return
        md = msg.metadata
        if md.sequence.consumer != self._seq + 1:
            self.broken = "a skipped consumer seq"
            self._done.set()
            return
        self._seq, self.after, self.pending = md.sequence.consumer, md.sequence.stream + 1, md.num_pending
        self.counts["catch_up_messages"] += 1
        self.q.put(_stored(msg), len(msg.data))
        self._got += 1
        if self._got >= self._want:
            self._done.set()

    async def close(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # noqa: BLE001 - closing anyway
                pass
        self._sub, self.consumer = None, None


def _from(cfg: Any, after: int | None) -> Any:
    """`cfg`, or a config starting at stream seq `after` (the catch-up handed over what was before)."""
    from nats.js.api import ConsumerConfig, DeliverPolicy

    if after is None:
        return cfg
    return ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after)


async def _nothing_pending(js: Any, stream: str, consumer: str | None) -> bool:
    """Whether the server holds nothing more for this consumer (a request that got nothing may only
    have been slow); False when it cannot say."""
    try:
        info = await js.consumer_info(stream, consumer)
    except Exception:  # noqa: BLE001 - asked again after the next request
        return False
    return int(info.num_pending or 0) == 0


async def read_ordered(
    js: Any, stream: str, cfg: Any, q: Backlog[QueueItem], stopped: Callable[[], bool], synced: Callable[[], bool]
) -> None:
    """Everything from `cfg`'s start, on an ordered push consumer (nats-py recreates it after a gap or
    a server restart), until `stopped()`; a CaughtUp goes in each time all stored so far is handed
    over while `synced()` is False."""

    async def on_msg(msg: Any) -> None:
        await q.room(stopped)  # a full backlog holds this callback: flow control pauses the server
        q.put(_stored(msg), len(msg.data))

    sub = await js.subscribe(
        stream_filter(stream),
        cb=on_msg,
        ordered_consumer=True,
        config=cfg,
        idle_heartbeat=1.0,
        # nats-py's own buffer: a full backlog holds the callback, so flow control is answered late
        # and the server pauses; these limits only catch a server that does not (past them
        # nats-py drops, and the ordered consumer re-reads from the gap)
        pending_bytes_limit=1 << 30,
        pending_msgs_limit=1 << 22,
    )
    try:
        while not stopped():
            await asyncio.sleep(CAUGHT_UP_EVERY_S)
            if not synced():
                try:
                    ci = await sub.consumer_info()
                except Exception:  # noqa: BLE001 - asked again next turn
                    continue
                if ci.num_pending == 0 and sub.pending_msgs == 0:  # all stored so far is handed over
                    q.put(CaughtUp())
    finally:
        try:
            await sub.unsubscribe()
        except Exception:  # noqa: BLE001 - closing anyway
            pass


async def read_durable(
    js: Any, stream: str, cfg: Any, durable: str, q: Backlog[QueueItem], stopped: Callable[[], bool]
) -> None:
    """A pull consumer named `durable` (explicit acks: each StoredMsg carries its message to ack),
    fetching while the backlog has room, until `stopped()`; a server restarting is fetched again."""
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.api import AckPolicy

    cfg.durable_name = durable
    cfg.ack_policy = AckPolicy.EXPLICIT
    cfg.ack_wait = ACK_WAIT_S
    cfg.max_ack_pending = 1 << 20
    psub = None
    while not stopped():
        try:
            if psub is None:
                psub = await js.pull_subscribe(
                    stream_filter(stream),
                    durable=durable,
                    stream=stream,
                    config=cfg,
                    pending_bytes_limit=q.max_bytes,
                    pending_msgs_limit=q.max_items,
                )
            msgs = await psub.fetch(await request_size(q, stopped), timeout=FETCH_WAIT_S)
        except (NatsTimeout, asyncio.TimeoutError):
            continue
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - NATS restarting: fetch again
            log.debug("durable fetch: %s", exc)
            await asyncio.sleep(FETCH_WAIT_S)
            continue
        for msg in msgs:
            q.put(_stored(msg, msg), len(msg.data))
