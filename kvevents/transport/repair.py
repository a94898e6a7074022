"""The subscriber's repair protocol: replay, snapshot and describe requests over one DEALER per source.

One request in flight per source; timeouts recreate the DEALER (late replies die with it) and
retry with backoff; a replay that cannot fill the gap becomes a Reset plus a snapshot request,
and a snapshot that cannot be had becomes a counted clean start (schemas/README.md, "Consumer
rules"). The default wire carries no epoch, so KVE/DESCRIBE confirms it: on first contact, after
a reconnect or a stale spell, and before every gap replay; a new epoch is a restart.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import msgspec
import zmq

from kvevents.errors import DecodeError
from kvevents.events import decode_batch
from kvevents.transport.streams import Item, Request, SourceState, Stream
from kvevents.transport.wire import DESCRIBE_REQUEST, END_SEQ, SEQ, SNAPSHOT_REQUEST, SNAPSHOT_SEQ, pack_seq

__all__ = ["RepairMixin"]

log = logging.getLogger("kvevents.subscriber")

_U64 = 2**64
DESCRIBE_TIMEOUT_S = 1.0  # a publisher without KVE/DESCRIBE (vLLM, SGLang) costs this once per (re)contact


class RepairMixin:
    """Repair-request half of Subscriber (it provides counters, sockets and delivery)."""

    _counters: dict[str, int]
    request_timeout_s: float
    max_attempts: int
    clock: Callable[[], float]  # monotonic seconds: deadlines and backoff

    def _request(self, s: SourceState, st: Stream, kind: str, start: int, *, first: bool = False) -> None:
        st.busy = True
        for r in s.queue:
            if r.stream is st:
                r.kind, r.start, r.first = kind, start, first
                return
        s.queue.append(Request(st, kind, start, first))
        self._pump(s)

    def _pump(self, s: SourceState) -> None:
        if s.active is not None or not s.queue or self.clock() < s.not_before:
            return
        req = s.queue.popleft()
        dealer = s.dealer or self._new_dealer(s)
        if req.kind == "describe" or (req.kind == "replay" and not req.first and s.can_describe and not req.describing):
            self._counters["describes_requested"] += 1
            req.describing = True
            dealer.send_multipart([b"", DESCRIBE_REQUEST], zmq.NOBLOCK)
            req.deadline = self.clock() + min(self.request_timeout_s, DESCRIBE_TIMEOUT_S)
            s.active = req
            return
        if req.kind == "replay":
            self._counters["replays_requested"] += 1
            dealer.send_multipart([b"", pack_seq(req.start)], zmq.NOBLOCK)
        else:
            self._counters["snapshots_requested"] += 1
            req.stream.snapshot = []
            dealer.send_multipart([b"", SNAPSHOT_REQUEST], zmq.NOBLOCK)
        req.deadline = self.clock() + self.request_timeout_s
        s.active = req

    def _on_timeout(self, s: SourceState) -> None:
        req = s.active
        assert req is not None
        s.active = None
        self._drop_dealer(s)
        st = req.stream
        if req.describing:
            return self._describe_unanswered(s, req)
        self._counters["replay_timeouts"] += 1
        if req.superseded:
            return
        req.attempts += 1
        s.not_before = self.clock() + min(5.0, 0.1 * 2**req.attempts)
        if req.attempts < self.max_attempts:
            log.info("source %s: %s request timed out, retrying (%d)", s.name, req.kind, req.attempts)
            s.queue.appendleft(req)
            return
        if req.kind == "replay":
            self._unrecoverable(s, st, req.first)
        else:
            self._snapshot_failed(s, st)

    def _unrecoverable(self, s: SourceState, st: Stream, first: bool) -> None:
        self._counters["unrecoverable_gaps"] += 1
        self._emit_reset(s, st, "first" if first else "gap")
        st.next_seq = None
        self._request(s, st, "snapshot", 0)

    def _snapshot_failed(self, s: SourceState, st: Stream) -> None:
        log.warning("source %s rank %s: no snapshot, starting clean (state lost)", s.name, st.rank)
        self._counters["snapshot_failures"] += 1
        self._counters["losses"] += 1
        st.next_seq = None
        st.clean_start = True
        self._drain(s, st)

    def _describe_unanswered(self, s: SourceState, req: Request) -> None:
        """No DESCRIBE reply: a publisher without it (vLLM, SGLang). Go on without; seqs find restarts."""
        self._counters["describe_timeouts"] += 1
        log.info("source %s: no KVE/DESCRIBE reply; restarts are found by seqs going backwards only", s.name)
        s.describes = False
        req.describing = False
        if req.superseded:
            return
        if req.kind == "replay":
            s.queue.appendleft(req)  # the replay itself, at once
            return
        req.stream.verified = True  # nothing to confirm it with
        self._drain(s, req.stream)

    def _on_describe(self, s: SourceState, req: Request, payload: bytes) -> None:
        """A DESCRIBE reply: a new epoch is a restart (Reset, then snapshot); else go on."""
        try:
            info = msgspec.msgpack.decode(payload)
            epoch = info.get("epoch") if isinstance(info, dict) else None
            if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int)):
                raise ValueError(f"epoch is {type(epoch).__name__}")
        except (msgspec.DecodeError, ValueError) as exc:
            self._bad(f"source {s.name}: undecodable KVE/DESCRIBE reply", str(exc))
            epoch = None
        s.describes = True
        st = req.stream
        req.describing = False
        if req.superseded:
            s.active = None
            self._pump(s)
            return
        st.verified = True
        if st.epoch is not None and epoch is not None and epoch != st.epoch:
            s.active = None
            s.not_before = 0.0
            self._counters["restarts"] += 1
            log.info("source %s rank %s: new epoch %s (was %s): the publisher restarted", s.name, st.rank, epoch, st.epoch)
            self._restart(s, st, epoch, "restart", 1)
            self._pump(s)
            return
        if epoch is not None:
            st.epoch = epoch
        if req.kind == "replay":  # the epoch holds: now the replay itself
            assert s.dealer is not None
            self._counters["replays_requested"] += 1
            s.dealer.send_multipart([b"", pack_seq(req.start)], zmq.NOBLOCK)
            req.deadline = self.clock() + self.request_timeout_s
            return
        s.active = None
        s.not_before = 0.0
        self._drain(s, st)
        self._pump(s)

    def _on_reply(self, s: SourceState, frames: list[bytes]) -> None:
        req = s.active
        s.heard(time.time(), self.clock())
        if req is not None and req.describing and len(frames) == 2 and frames[0] == b"":
            return self._on_describe(s, req, frames[1])
        if req is None or req.describing or len(frames) != 4 or frames[0] != b"":
            return self._bad(f"source {s.name}: unexpected replay reply", f"{len(frames)} frames", "bad_frames")
        st = req.stream
        req.deadline = self.clock() + self.request_timeout_s  # progress extends the deadline
        _, topic_b, seq_b, payload = frames
        if seq_b == END_SEQ:
            return self._finish(s, req, payload)
        if req.aborting:
            return
        if req.kind == "snapshot":
            if seq_b != SNAPSHOT_SEQ:
                return self._bad(f"source {s.name}: snapshot reply with seq {seq_b.hex()}", "", "bad_frames")
            try:
                batch = decode_batch(payload)
            except DecodeError as exc:
                req.aborting = req.failed = True
                return self._bad(f"source {s.name}: undecodable snapshot batch", str(exc))
            st.snapshot.append(Item(0, topic_b, payload, batch, time.time()))
            return
        if len(seq_b) != 8:
            return self._bad(f"source {s.name}: replay reply seq of {len(seq_b)} bytes", "", "bad_frames")
        seq = SEQ.unpack(seq_b)[0]
        first_reply = not req.got_any
        req.got_any = True
        if first_reply and seq > req.start:
            req.aborting = req.failed = True  # the publisher no longer keeps next_seq
            return
        try:
            batch = decode_batch(payload)
        except DecodeError as exc:
            self._bad(f"source {s.name}: undecodable replayed payload", str(exc))
            if st.next_seq is not None and seq == st.next_seq:
                st.next_seq += 1  # it will never decode: skip it, counted
            return
        if req.first and st.next_seq is None:
            if batch.epoch is not None:
                st.epoch = batch.epoch
            st.next_seq = req.start
        if batch.epoch is not None and st.epoch is not None and batch.epoch != st.epoch:
            req.aborting = True  # the publisher restarted meanwhile: resync when this reply ends
            req.new_epoch = batch.epoch
            return
        assert st.next_seq is not None
        if seq < st.next_seq:
            self._counters["duplicates"] += 1
            return
        if seq > st.next_seq:
            req.aborting = req.failed = True  # a hole inside the ring (dropped batches)
            return
        self._deliver(s, st, Item(seq, topic_b, payload, batch, time.time()), "replay")
        st.next_seq = seq + 1

    def _finish(self, s: SourceState, req: Request, last: bytes) -> None:
        s.active = None
        s.not_before = 0.0
        st = req.stream
        if req.superseded:
            self._pump(s)
            return
        if req.new_epoch is not None:
            self._counters["restarts"] += 1
            self._restart(s, st, req.new_epoch, "restart", 1)  # type: ignore[attr-defined]
            self._pump(s)
            return
        if req.kind == "snapshot":
            if req.failed or len(last) != 8:
                self._snapshot_failed(s, st)
            else:
                S = SEQ.unpack(last)[0]
                for it in st.snapshot:
                    self._deliver(s, st, it, "snapshot", seq=S)
                if st.snapshot and st.snapshot[0].batch.epoch is not None:
                    st.epoch = st.snapshot[0].batch.epoch
                st.snapshot = []
                st.next_seq = (S + 1) % _U64
                self._counters["snapshots_applied"] += 1
                self._drain(s, st)
        elif req.failed or (
            not req.got_any and st.buffer and st.next_seq is not None and st.buffer[0].seq > st.next_seq
        ) or (req.first and not req.got_any):
            self._unrecoverable(s, st, req.first)
        else:
            self._drain(s, st)
        self._pump(s)
