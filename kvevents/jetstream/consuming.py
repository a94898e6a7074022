"""The feed's two ways of reading its stream into its backlog: an ordered push consumer (the default)
and a durable pull consumer (`durable=`, acknowledged once deliveries are consumed).

Both hold back when the backlog is full (`Backlog.room`), so a slow `poll()` side slows the server,
never loses a message: the push callback answers flow control late, the pull loop fetches no more
than there is room for.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from kvevents.jetstream.backlog import Backlog
from kvevents.jetstream.link import stream_filter
from kvevents.jetstream.messages import CaughtUp, QueueItem, StoredMsg

__all__ = ["read_durable", "read_ordered"]

log = logging.getLogger("kvevents.jetstream")

FETCH_BATCH = 512  # messages one pull asks for (fewer when the backlog holds fewer items)
FETCH_WAIT_S = 0.5
ACK_WAIT_S = 30.0  # the server redelivers what is not acknowledged in this long
CAUGHT_UP_EVERY_S = 0.2  # how often an ordered reader not synced yet asks whether it is caught up


def _stored(msg: Any, ack: Any = None) -> StoredMsg:
    return StoredMsg(msg.subject, dict(msg.headers or {}), msg.data, msg.metadata.sequence.stream, ack)


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
            await q.room(stopped)  # fetch no more than the poll side has room for
            msgs = await psub.fetch(min(FETCH_BATCH, q.max_items), timeout=FETCH_WAIT_S)
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
