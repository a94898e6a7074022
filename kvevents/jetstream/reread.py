"""Reading what a stream holds on one subject filter, start to end, on the feed's NATS loop (and its
info, once a bridge has made it): the cold start's stored snapshots, and a repair's re-read of one source's live batches from a stream
position on (delivered once already, on a state that turned out wrong).

Each read is an ordered push consumer, dropped once nothing more is pending.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from kvevents.jetstream.link import stream_filter
from kvevents.jetstream.messages import StoredMsg

__all__ = ["read_all", "read_subject", "stream_info"]

log = logging.getLogger("kvevents.jetstream")


async def stream_info(js: Any, stream: str) -> Any:
    """The stream's info (with its subjects), waiting for a bridge to create the stream."""
    from nats.js.errors import NotFoundError

    waited = False
    while True:
        try:
            return await js.stream_info(stream, subjects_filter=stream_filter(stream))
        except NotFoundError:
            if not waited:
                log.warning("JetStream stream %s not found yet; waiting for a bridge to create it", stream)
                waited = True
        except Exception as exc:  # noqa: BLE001 - NATS restarting: retry
            log.debug("stream info: %s", exc)
        await asyncio.sleep(0.5)


async def _until_done(sub: Any, done: asyncio.Event, stop: Callable[[], bool], timeout_s: float | None) -> None:
    """Wait for `done`, or for the consumer to have nothing left (e.g. purged meanwhile); then unsubscribe."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    try:
        while not done.is_set() and not stop():
            try:
                await asyncio.wait_for(done.wait(), 0.5)
            except asyncio.TimeoutError:
                info = await sub.consumer_info()
                if info.num_pending == 0 and sub.pending_msgs == 0:
                    break
                if deadline is not None and loop.time() >= deadline:
                    raise
    finally:
        await sub.unsubscribe()


async def read_all(js: Any, subjects: str, *, stop: Callable[[], bool] = lambda: False) -> list[StoredMsg]:
    """Every message stored on `subjects` (a filter), in stream order."""
    from nats.js.api import DeliverPolicy

    out: list[StoredMsg] = []
    done = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        md = msg.metadata
        out.append(StoredMsg(msg.subject, dict(msg.headers or {}), msg.data, md.sequence.stream))
        if md.num_pending == 0:
            done.set()

    sub = await js.subscribe(
        subjects,
        cb=on_msg,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.ALL,
        idle_heartbeat=1.0,
        pending_bytes_limit=1 << 30,
        pending_msgs_limit=1 << 22,
    )
    await _until_done(sub, done, stop, None)
    return out


async def read_subject(
    js: Any, subject: str, *, start_seq: int, upto_seq: int, timeout_s: float = 10.0, limit: int = 1 << 20
) -> list[StoredMsg]:
    """The messages stored on `subject` at stream seqs start_seq..upto_seq, in order (at most `limit`);
    asyncio.TimeoutError after `timeout_s`."""
    from nats.js.api import ConsumerConfig, DeliverPolicy

    out: list[StoredMsg] = []
    if upto_seq < start_seq:
        return out
    done = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        md = msg.metadata
        sseq = md.sequence.stream
        if sseq <= upto_seq and len(out) < limit:
            out.append(StoredMsg(msg.subject, dict(msg.headers or {}), msg.data, sseq))
        if sseq >= upto_seq or md.num_pending == 0 or len(out) >= limit:
            done.set()

    cfg = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, start_seq))
    sub = await js.subscribe(
        subject, cb=on_msg, ordered_consumer=True, config=cfg, idle_heartbeat=1.0, pending_msgs_limit=1 << 20
    )
    await _until_done(sub, done, lambda: False, timeout_s)
    return out
