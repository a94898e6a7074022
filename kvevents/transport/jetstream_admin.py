"""Looking at a kvevents JetStream stream from outside: what `kvevents doctor --nats` reports.

One-shot synchronous calls (each opens and closes its own connection): message counts per
subject, and a per-source report (batches stored, newest seq, newest snapshot and its age).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from kvevents.transport.nats_link import (
    H_KIND, H_PARTS, H_SEQ, NatsOptions, NatsUnavailable, check_token, close, connect, parse_subject, snap_subject,
    stream_filter, live_subject,
)

__all__ = ["SourceReport", "StreamReport", "nats_doctor", "stream_report", "subject_counts"]


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


def _age(msg: Any, now: float) -> float | None:
    t = getattr(msg, "time", None)
    if t is None:
        return None
    return max(0.0, now - t.timestamp())


def stream_report(nats: NatsOptions, stream: str, *, timeout: float = 5.0) -> StreamReport:
    """The stream's state, its sources (counts, newest seq, snapshot age) and durable consumers' lag."""
    check_token("stream", stream)
    from nats.js.errors import NotFoundError

    async def fn(js: Any) -> StreamReport:
        try:
            info = await js.stream_info(stream, subjects_filter=stream_filter(stream))
        except NotFoundError:
            return StreamReport(stream, False)
        st = info.state
        rep = StreamReport(stream, True, int(st.messages), int(st.bytes), int(st.first_seq), int(st.last_seq),
                           info.config.max_age)
        now = time.time()
        keys = sorted({(p[0], p[1]) for p in map(parse_subject, st.subjects or {}) if p is not None})
        for source, rank in keys:
            sr = SourceReport(source, rank, int((st.subjects or {}).get(live_subject(stream, source, rank), 0)))
            if sr.live_messages:
                try:
                    m = await js.get_last_msg(stream, live_subject(stream, source, rank))
                    sr.newest_seq = int((m.headers or {}).get(H_SEQ, "-1"))
                    sr.newest_age_s = _age(m, now)
                except NotFoundError:
                    pass
            try:
                m = await js.get_last_msg(stream, snap_subject(stream, source, rank))
                if (m.headers or {}).get(H_KIND) == "end":
                    sr.snapshot_seq = int(m.headers.get(H_SEQ, "-1"))
                    sr.snapshot_parts = int(m.headers.get(H_PARTS, "0"))
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


def nats_doctor(nats: NatsOptions, stream: str, *, timeout: float = 5.0, stale_after_s: float = 5.0) -> Any:
    """`kvevents doctor --nats`: reachable, stream exists, sources seen, snapshot ages, lag (a DoctorReport)."""
    from kvevents.doctor import DoctorReport

    rep = DoctorReport(f"{nats.redacted()} stream {stream}", None)
    try:
        sr = stream_report(nats, stream, timeout=timeout)
    except NatsUnavailable as exc:
        rep.add("nats reachable", "fail", str(exc), "is nats-server running with JetStream (-js)? check the --nats URL (a cluster takes several, "
                "comma-separated) and credentials / TLS (KVEVENTS_NATS_CREDS, KVEVENTS_NATS_TLS_CA ...)")
        return rep
    rep.add("nats reachable", "ok", nats.redacted())
    if not sr.exists:
        rep.add("stream exists", "fail", f"no stream {stream!r}",
                f"start `kvevents bridge --stream {stream} ...` (it creates the stream) or check the name")
        return rep
    rep.seen = sr.as_dict()
    rep.add("stream exists", "ok", f"{sr.messages} messages, {sr.bytes} bytes, seqs {sr.first_seq}..{sr.last_seq}, "
            f"max age {sr.max_age_s or 0:g}s")
    if not sr.sources:
        rep.add("sources", "fail", "no kvevents subjects stored", "is a bridge running and are its engines publishing?")
        return rep
    rep.add("sources", "ok", "; ".join(f"{s.source} rank {s.rank}: {s.live_messages} batches"
                                       + (f", newest seq {s.newest_seq}" if s.newest_seq is not None else "")
                                       for s in sr.sources))
    missing = [f"{s.source}/{s.rank}" for s in sr.sources if s.snapshot_seq is None]
    ages = [s.snapshot_age_s for s in sr.sources if s.snapshot_age_s is not None]
    detail = f"newest snapshot {min(ages):.1f}s old, oldest of the newest {max(ages):.1f}s" if ages else "none stored"
    if missing:
        rep.add("snapshots", "warn", f"{detail}; none for {', '.join(missing)}",
                "the bridge stores snapshots only for engines with a replay endpoint (NAME=LIVE,REPLAY) "
                "that answer KVE/SNAPSHOT; without one a cold router waits for seq 0 or starts clean")
    elif sr.max_age_s and ages and max(ages) > sr.max_age_s / 2:
        rep.add("snapshots", "warn", detail, "snapshots older than half the stream's max age: is --snapshot-every "
                "well below --max-age, and is the bridge running?")
    else:
        rep.add("snapshots", "ok", detail)
    lagging = [f"{s.source}/{s.rank} {s.newest_age_s:.1f}s" for s in sr.sources
               if s.newest_age_s is not None and s.newest_age_s > stale_after_s]
    consumers = ", ".join(f"{k} {v} pending" for k, v in sorted(sr.consumers.items()))
    if lagging:
        rep.add("lag", "warn", f"newest batch older than {stale_after_s:g}s: {', '.join(lagging)}"
                + (f"; durable consumers: {consumers}" if consumers else ""),
                "engines heartbeat, so a live source's newest batch is fresh: is its bridge running and the engine up?")
    else:
        rep.add("lag", "ok", "every source's newest batch is fresh" + (f"; durable consumers: {consumers}" if consumers else ""))
    return rep
