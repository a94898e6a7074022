"""Helpers for transport tests and benchmarks: real sockets on 127.0.0.1, ephemeral ports."""

from __future__ import annotations

import time
from typing import Callable

import zmq

from kvevents.events import BlockRemoved, BlockStored, Event

EPH = "tcp://127.0.0.1:*"


def stored(h: int, parent: int | None = None, medium: str = "GPU", page: int = 2) -> BlockStored:
    return BlockStored([h], parent, [h % 1000] * page, page, None, medium, None)


def chain_events(start: int, n: int, page: int = 2) -> list[list[Event]]:
    """n one-event batches storing a chain of hashes start, start+1, ... ."""
    return [[stored(start + i, start + i - 1 if i else None, page=page)] for i in range(n)]


def collect(sub, until: Callable[[list], bool], timeout: float = 5.0) -> list:
    """Poll a Subscriber until `until(items)` holds (or fail after timeout)."""
    items: list = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items.extend(sub.poll(0.02))
        if until(items):
            return items
    raise AssertionError(f"timed out; got {len(items)} items, counters {sub.counters()}")


def sub_socket(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A raw SUB socket subscribed to every topic, connected to `endpoint` (closes at once)."""
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    return s


def dealer_socket(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A raw DEALER socket connected to a replay endpoint (closes at once)."""
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(endpoint)
    return d


def wait_joined(pub, sub: zmq.Socket) -> None:
    """PUB drops until the subscription arrives: publish heartbeats until one is received, then drain."""
    for _ in range(200):
        pub.publish([])
        if sub.poll(20):
            while sub.poll(50):
                sub.recv_multipart()
            return
    raise AssertionError("subscriber never joined")


def recv_all(sock: zmq.Socket, timeout_ms: int = 2000) -> list[list[bytes]]:
    """Every message a socket receives until the end marker (seq frame ff*8) or a timeout."""
    out = []
    while sock.poll(timeout_ms):
        msg = sock.recv_multipart()
        out.append(msg)
        if len(msg) >= 3 and msg[-2] == b"\xff" * 8:
            break
    return out


def apply(state: dict, batch, source: str = "w") -> None:
    """A tiny consumer: reference counts per (medium, hash)."""
    for ev in batch.events:
        t = type(ev).__name__
        if t == "AllBlocksCleared":
            state.clear()
        elif t == "BlockStored":
            for h in ev.block_hashes:
                state[(ev.medium, h)] = state.get((ev.medium, h), 0) + 1
        elif isinstance(ev, BlockRemoved):
            for h in ev.block_hashes:
                k = (ev.medium, h)
                if state.get(k, 0) > 1:
                    state[k] -= 1
                else:
                    state.pop(k, None)


def view_counts(pub) -> dict:
    """A publisher's live-block view as {(medium, hash): copies} (compare with a consumer's)."""
    out: dict = {}
    frozen = pub.freeze_view()[0]
    for medium, m in frozen.media:
        for h in m:
            out[(medium, h)] = out.get((medium, h), 0) + 1
    for medium, h, _ in frozen.extra:
        out[(medium, h)] = out.get((medium, h), 0) + 1
    return out


def free_tcp_endpoint() -> str:
    """tcp://127.0.0.1:<port> with a port that was free a moment ago."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"
