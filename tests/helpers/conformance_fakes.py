"""Deliberately broken publishers for the conformance tests: raw XPUB + ROUTER sockets on
127.0.0.1 (ephemeral ports) that send exactly the frames a test scripts, mistakes included."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import zmq

from kvevents.conformance.report import Report
from kvevents.conformance.stream import StreamObserver, StreamOptions
from kvevents.zeromq.wire import END_SEQ, pack_seq

# the batches a fake engine sends are built by tests.helpers.payloads.batch


class FakeEngine:
    """XPUB (so the test knows when the kit's SUB has joined) and an optional ROUTER serving replay.

    replay_mode: "ok" (ring items >= start, then the end marker), "no-end" (no end marker),
    "skip" (never replays the seqs in `skip`).
    """

    def __init__(self, *, replay: bool = True, replay_mode: str = "ok", skip: Sequence[int] = ()) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.ring: dict[int, bytes] = {}
        self.lock = threading.Lock()
        self.mode = replay_mode
        self.skip = set(skip)
        self.replay_endpoint: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if replay:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.bind("tcp://127.0.0.1:*")
            self.replay_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
            self._thread = threading.Thread(target=self._serve, daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(20):
                continue
            ident, _, body = self.router.recv_multipart()
            if len(body) != 8:  # KVE/DESCRIBE, KVE/SNAPSHOT: answered as vLLM does, an empty replay
                self.router.send_multipart([ident, b"", b"", END_SEQ, b""])
                continue
            start = int.from_bytes(body, "big")
            with self.lock:
                items = sorted((s, p) for s, p in self.ring.items() if s >= start and s not in self.skip)
            for s, p in items:
                self.router.send_multipart([ident, b"", b"", pack_seq(s), p])
            if self.mode != "no-end":
                self.router.send_multipart([ident, b"", b"", END_SEQ, b""])

    def wait_joined(self, timeout: float = 5.0) -> None:
        if not self.pub.poll(int(timeout * 1000)):
            raise AssertionError("the kit's SUB never subscribed")
        self.pub.recv()

    def send(self, seq: int, data: bytes, *, live: bool = True, topic: bytes = b"") -> None:
        with self.lock:
            self.ring[seq] = data
        if live:
            self.pub.send_multipart([topic, pack_seq(seq), data])

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
            self.router.close(0)
        self.pub.close(0)
        self.ctx.term()


def observe_fake(
    engine: FakeEngine,
    script: Sequence[tuple[int, bytes, bool]],
    *,
    replay: bool = True,
    page_size: int = 2,
    allow_epoch: bool = False,
    reply_timeout: float = 1.5,
) -> Report:
    """Connect the kit, send the script [(seq, payload, live)], let the kit see it all, judge."""
    opts = StreamOptions(
        engine.endpoint,
        engine.replay_endpoint if replay else None,
        page_size,
        reply_timeout=reply_timeout,
        allow_epoch=allow_epoch,
    )
    with StreamObserver(opts) as obs:
        engine.wait_joined()
        for seq, data, live in script:
            engine.send(seq, data, live=live)
        want = sum(1 for *_, live in script if live)
        deadline = time.monotonic() + 5.0
        while obs.received < want and time.monotonic() < deadline:
            obs.pump(0.05)
        return obs.finish(quiet=0.05)
