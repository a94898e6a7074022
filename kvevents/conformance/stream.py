"""`conformance stream`: observe a live publisher with raw sockets and feed the rules.

A SUB socket sees the exact live frames; a fresh DEALER per request asks for replay (a gap, the
history before the first batch seen, two probes: from 0 and past the newest seq), KVE/DESCRIBE
and KVE/SNAPSHOT. The verdicts come from `rules.StreamChecker`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import zmq

from kvevents.conformance import shape
from kvevents.conformance.profiles import get_profile
from kvevents.conformance.report import Report
from kvevents.conformance.rules import StreamChecker
from kvevents.zeromq.wire import (
    DESCRIBE_REQUEST,
    SNAPSHOT_REQUEST,
    check_endpoint,
    pack_seq,
)

__all__ = ["StreamObserver", "StreamOptions", "observe"]


@dataclass
class StreamOptions:
    """What to observe and how: endpoints, the page size and profile to expect, time limits."""

    endpoint: str
    replay: str | None = None
    page_size: int | None = None
    duration: float = 10.0
    profile: str = "contract"
    allow_epoch: bool = False
    reply_timeout: float = 2.0
    max_batches: int | None = None
    probes: bool = True  # replay from 0 and past the newest seq, DESCRIBE, SNAPSHOT at the end
    hash_seed: str | None = None  # vLLM profiles: PYTHONHASHSEED
    lora_path: str | None = None  # vLLM profiles: LoRA path template ({name})

    def validate(self) -> None:
        check_endpoint(self.endpoint)
        if self.replay:
            check_endpoint(self.replay)
        if self.page_size is not None and (isinstance(self.page_size, bool) or self.page_size < 1):
            raise ValueError(f"page size must be >= 1, got {self.page_size!r}")
        if self.duration < 0 or self.reply_timeout <= 0:
            raise ValueError("duration must be >= 0 and reply timeout > 0")


class StreamObserver:
    """Connects at construction; `pump()` handles live messages; `finish()` probes and judges."""

    def __init__(self, opts: StreamOptions, context: zmq.Context | None = None) -> None:
        opts.validate()
        self.opts = opts
        self.checker = StreamChecker(
            get_profile(opts.profile, seed=opts.hash_seed, lora_path=opts.lora_path),
            opts.page_size,
            allow_epoch=opts.allow_epoch,
        )
        self.checker.replay_offered = bool(opts.replay)
        self._own_ctx = context is None
        self.ctx = context or zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, 0)
        self.sub.connect(opts.endpoint)
        self.received = 0
        self.requests = 0

    # ------------------------------------------------------------------ requests
    def _request(self, body: bytes, *, until_end: bool) -> tuple[list[list[bytes]], bool]:
        """Send one ROUTER request; replies until the end marker (or the first one) or the timeout."""
        assert self.opts.replay
        self.requests += 1
        d = self.ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        try:
            d.connect(self.opts.replay)
            d.send_multipart([b"", body])
            replies: list[list[bytes]] = []
            deadline = time.monotonic() + self.opts.reply_timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not d.poll(int(left * 1000) + 1):
                    return replies, False
                fr = d.recv_multipart()
                replies.append(fr)
                if shape.is_end_marker(fr) or not until_end:
                    return replies, shape.is_end_marker(fr)
                deadline = time.monotonic() + self.opts.reply_timeout  # a long replay keeps going
        finally:
            d.close(0)

    def _replay(self, start: int, upto: int | None, heal: bool) -> None:
        replies, ended = self._request(pack_seq(start), until_end=True)
        self.checker.on_replay(start, replies, ended, upto=upto, heal=heal)

    # ------------------------------------------------------------------ live
    def handle(self, frames: list[bytes]) -> None:
        """One live message: heal the gap before it (or fetch the history on first contact), then judge it."""
        self.received += 1
        c = self.checker
        seq = c.live_seq(frames)
        if seq is not None and self.opts.replay:
            if c.expected is None and seq > 0:
                self._replay(0, seq, heal=False)
            elif c.expected is not None and seq > c.expected:
                self._replay(c.expected, seq, heal=True)
        c.on_live(frames)

    def pump(self, timeout: float = 0.05, limit: int = 256) -> int:
        """Handle the live messages queued (waiting up to `timeout` s for the first), at most `limit`."""
        n = 0
        if self.sub.poll(int(timeout * 1000)):
            while n < limit:
                try:
                    frames = self.sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.handle(frames)
                n += 1
        return n

    def run(self, duration: float) -> None:
        deadline = time.monotonic() + duration
        cap = self.opts.max_batches
        while time.monotonic() < deadline and (cap is None or self.received < cap):
            self.pump(min(0.05, max(0.0, deadline - time.monotonic())))

    # ------------------------------------------------------------------ end
    def finish(self, quiet: float = 0.2) -> Report:
        """Drain, run the probes (replay from 0 and past the end, DESCRIBE, SNAPSHOT) and judge."""
        end = time.monotonic() + quiet  # what was sent before the end, not a stream that never goes quiet
        while time.monotonic() < end and self.pump(0.02):
            pass
        c = self.checker
        if not self.received:
            c.t["live-frames"].fail(
                f"no live message in {self.opts.duration:g} s: is {self.opts.endpoint} right? "
                "(an idle engine publishes nothing: send it requests while the kit observes)"
            )
        if self.opts.replay and self.opts.probes:
            self._replay(0, None, heal=False)  # a start older than the ring: answered from the oldest kept
            newest = c.last_live if c.last_live is not None else 0
            self._replay(newest + 1_000_000, None, heal=False)  # nothing to send: just the end marker
            replies, _ = self._request(DESCRIBE_REQUEST, until_end=False)
            c.on_describe(replies[0] if replies else None)
            replies, ended = self._request(SNAPSHOT_REQUEST, until_end=True)
            s = c.on_snapshot(replies, ended)
            if s is not None:
                held = self._advance_to(s)
                c.compare_snapshot(s)
                if held is not None:
                    self.handle(held)
        elif self.opts.probes:
            for rule in ("describe", "snapshot", "replay-protocol"):
                c.t[rule].offered = False
                c.t[rule].note = "no replay endpoint given"
        report = c.report()
        report.figures["received"] = self.received
        report.figures["requests"] = self.requests
        return report

    def _advance_to(self, s: int) -> list[bytes] | None:
        """Apply live batches up to seq S exactly; the first message past S is returned, not applied."""
        c = self.checker
        deadline = time.monotonic() + self.opts.reply_timeout
        while (c.expected is None or c.expected <= s) and time.monotonic() < deadline:
            if not self.sub.poll(50):
                continue
            frames = self.sub.recv_multipart()
            seq = c.live_seq(frames)
            if seq is not None and seq > s and c.expected is not None:
                if c.expected <= s and self.opts.replay:
                    self._replay(c.expected, s + 1, heal=True)
                return frames
            self.handle(frames)
        return None

    def close(self) -> None:
        self.sub.close(0)
        if self._own_ctx:
            self.ctx.term()

    def __enter__(self) -> StreamObserver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def observe(opts: StreamOptions, context: zmq.Context | None = None) -> Report:
    """Observe for `opts.duration` seconds (or `max_batches`), then probe and judge."""
    with StreamObserver(opts, context) as obs:
        obs.run(opts.duration)
        return obs.finish()
