"""The publisher's ROUTER side: replay, KVE/SNAPSHOT and KVE/DESCRIBE, served in slices.

Runs on the publisher's service thread only. Replies are generated lazily and sent a slice at a
time with ROUTER_MANDATORY, so a slow requester is back-pressured (EAGAIN: try again later)
instead of losing replies, and live publishing (caller threads) never waits on it.

Request rule (schemas/README.md, "Transport in one page"): a body of exactly 8 bytes is always a
replay start (vLLM clients send only that), whatever its bytes; project commands (KVE/SNAPSHOT,
KVE/DESCRIBE) are matched by name and are never 8 bytes long (wire.COMMANDS, checked at import);
anything else gets no reply.

No peer can starve the others or grow the publisher's memory (issue 18):
- a peer (ROUTER identity) holds at most `replay_jobs_per_peer` replay/snapshot jobs, all peers at
  most `replay_max_jobs`; a peer's jobs are served one after the other and peers round-robin;
- a job must be drained within `replay_job_timeout_s` of its start, else the peer loses it (and
  its queued ones): `jobs_expired`; when every slot is taken, a peer whose queue has been full
  for STALL_EVICT_S (it took nothing) loses its jobs to a newcomer (counted the same);
  a peer that lost its jobs either way is refused for PENALTY_S (`rejected_peer_cap`), so never-
  reading identities cannot churn the slots among themselves;
- KVE/DESCRIBE is answered inline (one non-blocking send) and never becomes a job; a peer is
  answered at most DESCRIBE_BURST at once and DESCRIBE_RATE_PER_S a second after that (a token
  bucket per identity, kvevents.zeromq.ratelimit), the rest get no reply (`rejected_describe_rate`),
  so a flood costs a receive and a dict lookup per request, not an answer;
- frames over MAX_FRAME_BYTES drop the peer's connection inside ZeroMQ, unread (MAXMSGSIZE, set
  by `prepare_router_socket` before the bind);
  ZeroMQ delivers a multipart message only whole and MAXMSGSIZE bounds frames, not messages, so
  a request of more than 3 frames is read and discarded frame by frame, never kept
  (`rejected_oversized`), and RCVHWM bounds how many requests a peer can queue;
- every turn of the service thread stops after TURN_BUDGET_S of work and then sleeps YIELD_S, so
  a flood never holds the interpreter long enough to delay a caller's `publish()`.
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import logging
import time
from collections import deque
from typing import Any, Callable, Iterator, Protocol

import msgspec
import zmq

from kvevents.events import BatchEncoder
from kvevents.zeromq.publisher_config import PublisherConfig
from kvevents.zeromq.ratelimit import PeerRateLimiter
from kvevents.zeromq.view import FrozenView, snapshot_batches
from kvevents.zeromq.wire import (
    DESCRIBE_REQUEST,
    END_SEQ,
    SEQ,
    SNAPSHOT_REQUEST,
    SNAPSHOT_SEQ,
    pack_seq,
)


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None elsewhere (then freed memory returns when the allocator decides)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return None


_malloc_trim = _load_malloc_trim()


class ReplaySource(Protocol):
    """What the ROUTER side reads of its publisher (kvevents.zeromq.publisher.Publisher is one)."""

    config: PublisherConfig

    def count(self, key: str, n: int = 1) -> None: ...

    def ring_items(self) -> list[tuple[int, bytes, bytes]]: ...

    @property
    def topic_bytes(self) -> bytes: ...

    def freeze_view(self) -> tuple[FrozenView, int]: ...

    def batch_ids(self) -> tuple[int | None, int | None]: ...

    def describe(self) -> dict[str, Any]: ...


__all__ = [
    "ReplayServer",
    "ReplaySource",
    "prepare_router_socket",
    "ROUTER_COUNTERS",
    "MAX_FRAME_BYTES",
    "MAX_REQUEST_BYTES",
]

log = logging.getLogger("kvevents.zeromq.publisher")

SLICE = 64  # messages sent per job per turn
SNAPSHOT_BLOCKS_PER_BATCH = 512
MAX_FRAME_BYTES = 512  # ZeroMQ drops a peer sending a bigger frame (a 255-byte routing id still fits)
MAX_REQUEST_BYTES = 256  # a request body longer than this is refused (the longest valid one is 12)
STALL_EVICT_S = 1.0  # with every slot taken, a job whose peer took nothing this long yields to a newcomer
PENALTY_S = 5.0  # a peer that lost its jobs (deadline, eviction) is refused this long
MAX_PENALIZED = 4096  # identities remembered for that (oldest forgotten first)
REQUEST_HWM = 2  # requests a peer can queue in ZeroMQ before its connection is back-pressured
TURN_BUDGET_S = 0.0003  # work per handle_requests() / step() call before yielding the interpreter
YIELD_S = 0.0003  # the pause after a turn that ran out of budget (lets caller threads take the GIL)
DESCRIBE_RATE_PER_S = 10.0  # KVE/DESCRIBE answers per second per peer, after its burst (a consumer asks
DESCRIBE_BURST = 20  # one per start, restart or gap: far below this)
FLOOD_PAUSE_S = 0.002  # the pause after a turn that read only DESCRIBEs over their rate

#: Counters this module adds to Publisher.stats() (written by the service thread only).
ROUTER_COUNTERS = ("rejected_peer_cap", "rejected_oversized", "jobs_expired", "rejected_describe_rate")


def prepare_router_socket(sock: zmq.Socket) -> None:
    """The ROUTER's request limits. Call it before bind: a listener copies the socket's options
    when it is bound, and its connections get those (set later, they would not apply)."""
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.setsockopt(zmq.RCVHWM, REQUEST_HWM)


class _Job:
    __slots__ = ("ident", "frames", "pending", "kind", "deadline", "last_sent")

    def __init__(self, ident: bytes, frames: Iterator[list[bytes]], kind: str) -> None:
        self.ident = ident
        self.frames = frames
        self.pending: list[bytes] | None = None
        self.kind = kind
        self.deadline: float | None = None  # set when it starts streaming
        self.last_sent = 0.0  # when its peer last took a message (or the start)


class ReplayServer:
    """Parses ROUTER requests and streams their replies; the owner calls `handle_requests()` and
    `step()` in a loop. `clock` (monotonic seconds) is injectable for the job deadlines and the
    DESCRIBE rate limit (`describe_rate_per_s` answers a second per peer after `describe_burst`)."""

    def __init__(
        self,
        pub: ReplaySource,
        sock: zmq.Socket,
        *,
        clock: Callable[[], float] = time.monotonic,
        describe_rate_per_s: float = DESCRIBE_RATE_PER_S,
        describe_burst: int = DESCRIBE_BURST,
    ) -> None:
        self.pub = pub
        self.sock = sock
        cfg = pub.config
        self.max_jobs: int = cfg.replay_max_jobs
        self.jobs_per_peer: int = cfg.replay_jobs_per_peer
        self.job_timeout_s: float = cfg.replay_job_timeout_s
        self.clock = clock
        self.peers: dict[bytes, deque[_Job]] = {}  # dict order is the round-robin order
        self.jobs = 0  # jobs held, all peers (truthy while there is work)
        self.penalized: dict[bytes, float] = {}  # peer -> until when its requests are refused
        self.blocked = False  # the last turn sent nothing (every peer full): retry after a short pause
        self._discarding = False  # inside an oversized request: its remaining frames are dropped
        self._trim_due = False  # an oversized request was dropped since the last malloc_trim
        self._enc = BatchEncoder(cfg.event_encoding)
        self._describe_enc = msgspec.msgpack.Encoder()
        self.describe_limiter = PeerRateLimiter(describe_rate_per_s, describe_burst, clock=clock)
        self._over_rate = 0  # DESCRIBEs refused over their rate in this turn

    # ------------------------------------------------------------ requests
    def handle_requests(self, limit: int = 64) -> int:
        """Receive and dispatch up to `limit` queued requests without blocking (and within the
        turn's time budget); returns the number of messages read."""
        n = 0
        self._over_rate = 0
        sock = self.sock
        stop_at = time.perf_counter() + TURN_BUDGET_S
        while True:
            if self._discarding and not self._discard(stop_at):
                break  # out of budget inside an oversized request: go on next turn
            if n >= limit or time.perf_counter() >= stop_at:
                break
            try:
                frame = sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self._maybe_trim()
                return n
            n += 1
            frames = [frame]
            while len(frames) < 3 and frame.more:
                frame = sock.recv(zmq.NOBLOCK, copy=False)  # parts of a message arrive together
                frames.append(frame)
            if frame.more:  # a 4th frame: the request is refused and the rest dropped unread
                self._reject("rejected_oversized", "more than 3 frames")
                self._discarding = True
            elif len(frames) == 3 and len(frames[2]) > MAX_REQUEST_BYTES:
                self._reject("rejected_oversized", f"body of {len(frames[2])} bytes")
            else:
                self._dispatch([f.bytes for f in frames])
        self._maybe_trim()
        # stopped with requests possibly left: let caller threads run first; a turn of nothing but
        # DESCRIBEs over their rate is a flood, which waits longer (ZeroMQ queues the others' requests)
        flood = n > 0 and self._over_rate == n
        self._over_rate = 0
        self._yield(FLOOD_PAUSE_S if flood else YIELD_S)
        return n

    def _discard(self, stop_at: float) -> bool:
        """Drop the current oversized request's frames one at a time (nothing is kept) until its
        last frame or the end of the turn's budget; True once it is gone."""
        sock = self.sock
        n = 0
        while True:
            if not sock.recv(zmq.NOBLOCK, copy=False).more:
                break
            n += 1
            if not n % 64 and time.perf_counter() >= stop_at:
                return False
        self._discarding = False
        self._trim_due = True
        return True

    def _maybe_trim(self) -> None:
        """After oversized requests, once the socket is drained, hand freed memory back to the
        system (glibc keeps ZeroMQ's freed frames otherwise: RSS would stay at the peak)."""
        if not self._trim_due or int(self.sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            return  # nothing dropped, or more requests are queued (the flood goes on)
        self._trim_due = False
        if _malloc_trim is not None:
            _malloc_trim(0)  # ctypes releases the GIL for the call

    def _reject(self, key: str | None, why: str) -> None:
        self.pub.count("rejected_requests")
        if key is not None:
            self.pub.count(key)
        log.debug("ROUTER request rejected: %s", why)

    def _dispatch(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or frames[1] != b"":
            return self._reject(None, f"{len(frames)} frames")
        ident, body = frames[0], frames[2]
        if len(body) == 8:
            if self._admit(ident):
                self.pub.count("replay_requests")
                self._add(_Job(ident, self._replay(ident, SEQ.unpack(body)[0]), "replay"))
        elif body == SNAPSHOT_REQUEST:
            if not self.pub.config.snapshots:
                return self._reject(None, "KVE/SNAPSHOT: snapshots are off (PublisherConfig.snapshots=False)")
            if self._admit(ident):
                self.pub.count("snapshot_requests")
                self._add(_Job(ident, self._snapshot(ident), "snapshot"))
        elif body == DESCRIBE_REQUEST:
            if not self.describe_limiter.allow(ident):
                self._over_rate += 1
                return self._reject("rejected_describe_rate", "KVE/DESCRIBE over the peer's rate")
            self.pub.count("describe_requests")
            self._send_now([ident, b"", self.describe_payload()], "describe")
        else:
            self._reject(None, f"unknown request of {len(body)} bytes")

    def _admit(self, ident: bytes) -> bool:
        """Room for one more job of this peer? (counted as rejected when not). With every slot
        taken, a peer that does not read (its queue full, nothing taken for STALL_EVICT_S) loses
        its jobs to the newcomer: identities that never read cannot keep replay closed until their
        deadlines."""
        held = self.peers.get(ident)
        if held is not None and len(held) >= self.jobs_per_peer:
            self._reject("rejected_peer_cap", f"peer holds {len(held)} jobs")
            return False
        until = self.penalized.get(ident)
        if until is not None:
            if self.clock() < until:
                self._reject("rejected_peer_cap", "peer lost a job for not draining it: refused a while")
                return False
            del self.penalized[ident]
        if self.jobs >= self.max_jobs:
            stalled = self._most_stalled()
            if stalled is None:
                self._reject(None, "too many jobs")
                return False
            self._expire(stalled)
        return True

    def _most_stalled(self) -> bytes | None:
        """The peer whose current job has found its queue full for longest, if for at least
        STALL_EVICT_S (a peer that does not read)."""
        limit = self.clock() - STALL_EVICT_S
        best: tuple[float, bytes] | None = None
        for ident, queue in self.peers.items():
            job = queue[0]
            if job.pending is not None and job.last_sent <= limit and (best is None or job.last_sent < best[0]):
                best = (job.last_sent, ident)
        return None if best is None else best[1]

    def _add(self, job: _Job) -> None:
        self.peers.setdefault(job.ident, deque()).append(job)
        self.jobs += 1

    def _send_now(self, msg: list[bytes], kind: str) -> None:
        """One reply, sent at once or not at all (a full or gone peer loses it, counted)."""
        try:
            self.sock.send_multipart(msg, zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # EAGAIN (its pipe is full) or EHOSTUNREACH (gone)
            log.debug("ROUTER %s reply not sent: %s", kind, exc)
            self.pub.count("replies_abandoned")
            return
        self.pub.count("bytes_sent", len(msg[2]))

    # ------------------------------------------------------------ reply generators
    def _replay(self, ident: bytes, start: int) -> Iterator[list[bytes]]:
        items = self.pub.ring_items()
        idx = bisect.bisect_left(items, start, key=lambda it: it[0])
        topic = self.pub.topic_bytes
        for i in range(idx, len(items)):
            _, seq_b, payload = items[i]
            self.pub.count("replay_batches_sent")
            yield [ident, b"", topic, seq_b, payload]
        yield [ident, b"", b"", END_SEQ, b""]

    def _snapshot(self, ident: bytes) -> Iterator[list[bytes]]:
        frozen, last_seq = self.pub.freeze_view()
        topic = self.pub.topic_bytes
        rank, epoch = self.pub.batch_ids()
        for events in snapshot_batches(frozen, SNAPSHOT_BLOCKS_PER_BATCH):
            payload = self._enc.encode(time.time(), events, rank, epoch)
            self.pub.count("snapshot_batches_sent")
            yield [ident, b"", topic, SNAPSHOT_SEQ, payload]
        # S = -1 (nothing published yet) is sent as ff..ff: S + 1 wraps to 0, where to resume.
        yield [ident, b"", b"", END_SEQ, pack_seq(last_seq) if last_seq >= 0 else END_SEQ]

    def describe_payload(self) -> bytes:
        return self._describe_enc.encode(self.pub.describe())

    # ------------------------------------------------------------ streaming
    def step(self) -> None:
        """A slice of each peer's current job, peers in turn, within the turn's budget; a job
        whose peer is full (EAGAIN) keeps its message, one past its deadline is dropped."""
        now = self.clock()
        stop_at = time.perf_counter() + TURN_BUDGET_S
        sent_any = False
        out_of_budget = False
        for ident in list(self.peers):
            queue = self.peers[ident]
            job = queue[0]
            if job.deadline is None:
                job.deadline = now + self.job_timeout_s
                job.last_sent = now
            elif now >= job.deadline:
                self._expire(ident)
                continue
            sent, finished = self._send_slice(job)
            if sent:
                job.last_sent = now
            sent_any = sent_any or sent > 0
            if finished:
                queue.popleft()
                self.jobs -= 1
                if not queue:
                    del self.peers[ident]
                    continue
            self.peers[ident] = self.peers.pop(ident)  # served: to the back of the round
            if time.perf_counter() >= stop_at:
                out_of_budget = True
                break
        self.blocked = not sent_any and bool(self.jobs)
        if out_of_budget:
            self._yield()

    def _send_slice(self, job: _Job) -> tuple[int, bool]:
        """Up to SLICE messages of `job`; returns (messages sent, job finished or abandoned)."""
        sent = 0
        for _ in range(SLICE):
            msg = job.pending
            if msg is None:
                msg = next(job.frames, None)
                if msg is None:
                    self._served(job)
                    return sent, True
            try:
                self.sock.send_multipart(msg, zmq.NOBLOCK)
            except zmq.Again:
                job.pending = msg
                return sent, False
            except zmq.ZMQError as exc:  # EHOSTUNREACH: the requester went away
                log.debug("ROUTER peer gone during %s: %s", job.kind, exc)
                self.pub.count("replies_abandoned")
                return sent, True
            job.pending = None
            sent += 1
            self.pub.count("bytes_sent", sum(len(f) for f in msg[2:]))
        return sent, False

    def _served(self, job: _Job) -> None:
        if job.kind == "snapshot":
            self.pub.count("snapshots_served")
        else:
            self.pub.count("replays_served")

    def _expire(self, ident: bytes) -> None:
        """The peer did not drain its job in time: it loses it and every job it has queued."""
        queue = self.peers.pop(ident)
        self.jobs -= len(queue)
        if len(self.penalized) >= MAX_PENALIZED:
            self.penalized.pop(next(iter(self.penalized)))  # the oldest entry goes
        self.penalized[ident] = self.clock() + PENALTY_S
        self.pub.count("jobs_expired", len(queue))
        self.pub.count("replies_abandoned", len(queue))
        log.debug("ROUTER peer did not drain within %.1fs: %d job(s) dropped", self.job_timeout_s, len(queue))

    @staticmethod
    def _yield(pause: float = YIELD_S) -> None:
        """Out of budget with work left: sleep a moment, so a caller thread waiting for the
        interpreter gets it now rather than after the switch interval (5 ms)."""
        time.sleep(pause)
