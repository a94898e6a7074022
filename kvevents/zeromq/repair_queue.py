"""The sequencer's repair requests on each source's DEALER: one in flight, the others queued behind it.

Owns when a request goes out and when it has failed: the body sent for each kind and phase (a gap
replay to a publisher that answers KVE/DESCRIBE asks DESCRIBE first), the deadline per reply and the
budget per request, retries with backoff, and the `Send` / `DropDealer` commands for the socket loop.
What a failure leads to (the resync's next step) stays the sequencer's (kvevents.zeromq.sequencer):
it is told through the two callbacks it passes in. Sans-IO, with the sequencer's injectable clock.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from kvevents.zeromq.commands import Command, DropDealer, Send
from kvevents.zeromq.streams import Phase, Request, SourceState, Stream
from kvevents.zeromq.wire import DESCRIBE_REQUEST, SNAPSHOT_REQUEST, pack_seq

__all__ = ["RepairQueue", "DESCRIBE_TIMEOUT_S"]

log = logging.getLogger("kvevents.zeromq.subscriber")

DESCRIBE_TIMEOUT_S = 1.0  # a publisher without KVE/DESCRIBE (vLLM, SGLang) costs this once per (re)contact


class RepairQueue:
    """Queue, send, time out and retry the repair requests of every source, one in flight per source."""

    def __init__(
        self,
        counters: dict[str, int],
        *,
        clock: Callable[[], float],
        request_timeout_s: float,
        request_budget_s: float,
        max_attempts: int,
        give_up: Callable[[SourceState, Request, str], None],
        without_describe: Callable[[SourceState, Request], None],
    ) -> None:
        """`give_up(s, req, why)`: a replay or snapshot request failed for good; `without_describe(s, req)`:
        a KVE/DESCRIBE went unanswered. Both decide the resync's next step."""
        self.counters = counters
        self.clock = clock
        self.request_timeout_s = request_timeout_s
        self.request_budget_s = request_budget_s
        self.max_attempts = max_attempts
        self._give_up = give_up
        self._without_describe = without_describe
        self._commands: list[Command] = []

    def take_commands(self) -> list[Command]:
        """The socket commands (in order) since the last take."""
        cmds, self._commands = self._commands, []
        return cmds

    def wait_s(self, sources: Iterable[SourceState], timeout_s: float) -> float:
        """How long the loop may block before the next deadline or backoff of `sources` falls due."""
        now = self.clock()
        wait = timeout_s
        for s in sources:
            if s.active is not None:
                wait = min(wait, max(0.0, min(s.active.deadline, s.active.give_up_at) - now))
            elif s.queue:
                wait = min(wait, max(0.0, s.not_before - now))
        return wait

    def tick(self, s: SourceState, now: float) -> None:
        """Time passes for `s`: time out its request in flight, or start its next queued one."""
        if s.active is not None and now >= min(s.active.deadline, s.active.give_up_at):
            self._on_timeout(s, now)
        if s.active is None:
            self.pump(s)

    def request(self, s: SourceState, st: Stream, kind: str, start: int, *, first: bool = False) -> None:
        """Ask a `kind` request for `st` (one queued per stream: a newer ask replaces the queued one)."""
        st.busy = True
        for r in s.queue:
            if r.stream is st:
                r.kind, r.start, r.first = kind, start, first
                return
        s.queue.append(Request(st, kind, start, first))
        self.pump(s)

    def pump(self, s: SourceState) -> None:
        """Send the next queued request of `s` if none is in flight and its backoff has passed."""
        if s.active is not None or not s.queue or self.clock() < s.not_before:
            return
        req = s.queue.popleft()
        if req.kind == "describe" or (
            req.kind == "replay" and not req.first and s.can_describe and req.phase is not Phase.DESCRIBING
        ):
            self.counters["describes_requested"] += 1
            req.phase = Phase.DESCRIBING
            return self._send(s, req, DESCRIBE_REQUEST, min(self.request_timeout_s, DESCRIBE_TIMEOUT_S))
        if req.phase is not Phase.DRAINING:  # a retry of a failed reply stays drained till its end marker
            req.phase = Phase.REQUESTING
        if req.kind == "replay":
            self.counters["replays_requested"] += 1
            return self._send(s, req, pack_seq(req.start), self.request_timeout_s)
        self.counters["snapshots_requested"] += 1
        req.stream.snapshot = []
        self._send(s, req, SNAPSHOT_REQUEST, self.request_timeout_s)

    def replay(self, s: SourceState, req: Request) -> None:
        """KVE/DESCRIBE confirmed the epoch: now send the replay itself for `req`, still in flight."""
        self.counters["replays_requested"] += 1
        req.phase = Phase.REQUESTING
        self._send(s, req, pack_seq(req.start), self.request_timeout_s)

    def progress(self, req: Request) -> None:
        """A reply to `req` came: its deadline moves on (its budget does not)."""
        req.deadline = self.clock() + self.request_timeout_s

    def clear(self, s: SourceState) -> None:
        """The request in flight of `s` has ended: the next one may go at once (no backoff)."""
        s.active = None
        s.not_before = 0.0

    def abandon(self, s: SourceState, req: Request, why: str) -> None:
        """`req` will get no usable answer: end it now (its DEALER too, so nothing more of it arrives)
        and go on to the resync's next step, without the retries a lost request gets."""
        self.counters["requests_abandoned"] += 1
        self.clear(s)
        self._commands.append(DropDealer(s.name))
        if req.phase is Phase.DESCRIBING:
            log.info("source %s: KVE/DESCRIBE %s; going on without it", s.name, why)
            self._without_describe(s, req)
        elif not req.superseded:
            self._give_up(s, req, why)
        self.pump(s)

    def _describe_unanswered(self, s: SourceState, req: Request) -> None:
        """A DESCRIBE timed out. From a publisher that has answered one before, the request was lost
        (its process restarting, say): ask again after a backoff, nothing applied unconfirmed
        meanwhile; going on unconfirmed would take a new process's seqs for the old one's. Else
        (vLLM, SGLang never answer) go on without: seqs alone find restarts."""
        if req.superseded and s.describes:
            return  # its stream was reset meanwhile and has asked for what it needs now
        req.describe_attempts += 1
        if s.describes and req.describe_attempts < self.max_attempts:
            log.info("source %s: KVE/DESCRIBE timed out, asking again (%d)", s.name, req.describe_attempts)
            req.phase = Phase.QUEUED
            s.not_before = self.clock() + min(5.0, 0.1 * 2**req.describe_attempts)
            s.queue.appendleft(req)
            return
        log.info("source %s: no KVE/DESCRIBE reply; restarts are found by seqs going backwards only", s.name)
        self._without_describe(s, req)

    def _send(self, s: SourceState, req: Request, body: bytes, timeout_s: float) -> None:
        """Send `body` for `req`, now the one in flight: no reply within `timeout_s` is a timeout,
        and no end within `request_budget_s` abandons it."""
        self._commands.append(Send(s.name, body))
        now = self.clock()
        req.deadline, req.give_up_at = now + timeout_s, now + self.request_budget_s
        s.active = req

    def _on_timeout(self, s: SourceState, now: float) -> None:
        req = s.active
        assert req is not None
        if now >= req.give_up_at:  # answering, maybe, but never finishing: a retry would do the same
            return self.abandon(s, req, f"not finished within {self.request_budget_s:g}s")
        s.active = None
        self._commands.append(DropDealer(s.name))
        if req.phase is Phase.DESCRIBING:
            self.counters["describe_timeouts"] += 1
            return self._describe_unanswered(s, req)
        self.counters["replay_timeouts"] += 1
        if req.superseded:
            return
        req.attempts += 1
        s.not_before = self.clock() + min(5.0, 0.1 * 2**req.attempts)
        if req.attempts < (1 if s.failing else self.max_attempts):  # retry only an endpoint that answers
            log.info("source %s: %s request timed out, retrying (%d)", s.name, req.kind, req.attempts)
            s.queue.appendleft(req)
            return
        self._give_up(s, req, f"unanswered ({req.attempts} attempt{'s' if req.attempts > 1 else ''})")
