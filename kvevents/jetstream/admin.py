"""Looking at a kvevents JetStream stream from outside (what `kvevents doctor --nats` checks).

One-shot synchronous calls (each opens and closes its own connection): every stream's last
sequence, message counts per subject, and a per-source report (batches stored, newest seq, newest snapshot and its age; with
the stream's sign key, whether its newest messages are authentic).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from kvevents.jetstream.link import (
    H_KIND,
    H_PARTS,
    H_SEQ,
    NatsOptions,
    NatsUnavailable,
    check_token,
    close,
    connect,
    live_subject,
    parse_subject,
    snap_subject,
    stream_filter,
)
from kvevents.jetstream.signing import SignKey

__all__ = ["SourceReport", "StreamReport", "stream_positions", "stream_report", "subject_counts"]


@dataclass
class SourceReport:
    """One (source, dp_rank) as stored: live batches kept, newest engine seq, newest snapshot."""

    source: str
    rank: int
    live_messages: int = 0
    newest_seq: int | None = None
    newest_age_s: float | None = None  # now - when the newest live batch was stored
    snapshot_seq: int | None = None
    snapshot_parts: int | None = None
    snapshot_age_s: float | None = None
    refused: list[str] = field(default_factory=list)  # with a sign key: why its newest messages are not authentic


@dataclass
class StreamReport:
    stream: str
    exists: bool
    messages: int = 0
    bytes: int = 0
    first_seq: int = 0
    last_seq: int = 0
    max_age_s: float | None = None
    sources: list[SourceReport] = field(default_factory=list)
    consumers: dict[str, int] = field(default_factory=dict)  # durable name -> pending messages

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["sources"] = [dict(s.__dict__) for s in self.sources]
        return out


def _run(coro: Any, timeout: float) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def _with_js(nats: NatsOptions, timeout: float, fn: Any) -> Any:
    nc = await connect(nats, give_up_after_s=timeout, on_unreachable=lambda _m: None)
    try:
        return await fn(nc.jetstream())
    finally:
        await close(nc)


def subject_counts(nats: NatsOptions, stream: str, *, timeout: float = 5.0) -> dict[str, int]:
    """Messages stored per subject of the stream ({} if there is no such stream; NatsUnavailable
    if NATS does not answer)."""
    check_token("stream", stream)
    from nats.js.errors import NotFoundError

    async def fn(js: Any) -> dict[str, int]:
        try:
            info = await js.stream_info(stream, subjects_filter=stream_filter(stream))
        except NotFoundError:
            return {}
        return dict(info.state.subjects or {})

    try:
        return _run(_with_js(nats, timeout, fn), timeout + 1.0)
    except asyncio.TimeoutError:
        raise NatsUnavailable(f"NATS at {nats.redacted()} did not answer within {timeout:g}s") from None


def _header_int(msg: Any, name: str, default: int) -> int | None:
    """A decimal header of a stored message (None when it is not one: the report shows nothing)."""
    try:
        return int((msg.headers or {}).get(name, default))
    except (TypeError, ValueError):
        return None


def stream_positions(nats: NatsOptions, *, timeout: float = 5.0) -> dict[str, int]:
    """Every stream on the server: name -> its last sequence now (NatsUnavailable if NATS does not
    answer), for a one-shot reader to check its stream's name and say how far it will read."""

    async def fn(js: Any) -> dict[str, int]:
        return {str(si.config.name): int(si.state.last_seq or 0) for si in await js.streams_info()}

    try:
        return _run(_with_js(nats, timeout, fn), timeout + 1.0)
    except asyncio.TimeoutError:
        raise NatsUnavailable(f"NATS at {nats.redacted()} did not answer within {timeout:g}s") from None


def _age(msg: Any, now: float) -> float | None:
    t = getattr(msg, "time", None)
    if t is None:
        return None
    return max(0.0, now - t.timestamp())


def _verify(sr: SourceReport, what: str, msg: Any, sign_key: SignKey | None) -> bool:
    """True when `msg` may be read: no key to check with, or signed by it (else noted in `sr.refused`)."""
    if sign_key is None:
        return True
    why = sign_key.verify(msg.subject, msg.headers or {}, msg.data or b"")
    if why is not None:
        sr.refused.append(f"newest {what}: {why.replace('_', ' ')}")
    return why is None


def stream_report(
    nats: NatsOptions, stream: str, *, timeout: float = 5.0, sign_key: SignKey | None = None
) -> StreamReport:
    """The stream's state, its sources (counts, newest seq, snapshot age, with `sign_key` whether
    their newest messages are authentic) and durable consumers' lag."""
    check_token("stream", stream)
    from nats.js.errors import NotFoundError

    async def fn(js: Any) -> StreamReport:
        try:
            info = await js.stream_info(stream, subjects_filter=stream_filter(stream))
        except NotFoundError:
            return StreamReport(stream, False)
        st = info.state
        rep = StreamReport(
            stream, True, int(st.messages), int(st.bytes), int(st.first_seq), int(st.last_seq), info.config.max_age
        )
        now = time.time()
        keys = sorted({(p[0], p[1]) for p in map(parse_subject, st.subjects or {}) if p is not None})
        for source, rank in keys:
            sr = SourceReport(source, rank, int((st.subjects or {}).get(live_subject(stream, source, rank), 0)))
            if sr.live_messages:
                try:
                    m = await js.get_last_msg(stream, live_subject(stream, source, rank))
                    if _verify(sr, "batch", m, sign_key):
                        sr.newest_seq = _header_int(m, H_SEQ, -1)
                        sr.newest_age_s = _age(m, now)
                except NotFoundError:
                    pass
            try:
                m = await js.get_last_msg(stream, snap_subject(stream, source, rank))
                if (m.headers or {}).get(H_KIND) == "end" and _verify(sr, "snapshot end marker", m, sign_key):
                    sr.snapshot_seq = _header_int(m, H_SEQ, -1)
                    sr.snapshot_parts = _header_int(m, H_PARTS, 0)
                    sr.snapshot_age_s = _age(m, now)
            except NotFoundError:
                pass
            rep.sources.append(sr)
        try:
            for ci in await js.consumers_info(stream):
                if ci.config.durable_name:
                    rep.consumers[ci.config.durable_name] = int(ci.num_pending or 0)
        except Exception:  # noqa: BLE001 - consumer listing is optional
            pass
        return rep

    try:
        return _run(_with_js(nats, timeout, fn), timeout + 5.0)
    except asyncio.TimeoutError:
        raise NatsUnavailable(f"NATS at {nats.redacted()} did not answer within {timeout:g}s") from None
