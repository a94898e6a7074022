"""One-shot replay, KVE/DESCRIBE and KVE/SNAPSHOT requests to a publisher's replay ROUTER.

For callers that need an engine's epoch or its live blocks outside a Subscriber's repair loop
(the JetStream bridge stores snapshots on its own cadence). Each call uses its own DEALER, so
calls from several threads do not share a socket.
"""

from __future__ import annotations

from typing import Any, Iterator

import msgspec
import zmq

from kvevents.zeromq.wire import (
    DESCRIBE_REQUEST,
    END_SEQ,
    SEQ,
    SNAPSHOT_REQUEST,
    SNAPSHOT_SEQ,
    pack_seq,
    unpack_seq,
)

__all__ = ["EngineRequestError", "describe", "snapshot", "replay"]


class EngineRequestError(ValueError):
    """The replay endpoint did not answer in time, or answered something else."""


def _ask(endpoint: str, body: bytes, context: zmq.Context | None) -> zmq.Socket:
    ctx = context or zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        sock.close(0)
        raise EngineRequestError(f"cannot connect to {endpoint!r}: {exc}") from None
    sock.send_multipart([b"", body])
    return sock


def _reply(sock: zmq.Socket, endpoint: str, what: str, timeout: float) -> list[bytes]:
    if not sock.poll(int(timeout * 1000)):
        raise EngineRequestError(f"no {what} answer from {endpoint} within {timeout:g}s")
    return sock.recv_multipart()


def describe(endpoint: str, *, timeout: float = 2.0, context: zmq.Context | None = None) -> dict[str, Any]:
    """The publisher's KVE/DESCRIBE map (epoch, dp_rank, newest_seq, ...)."""
    sock = _ask(endpoint, DESCRIBE_REQUEST, context)
    try:
        frames = _reply(sock, endpoint, "KVE/DESCRIBE", timeout)
        try:
            out = msgspec.msgpack.decode(frames[-1])
        except msgspec.DecodeError:
            out = None
        if not isinstance(out, dict):
            raise EngineRequestError(f"KVE/DESCRIBE answer from {endpoint} is not a msgpack map")
        return out
    finally:
        sock.close(0)


def snapshot(
    endpoint: str, *, timeout: float = 3.0, context: zmq.Context | None = None
) -> tuple[list[bytes], int | None]:
    """KVE/SNAPSHOT: the snapshot batch payloads, and the seq S they cover (None: nothing published yet).

    `timeout` applies to each reply message, so a large snapshot may take longer in all.
    """
    sock = _ask(endpoint, SNAPSHOT_REQUEST, context)
    payloads: list[bytes] = []
    try:
        while True:
            frames = _reply(sock, endpoint, "KVE/SNAPSHOT", timeout)
            if len(frames) != 4 or frames[0] != b"":
                raise EngineRequestError(f"KVE/SNAPSHOT reply of {len(frames)} frames from {endpoint}")
            seq_frame, payload = frames[2], frames[3]
            if seq_frame == END_SEQ:
                if payload == END_SEQ or len(payload) != 8:
                    return payloads, None
                return payloads, unpack_seq(payload)
            if seq_frame != SNAPSHOT_SEQ:
                raise EngineRequestError(f"KVE/SNAPSHOT reply with seq frame {seq_frame.hex()} from {endpoint}")
            payloads.append(payload)
    finally:
        sock.close(0)


def replay(
    endpoint: str, start: int = 0, *, timeout: float = 3.0, context: zmq.Context | None = None
) -> Iterator[tuple[bytes, int, bytes]]:
    """Every kept batch with seq >= start, as (topic, seq, payload), until the end marker.

    EngineRequestError when nothing (or a malformed frame) arrives within `timeout` of the last reply.
    """
    if not 0 <= start < 2**64:
        raise ValueError(f"start seq must be in 0..2**64-1, got {start}")
    sock = _ask(endpoint, pack_seq(start), context)
    try:
        while True:
            frames = _reply(sock, endpoint, "replay", timeout)
            if len(frames) != 4 or frames[0] != b"" or len(frames[2]) != 8:
                raise EngineRequestError(f"replay endpoint {endpoint}: malformed reply of {len(frames)} frames")
            _, topic, seq_b, payload = frames
            if seq_b == END_SEQ:
                return
            yield topic, SEQ.unpack(seq_b)[0], payload
    finally:
        sock.close(0)
