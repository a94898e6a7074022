"""The publisher's ROUTER side: replay, KVE/SNAPSHOT and KVE/DESCRIBE, served in slices.

Runs on the publisher's service thread only. Replies are generated lazily and sent a slice at a
time with ROUTER_MANDATORY, so a slow requester is back-pressured (EAGAIN: try again later)
instead of losing replies, and live publishing (caller threads) never waits on it.

Request rule (SPEC 8): a body of exactly 8 bytes is always a replay start (vLLM clients send only
that), whatever its bytes; project commands (KVE/SNAPSHOT, KVE/DESCRIBE) are matched by name and
must never be 8 bytes long (wire.COMMANDS, checked at import); anything else gets no reply.
"""

from __future__ import annotations

import bisect
import logging
import time
from typing import TYPE_CHECKING, Iterator

import msgspec
import zmq

from kvevents.events import BatchEncoder
from kvevents.transport.view import snapshot_batches
from kvevents.transport.wire import (
    DESCRIBE_REQUEST,
    END_SEQ,
    HASH_SCHEME,
    SCHEMA_VERSION,
    SEQ,
    SNAPSHOT_REQUEST,
    SNAPSHOT_SEQ,
    pack_seq,
)

if TYPE_CHECKING:  # pragma: no cover
    from kvevents.publisher import Publisher

__all__ = ["RouterService", "describe"]

log = logging.getLogger("kvevents.publisher")

MAX_JOBS = 64  # concurrent replay/snapshot streams; more requests are rejected (counted)
SLICE = 64  # messages sent per job per service-loop turn
SNAPSHOT_BLOCKS_PER_BATCH = 512


def describe(pub: "Publisher") -> dict:
    """What KVE/DESCRIBE answers (SPEC section 8): one map, None where nothing is known yet."""
    newest, oldest = pub._seq_range()
    return {
        "schema_version": SCHEMA_VERSION,
        "hash_scheme": HASH_SCHEME,
        "page_size": pub._view.page_size,
        "epoch": pub._stream_id[1],
        "topic": pub.config.topic,
        "dp_rank": pub.config.dp_rank,
        "newest_seq": newest,
        "oldest_replayable_seq": oldest,
        "event_encoding": pub.config.event_encoding,
    }


class _Job:
    __slots__ = ("ident", "frames", "pending", "kind", "abandoned")

    def __init__(self, ident: bytes, frames: Iterator[list[bytes]], kind: str) -> None:
        self.ident = ident
        self.frames = frames
        self.pending: list[bytes] | None = None
        self.kind = kind
        self.abandoned = False  # the peer went away: counted as abandoned, not as served


class RouterService:
    """Parses ROUTER requests and streams their replies; the owner calls `step()` in a loop."""

    def __init__(self, pub: "Publisher", sock: zmq.Socket) -> None:
        self.pub = pub
        self.sock = sock
        self.jobs: list[_Job] = []
        self.blocked = False  # the last turn hit EAGAIN somewhere: retry after a short pause
        self._enc = BatchEncoder(pub.config.event_encoding)
        self._describe_enc = msgspec.msgpack.Encoder()

    # ------------------------------------------------------------ requests
    def handle_requests(self, limit: int = 256) -> int:
        """Receive and dispatch up to `limit` queued requests without blocking."""
        n = 0
        while n < limit:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            n += 1
            self._dispatch(frames)
        return n

    def _reject(self, why: str) -> None:
        self.pub._count("rejected_requests")
        log.debug("ROUTER request rejected: %s", why)

    def _dispatch(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or frames[1] != b"":
            return self._reject(f"{len(frames)} frames")
        ident, body = frames[0], frames[2]
        if len(body) == 8:
            if len(self.jobs) >= MAX_JOBS:
                return self._reject("too many jobs")
            self.pub._count("replay_requests")
            self.jobs.append(_Job(ident, self._replay(ident, SEQ.unpack(body)[0]), "replay"))
        elif body == SNAPSHOT_REQUEST:
            if not self.pub.config.snapshots:
                return self._reject("KVE/SNAPSHOT: snapshots are off (PublisherConfig.snapshots=False)")
            if len(self.jobs) >= MAX_JOBS:
                return self._reject("too many jobs")
            self.pub._count("snapshot_requests")
            self.jobs.append(_Job(ident, self._snapshot(ident), "snapshot"))
        elif body == DESCRIBE_REQUEST:
            self.pub._count("describe_requests")
            self.jobs.append(_Job(ident, iter([[ident, b"", self.describe_payload()]]), "describe"))
        else:
            self._reject(f"unknown request of {len(body)} bytes")

    # ------------------------------------------------------------ reply generators
    def _replay(self, ident: bytes, start: int) -> Iterator[list[bytes]]:
        items = self.pub._ring_items()
        idx = bisect.bisect_left(items, start, key=lambda it: it[0])
        topic = self.pub._topic_b
        for i in range(idx, len(items)):
            _, seq_b, payload = items[i]
            self.pub._count("replay_batches_sent")
            yield [ident, b"", topic, seq_b, payload]
        yield [ident, b"", b"", END_SEQ, b""]

    def _snapshot(self, ident: bytes) -> Iterator[list[bytes]]:
        frozen, last_seq = self.pub._freeze_view()
        topic = self.pub._topic_b
        rank, epoch = self.pub._stream_id
        for events in snapshot_batches(frozen, SNAPSHOT_BLOCKS_PER_BATCH):
            payload = self._enc.encode(time.time(), events, rank, epoch)
            self.pub._count("snapshot_batches_sent")
            yield [ident, b"", topic, SNAPSHOT_SEQ, payload]
        # S = -1 (nothing published yet) is sent as ff..ff: S + 1 wraps to 0, where to resume.
        yield [ident, b"", b"", END_SEQ, pack_seq(last_seq) if last_seq >= 0 else END_SEQ]

    def describe_payload(self) -> bytes:
        return self._describe_enc.encode(describe(self.pub))

    # ------------------------------------------------------------ streaming
    def step(self) -> None:
        """Send one slice of every job; a job whose peer is full (EAGAIN) keeps its message."""
        self.blocked = False
        done: list[_Job] = []
        for job in self.jobs:
            for _ in range(SLICE):
                msg = job.pending
                if msg is None:
                    msg = next(job.frames, None)
                    if msg is None:
                        done.append(job)
                        break
                try:
                    self.sock.send_multipart(msg, zmq.NOBLOCK)
                except zmq.Again:
                    job.pending = msg
                    self.blocked = True
                    break
                except zmq.ZMQError as exc:  # EHOSTUNREACH: the requester went away
                    log.debug("ROUTER peer gone during %s: %s", job.kind, exc)
                    self.pub._count("replies_abandoned")
                    job.abandoned = True
                    done.append(job)
                    break
                job.pending = None
                self.pub._count("bytes_sent", sum(len(f) for f in msg[2:]))
        for job in done:
            self.jobs.remove(job)
            if job.abandoned:
                continue
            if job.kind == "snapshot":
                self.pub._count("snapshots_served")
            elif job.kind == "replay":
                self.pub._count("replays_served")
