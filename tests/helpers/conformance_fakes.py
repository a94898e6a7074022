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

    framing: 4 replies `["", topic, seq, payload]`, end `["", "", ff*8, ""]` (vLLM >= 0.26);
    3 replies `["", seq, payload]`, end `["", ff*8, ""]` (SGLang 0.5.20, vLLM < 0.26), written
    here from that byte layout. Any request body is read as a big-endian start, as those engines
    do, so KVE/DESCRIBE and KVE/SNAPSHOT get only the end marker (an empty replay).
    replay_mode: "ok" (ring items >= start, then the end marker), "no-end" (no end marker),
    "skip" (never replays the seqs in `skip`), "garbage" (one reply in neither form), "mute"
    (never answers), "slow" (answers "ok" after `delay` seconds).
    """

    MODES = ("ok", "no-end", "skip", "garbage", "mute", "slow")

    def __init__(
        self,
        *,
        replay: bool = True,
        replay_mode: str = "ok",
        skip: Sequence[int] = (),
        framing: int = 4,
        delay: float = 0.0,
    ) -> None:
        if replay_mode not in self.MODES or framing not in (3, 4):
            raise ValueError(f"replay_mode {replay_mode!r} / framing {framing!r}")
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.ring: dict[int, tuple[bytes, bytes]] = {}  # seq -> (topic, payload)
        self.lock = threading.Lock()
        self.mode = replay_mode
        self.skip = set(skip)
        self.framing = framing
        self.delay = delay
        self.requests: list[bytes] = []  # request bodies received (serve thread appends)
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

    def reply(self, topic: bytes, seq_frame: bytes, data: bytes) -> list[bytes]:
        """One reply message after the identity, in this engine's framing."""
        return [b"", topic, seq_frame, data] if self.framing == 4 else [b"", seq_frame, data]

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(20):
                continue
            frames = self.router.recv_multipart()
            ident, body = frames[0], frames[-1]
            self.requests.append(body)
            if self.mode == "mute":
                continue
            if self.mode == "garbage":
                self.router.send_multipart([ident, b"hello", b"not", b"a", b"replay", b"reply"])
                continue
            if self.mode == "slow" and self._stop.wait(self.delay):
                return
            start = int.from_bytes(body, "big")  # a 12-byte KVE/ command: far past any seq
            with self.lock:
                items = sorted((s, tp) for s, tp in self.ring.items() if s >= start and s not in self.skip)
            for s, (topic, p) in items:
                self.router.send_multipart([ident, *self.reply(topic, pack_seq(s), p)])
            if self.mode != "no-end":
                self.router.send_multipart([ident, *self.reply(b"", END_SEQ, b"")])

    def wait_joined(self, timeout: float = 5.0) -> None:
        if not self.pub.poll(int(timeout * 1000)):
            raise AssertionError("the kit's SUB never subscribed")
        self.pub.recv()

    def send(self, seq: int, data: bytes, *, live: bool = True, topic: bytes = b"") -> None:
        with self.lock:
            self.ring[seq] = (topic, data)
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
