"""One-shot replay, KVE/DESCRIBE and KVE/SNAPSHOT requests to a publisher's replay ROUTER.

For callers that need an engine's epoch or its live blocks outside a Subscriber's repair loop
(the JetStream bridge stores snapshots on its own cadence). Each call uses its own DEALER, so
calls from several threads do not share a socket. Replies may come in either replay framing
(transport.framing: with a topic frame, or without one as SGLang 0.5.20 sends them), read per
reply; a call never waits longer than its `timeout` per reply nor `within` in all.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import msgspec
import zmq

from kvevents.zeromq.framing import Reply, parse_reply, reply_problem
from kvevents.zeromq.wire import (
    DESCRIBE_REQUEST,
    END_SEQ,
    SEQ,
    SNAPSHOT_REQUEST,
    SNAPSHOT_SEQ,
    pack_seq,
    unpack_seq,
)

__all__ = ["EngineRequestError", "NotOffered", "describe", "snapshot", "replay", "replay_replies"]

WITHIN_PER_TIMEOUT = 10  # `within` defaults to this many `timeout`s: a trickle cannot hold a caller forever


class EngineRequestError(ValueError):
    """The replay endpoint did not answer in time, or answered something else."""


class NotOffered(EngineRequestError):
    """The endpoint answered a KVE/ command as an empty replay: it does not offer it (vLLM, SGLang)."""


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


def _reply(sock: zmq.Socket, endpoint: str, what: str, timeout: float, until: float | None = None) -> list[bytes]:
    wait = timeout if until is None else min(timeout, until - time.monotonic())
    if wait <= 0 or not sock.poll(max(1, int(wait * 1000))):
        if until is not None and time.monotonic() >= until:
            raise EngineRequestError(f"{what} from {endpoint} not finished in time (a trickle, or no end marker)")
        raise EngineRequestError(f"no {what} answer from {endpoint} within {timeout:g}s")
    return sock.recv_multipart()


def _replies(sock: zmq.Socket, endpoint: str, what: str, timeout: float, within: float | None) -> Iterator[Reply]:
    """Each reply in either framing until the end marker (included); EngineRequestError otherwise."""
    until = time.monotonic() + (WITHIN_PER_TIMEOUT * timeout if within is None else within)
    while True:
        frames = _reply(sock, endpoint, what, timeout, until)
        reply = parse_reply(frames)
        if reply is None:
            raise EngineRequestError(f"{what} reply from {endpoint} in neither replay framing: {reply_problem(frames)}")
        yield reply
        if reply.is_end:
            return


def describe(endpoint: str, *, timeout: float = 2.0, context: zmq.Context | None = None) -> dict[str, Any]:
    """The publisher's KVE/DESCRIBE map (epoch, dp_rank, newest_seq, ...)."""
    sock = _ask(endpoint, DESCRIBE_REQUEST, context)
    try:
        frames = _reply(sock, endpoint, "KVE/DESCRIBE", timeout)
        end = parse_reply(frames)
        if end is not None and end.is_end:
            raise NotOffered(
                f"{endpoint} answered KVE/DESCRIBE as an empty replay ({end.framing} end marker): "
                "a publisher without KVE/DESCRIBE (vLLM, SGLang)"
            )
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
    endpoint: str, *, timeout: float = 3.0, context: zmq.Context | None = None, within: float | None = None
) -> tuple[list[bytes], int | None]:
    """KVE/SNAPSHOT: the snapshot batch payloads, and the seq S they cover (None: nothing published yet).

    `timeout` applies to each reply message, `within` (default 10 timeouts) to the whole snapshot.
    """
    sock = _ask(endpoint, SNAPSHOT_REQUEST, context)
    payloads: list[bytes] = []
    try:
        for r in _replies(sock, endpoint, "KVE/SNAPSHOT", timeout, within):
            if r.is_end:
                if r.payload == END_SEQ or len(r.payload) != 8:
                    return payloads, None
                return payloads, unpack_seq(r.payload)
            if r.seq != SNAPSHOT_SEQ:
                raise EngineRequestError(f"KVE/SNAPSHOT reply with seq frame {r.seq.hex()} from {endpoint}")
            payloads.append(r.payload)
        raise EngineRequestError(f"KVE/SNAPSHOT from {endpoint}: no end marker")  # pragma: no cover
    finally:
        sock.close(0)


def replay_replies(
    endpoint: str,
    start: int = 0,
    *,
    timeout: float = 3.0,
    context: zmq.Context | None = None,
    within: float | None = None,
) -> Iterator[Reply]:
    """Every reply to a replay from `start`, in its own framing, the end marker last.

    EngineRequestError when nothing arrives within `timeout` of the last reply, the whole replay
    takes longer than `within` (default 10 timeouts), or a reply is in neither framing.
    """
    if not 0 <= start < 2**64:
        raise ValueError(f"start seq must be in 0..2**64-1, got {start}")
    sock = _ask(endpoint, pack_seq(start), context)
    try:
        yield from _replies(sock, endpoint, "replay", timeout, within)
    finally:
        sock.close(0)


def replay(
    endpoint: str,
    start: int = 0,
    *,
    timeout: float = 3.0,
    context: zmq.Context | None = None,
    within: float | None = None,
) -> Iterator[tuple[bytes, int, bytes]]:
    """Every kept batch with seq >= start, as (topic, seq, payload), until the end marker; the
    topic of a reply without a topic frame (SGLang 0.5.20) is b"". Errors as `replay_replies`."""
    for r in replay_replies(endpoint, start, timeout=timeout, context=context, within=within):
        if not r.is_end:
            yield (r.topic or b""), SEQ.unpack(r.seq)[0], r.payload
