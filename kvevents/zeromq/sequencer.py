"""The subscriber's brain: per-(source, dp_rank) sequencing and repair as a pure state machine.

Input: live frames, DEALER reply frames and connection events, each tagged with a source name,
and time from an injectable monotonic clock. Output: `Delivery` and `Reset` objects in per-stream
order, and commands for the socket loop (`Send` a request body on a source's DEALER, `DropDealer`
so that a timed-out request's late replies die with it). No sockets, threads or sleeps here, so
gap, replay, stale and restart logic is tested step by step (kvevents.zeromq.subscriber runs the sockets).

Rules (schemas/README.md, "Transport in one page"): one request in flight per source; timeouts
retry with backoff (both kept by kvevents.zeromq.repair_queue, which hands failures back here); a
replay that cannot fill a gap becomes a Reset plus a snapshot request, and a snapshot that cannot
be had a counted clean start. The default wire carries no epoch, so
KVE/DESCRIBE confirms it: on first contact, after a reconnect or a stale spell, and before every
gap replay; a new epoch (or a seq going backwards) is a restart.

Replies come in either replay framing (zeromq.framing), read per reply; the one a source
uses is shown in `status()`. No repair may hold the live stream hostage: a reply in neither form,
or a request not finished within `request_budget_s` however busily it trickles, fails that
request at once (no retry), and the resync goes on to its next step, so the buffered live
batches are delivered after at most a counted loss.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable, Sequence

from kvevents.errors import DecodeError
from kvevents.events import KVEventBatch, decode_batch
from kvevents.feed import START_MODES, Delivery, DeliveryKind, Output, Reset, ResetReason, SourceStatus
from kvevents.zeromq.commands import Command, DropDealer, Send
from kvevents.zeromq.framing import Reply, describe_epoch, framing_label, parse_reply, reply_problem
from kvevents.zeromq.repair_queue import DESCRIBE_TIMEOUT_S, RepairQueue
from kvevents.zeromq.source import Source
from kvevents.zeromq.streams import Item, Phase, Request, SourceState, Stream
from kvevents.zeromq.wire import SEQ, SNAPSHOT_SEQ

__all__ = ["Sequencer", "Send", "DropDealer", "Command", "COUNTERS", "DESCRIBE_TIMEOUT_S"]

log = logging.getLogger("kvevents.zeromq.subscriber")

COUNTERS = (
    "live", "replayed", "snapshot_batches", "heartbeats", "duplicates", "gaps", "replays_requested",
    "replay_timeouts", "unrecoverable_gaps", "restarts", "resets", "snapshots_requested", "snapshots_applied",
    "snapshot_failures", "losses", "bad_payloads", "bad_frames", "stale_buffered", "buffer_overflows",
    "stale_sources", "callback_errors", "loop_errors", "describes_requested", "describe_timeouts", "reconnects",
    "stale_returns", "dropped_ranks", "bad_replies", "requests_abandoned", "describes_unsupported",
)  # fmt: skip
_U64 = 2**64


class Sequencer:
    """Sequencing and repair state of every source; feed it with `on_*`, then `take()` the results."""

    def __init__(
        self,
        sources: Sequence[Source],
        *,
        clock: Callable[[], float] = time.monotonic,
        request_timeout_s: float = 2.0,
        request_budget_s: float = 10.0,
        max_attempts: int = 3,
        max_buffer: int = 100000,
        max_ranks: int = 64,
        start: str = "oldest",
        stale_after_s: float = 5.0,
        log_every: int = 100,
    ) -> None:
        if start not in START_MODES:
            raise ValueError(f"start must be one of {', '.join(START_MODES)}, got {start!r}")
        self.clock = clock
        self.request_timeout_s = request_timeout_s
        self.request_budget_s = max(request_timeout_s, request_budget_s)  # a request's whole time, replies or not
        self.max_attempts = max(1, max_attempts)
        self.max_buffer = max_buffer
        self.max_ranks = max_ranks
        self.start_mode = start
        self.stale_after_s = stale_after_s
        self.log_every = max(1, log_every)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._srcs = {s.name: SourceState(s) for s in sources}
        self._out: list[Output] = []
        self._requests = RepairQueue(  # sends and times out the requests; a failure comes back to a callback
            self.counters,
            clock=clock,
            request_timeout_s=self.request_timeout_s,
            request_budget_s=self.request_budget_s,
            max_attempts=self.max_attempts,
            give_up=self._give_up,
            without_describe=self._without_describe,
        )
        self._started_at = clock()

    # ------------------------------------------------------------------ the loop's interface
    def take(self) -> tuple[list[Output], list[Command]]:
        """What became deliverable, and the socket commands to run (both in order), since the last take."""
        out, self._out = self._out, []
        return out, self._requests.take_commands()

    def wait_s(self, timeout_s: float) -> float:
        """How long the loop may block before the next deadline or backoff falls due."""
        return self._requests.wait_s(self._srcs.values(), timeout_s)

    def tick(self) -> None:
        """Time passes: time out requests, start queued ones, notice stale sources."""
        now = self.clock()
        for s in self._srcs.values():
            self._requests.tick(s, now)
            self._check_stale(s, now)

    def on_connect(self, name: str) -> None:
        """The SUB of `name` (re)connected: after the first time, the publisher may be a new process."""
        s = self._srcs[name]
        s.connects += 1
        if s.connects > 1:
            self.counters["reconnects"] += 1
            s.describes = None if s.describes is False else s.describes  # ask a new process again
            s.unverify()

    def status(self) -> dict[str, SourceStatus]:
        """Per source: where its first rank stands, when it was last heard (wall clock), staleness."""
        now = self.clock()
        return {s.name: s.status(self._is_stale(s, now)) for s in self._srcs.values()}

    def bad(self, what: str, detail: str, key: str = "bad_payloads") -> None:
        """Count (and log once per `log_every`) something that was skipped."""
        n = self.counters[key] = self.counters[key] + 1
        if n % self.log_every == 1 or self.log_every == 1:
            log.warning("%s (%d so far, logged once per %d): %s", what, n, self.log_every, detail)

    # ------------------------------------------------------------------ live path
    def on_live(self, name: str, frames: list[bytes], received_at: float | None = None) -> None:
        """One live message of `name` (topic, 8-byte seq, payload); `received_at` is wall time."""
        s = self._srcs[name]
        now = time.time() if received_at is None else received_at
        s.heard(now, self.clock())
        if s.stale:  # back from a silence: the publisher may be a new process
            s.stale = False
            self.counters["stale_returns"] += 1
            log.info("source %s: heard again after being stale", s.name)
            s.unverify()
        if len(frames) != 3 or len(frames[1]) != 8:
            return self.bad(f"source {s.name}: malformed live message", f"{len(frames)} frames", "bad_frames")
        topic_b, seq_b, payload = frames
        s.topic = topic_b
        try:
            batch = decode_batch(payload)
        except DecodeError as exc:
            return self.bad(f"source {s.name}: undecodable payload", str(exc))
        seq = SEQ.unpack(seq_b)[0]
        rank = batch.data_parallel_rank
        st = s.streams.get(rank)
        if st is None:
            if len(s.streams) >= self.max_ranks:
                return self.bad(
                    f"source {s.name}: more than {self.max_ranks} dp ranks", f"rank {rank}", "dropped_ranks"
                )
            # first contact: "now" takes the first live batch as the start, no loss counted
            st = s.streams[rank] = Stream(rank, clean_start=(s.source.start or self.start_mode) == "now")
        if not batch.events:
            self.counters["heartbeats"] += 1
        restart = (st.epoch is not None and batch.epoch is not None and batch.epoch != st.epoch) or (
            st.last_live_seq is not None and seq < st.last_live_seq
        )
        item = Item(seq, topic_b, payload, batch, now)
        if restart:
            self.counters["restarts"] += 1
            self._restart(s, st, batch.epoch, "restart", seq)
        st.last_live_seq = seq
        if st.busy:
            if len(st.buffer) >= self.max_buffer:
                self.counters["buffer_overflows"] += 1
                st.buffer.clear()  # replay will have to cover it again
            st.buffer.append(item)
            return
        self._sequence(s, st, item)

    def _sequence(self, s: SourceState, st: Stream, it: Item) -> None:
        """Apply one live item to a non-busy stream: deliver, drop as duplicate, or start a repair."""
        if it.batch.epoch is not None and st.epoch is not None and it.batch.epoch != st.epoch:
            self.counters["stale_buffered"] += 1
            return
        if not st.verified and s.can_describe:  # confirm the epoch before applying anything more
            self._requests.request(s, st, "describe", 0)
            st.buffer.append(it)
            return
        if st.next_seq is None:
            if it.batch.epoch is not None or not st.verified:
                st.epoch = it.batch.epoch
            if st.clean_start or it.seq == 0 or not s.source.replay_endpoint:
                if it.seq > 0 and not st.clean_start:
                    self.counters["losses"] += 1  # joined late with no replay: what came before is lost
                st.clean_start = False
                st.next_seq = it.seq
            elif (s.source.start or self.start_mode) == "snapshot":  # first contact: the publisher's state
                self._emit_reset(s, st, "first")
                self._requests.request(s, st, "snapshot", 0)
                st.buffer.append(it)
                return
            else:
                self._requests.request(s, st, "replay", 0, first=True)
                st.buffer.append(it)
                return
        if it.seq < st.next_seq:
            self.counters["duplicates"] += 1
            return
        if it.seq > st.next_seq:
            self.counters["gaps"] += 1
            if s.source.replay_endpoint:
                self._requests.request(s, st, "replay", st.next_seq)
                st.buffer.append(it)
                return
            self.counters["unrecoverable_gaps"] += 1
            self.counters["losses"] += 1
            self._emit_reset(s, st, "gap")
            st.next_seq = it.seq
        self._deliver(s, st, it, "live")
        st.next_seq = it.seq + 1

    def _deliver(self, s: SourceState, st: Stream, it: Item, kind: DeliveryKind, seq: int | None = None) -> None:
        self.counters[{"live": "live", "replay": "replayed", "snapshot": "snapshot_batches"}[kind]] += 1
        self._out.append(
            Delivery(
                s.name,
                it.seq if seq is None else seq,
                it.batch,
                it.payload,
                it.topic.decode("utf-8", "replace"),
                kind,
                st.rank,
                st.epoch if it.batch.epoch is None else it.batch.epoch,
                s.source.endpoint,
                it.received_at,
            )
        )

    def _emit_reset(self, s: SourceState, st: Stream, reason: ResetReason) -> None:
        self.counters["resets"] += 1
        self._out.append(Reset(s.name, st.rank, reason, st.epoch))

    def _restart(self, s: SourceState, st: Stream, epoch: int | None, reason: ResetReason, seq: int) -> None:
        """The publisher restarted: tell the consumer, forget the stream, resync.

        With a replay endpoint: a snapshot, or, from a publisher known not to answer KVE/DESCRIBE
        (vLLM, no snapshots either), a replay from seq 0 (the new process's whole history while its
        ring still holds it; else the usual unrecoverable path). Without one: a counted clean start.
        """
        st.buffer.clear()
        st.busy = False
        st.last_live_seq = None
        s.queue = deque(r for r in s.queue if r.stream is not st)
        st.epoch = epoch
        st.next_seq = None
        if s.active is not None and s.active.stream is st:
            if s.active.phase is not Phase.DESCRIBING:  # (a DESCRIBE's own reply ends a superseded one)
                s.active.phase = Phase.DRAINING
            s.active.superseded = True
        self._emit_reset(s, st, reason)
        if s.source.replay_endpoint and seq > 0:
            if s.describes is False:
                st.verified = True  # nothing to confirm it with
                self._requests.request(s, st, "replay", 0, first=True)
            else:
                self._requests.request(s, st, "snapshot", 0)
        else:
            if seq > 0:
                self.counters["losses"] += 1
            st.clean_start = True

    def _drain(self, s: SourceState, st: Stream) -> None:
        """Re-feed live items buffered during a repair; a new gap starts the next repair."""
        st.busy = False
        items, st.buffer = st.buffer, []
        for it in items:
            if st.busy:
                st.buffer.append(it)
            else:
                self._sequence(s, st, it)

    # ------------------------------------------------------------------ staleness
    def _is_stale(self, s: SourceState, now: float) -> bool:
        ref = s.heard_at if s.heard_at is not None else self._started_at
        return now - ref > self.stale_after_s

    def _check_stale(self, s: SourceState, now: float) -> None:
        stale = self._is_stale(s, now)
        if stale and not s.stale:
            self.counters["stale_sources"] += 1
            log.warning("source %s: nothing heard for %.1fs (stale)", s.name, self.stale_after_s)
        s.stale = stale

    # ------------------------------------------------------------------ repair outcomes
    def _give_up(self, s: SourceState, req: Request, why: str) -> None:
        """The end of a replay (a Reset and a snapshot follow) or a snapshot request (a clean start)."""
        s.failing = True  # until a request to it ends well, no retries: the next step comes sooner
        if req.kind == "replay":
            log.warning("source %s rank %s: replay %s; resync by snapshot", s.name, req.stream.rank, why)
            self._unrecoverable(s, req.stream, req.first)
        else:
            self._snapshot_failed(s, req.stream, f"snapshot {why}")

    def _unrecoverable(self, s: SourceState, st: Stream, first: bool) -> None:
        self.counters["unrecoverable_gaps"] += 1
        self._emit_reset(s, st, "first" if first else "gap")
        st.next_seq = None
        self._requests.request(s, st, "snapshot", 0)

    def _snapshot_failed(self, s: SourceState, st: Stream, why: str = "no snapshot") -> None:
        log.warning("source %s rank %s: %s, starting clean (state lost)", s.name, st.rank, why)
        self.counters["snapshot_failures"] += 1
        self.counters["losses"] += 1
        st.next_seq = None
        st.clean_start = True
        self._drain(s, st)

    def _without_describe(self, s: SourceState, req: Request) -> None:
        """A publisher without KVE/DESCRIBE (vLLM, SGLang): go on without; seqs alone find restarts."""
        s.describes = False
        req.phase = Phase.QUEUED
        if req.superseded:
            return
        if req.kind == "replay":
            s.queue.appendleft(req)  # the replay itself, at once
            return
        req.stream.verified = True  # nothing to confirm it with
        self._drain(s, req.stream)

    def _describe_refused(self, s: SourceState, req: Request) -> None:
        """KVE/DESCRIBE answered by an end marker alone: an engine that read it as a replay start."""
        self.counters["describes_unsupported"] += 1
        s.failing = False
        log.info("source %s: KVE/DESCRIBE answered as an empty replay (not offered); seqs alone find restarts", s.name)
        self._requests.clear(s)
        self._without_describe(s, req)
        self._requests.pump(s)

    def _on_describe(self, s: SourceState, req: Request, payload: bytes) -> None:
        """A DESCRIBE reply: a new epoch is a restart (Reset, then snapshot); else go on."""
        try:
            epoch = describe_epoch(payload)
        except ValueError as exc:
            self.bad(f"source {s.name}: undecodable KVE/DESCRIBE reply", str(exc))
            epoch = None
        s.describes = True
        s.failing = False
        st = req.stream
        req.phase = Phase.QUEUED
        if req.superseded:
            s.active = None
            self._requests.pump(s)
            return
        st.verified = True
        if st.epoch is not None and epoch is not None and epoch != st.epoch:
            self._requests.clear(s)
            self.counters["restarts"] += 1
            log.info(
                "source %s rank %s: new epoch %s (was %s): the publisher restarted", s.name, st.rank, epoch, st.epoch
            )
            self._restart(s, st, epoch, "restart", 1)
            self._requests.pump(s)
            return
        if epoch is not None:
            st.epoch = epoch
        if req.kind == "replay":  # the epoch holds: now the replay itself
            return self._requests.replay(s, req)
        self._requests.clear(s)
        self._drain(s, st)
        self._requests.pump(s)

    # ------------------------------------------------------------------ replies
    def on_offered(self, name: str, reply: Reply) -> None:
        """A reply to a replay made apart from this sequencer's own requests (a relay's warm start
        reading the engine's ring): its framing is the source's, its batch is sequenced as a live
        one (the end marker only tells the framing)."""
        s = self._srcs[name]
        self._note_framing(s, reply.framing)
        if not reply.is_end:
            self.on_live(name, [s.topic if reply.topic is None else reply.topic, reply.seq, reply.payload])

    def _note_framing(self, s: SourceState, framing: str) -> None:
        if s.framing != framing:
            log.info("source %s: replay replies in the %s", s.name, framing_label(framing))
            s.framing = framing

    def on_reply(self, name: str, frames: list[bytes]) -> None:  # noqa: C901 - the reply protocol's cases in order
        """One message on the DEALER of `name`: a DESCRIBE map, or a replayed batch, snapshot batch or
        end marker in either replay framing. Anything else fails the request in flight at once."""
        s = self._srcs[name]
        req = s.active
        s.heard(time.time(), self.clock())
        if req is not None and req.phase is Phase.DESCRIBING and len(frames) == 2 and frames[0] == b"":
            return self._on_describe(s, req, frames[1])
        reply = parse_reply(frames)
        if reply is None:
            return self._unusable(s, req, reply_problem(frames) or "")
        self._note_framing(s, reply.framing)
        if req is None:
            return self.bad(f"source {s.name}: replay reply with no request in flight", "", "bad_replies")
        if req.phase is Phase.DESCRIBING:  # an engine without KVE/DESCRIBE reads it as a start past its newest seq
            return self._describe_refused(s, req) if reply.is_end else self._unusable(s, req, "a batch")
        self._requests.progress(req)  # progress extends the deadline (not give_up_at)
        if reply.is_end:
            return self._finish(s, req, reply.payload)
        if req.phase is Phase.DRAINING:
            return
        topic = s.topic if reply.topic is None else reply.topic
        if req.kind == "snapshot":
            return self._snapshot_reply(s, req, topic, reply)
        self._replay_reply(s, req, topic, reply)

    def _unusable(self, s: SourceState, req: Request | None, why: str) -> None:
        """A reply in neither framing, or of the wrong kind: counted; the request in flight fails."""
        kind = "" if req is None else f" to a {'describe' if req.phase is Phase.DESCRIBING else req.kind} request"
        self.bad(f"source {s.name}: unusable reply{kind}", why, "bad_replies")
        if req is not None:
            self._requests.abandon(s, req, f"answered with {why}")

    def _snapshot_reply(self, s: SourceState, req: Request, topic: bytes, reply: Reply) -> None:
        if reply.seq != SNAPSHOT_SEQ:
            return self._unusable(s, req, f"a snapshot batch with seq {reply.seq.hex()}")
        try:
            batch = decode_batch(reply.payload)
        except DecodeError as exc:
            req.phase, req.failed = Phase.DRAINING, True
            return self.bad(f"source {s.name}: undecodable snapshot batch", str(exc))
        req.stream.snapshot.append(Item(0, topic, reply.payload, batch, time.time()))

    def _replay_reply(self, s: SourceState, req: Request, topic: bytes, reply: Reply) -> None:
        seq = SEQ.unpack(reply.seq)[0]
        try:
            batch: KVEventBatch | None = decode_batch(reply.payload)
        except DecodeError as exc:
            self.bad(f"source {s.name}: undecodable replayed payload", str(exc))
            batch = None
        verdict = req.replayed(seq, batch)
        if verdict == "duplicate":
            self.counters["duplicates"] += 1
        elif verdict == "deliver":
            assert batch is not None
            self._deliver(s, req.stream, Item(seq, topic, reply.payload, batch, time.time()), "replay")

    def _finish(self, s: SourceState, req: Request, last: bytes) -> None:
        """The end marker: apply the outcome (`Request.outcome`), then the next request."""
        self._requests.clear(s)
        s.failing = False
        st = req.stream
        outcome = req.outcome(last)
        if outcome == "restart":
            assert req.new_epoch is not None
            self.counters["restarts"] += 1
            self._restart(s, st, req.new_epoch, "restart", 1)
        elif outcome == "snapshot":
            S = SEQ.unpack(last)[0]
            for it in st.snapshot:
                self._deliver(s, st, it, "snapshot", seq=S)
            if st.snapshot and st.snapshot[0].batch.epoch is not None:
                st.epoch = st.snapshot[0].batch.epoch
            st.snapshot = []
            st.next_seq = (S + 1) % _U64
            self.counters["snapshots_applied"] += 1
            self._drain(s, st)
        elif outcome == "no-snapshot":
            self._snapshot_failed(s, st)
        elif outcome == "unrecoverable":
            self._unrecoverable(s, st, req.first)
        elif outcome == "drain":
            self._drain(s, st)
        self._requests.pump(s)
