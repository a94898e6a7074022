"""`kvevents doctor --nats`: the checklist for a kvevents JetStream stream, with a hint per failure.

Built on kvevents.jetstream.admin.stream_report; the checks and the report type are
those of kvevents.doctor.zeromq, so the CLI renders both the same way.
"""

from __future__ import annotations

from kvevents.doctor.zeromq import DoctorReport
from kvevents.jetstream.admin import SourceReport, StreamReport, stream_report
from kvevents.jetstream.link import NatsOptions, NatsUnavailable
from kvevents.jetstream.signing import SignKey

__all__ = ["nats_doctor"]

_LISTED = 20  # sources named in one check's detail; the rest are counted


def _listing(items: list[str]) -> str:
    """The first `_LISTED` items joined, then how many more: a long fleet must not flood one check's detail."""
    more = len(items) - _LISTED
    return "; ".join(items[:_LISTED]) + (f"; ... and {more} more" if more > 0 else "")


def _signatures(rep: DoctorReport, sources: list[SourceReport], sign_key: SignKey) -> None:
    """Check "signatures": fail naming each source whose newest messages `sign_key` does not verify."""
    bad = [f"{s.source}/{s.rank} ({', '.join(s.refused)})" for s in sources if s.refused]
    if bad:
        rep.add(
            "signatures",
            "fail",
            f"{len(bad)} of {len(sources)} source(s) not signed by key {sign_key.key_id}: {_listing(bad)}",
            "do the bridges run with the same --sign-key file? is anything else allowed to publish on "
            "kvevents.<stream>.> (give that permission to the bridges only)?",
        )
    else:
        rep.add("signatures", "ok", f"every source's newest messages are signed by key {sign_key.key_id}")


def nats_doctor(
    nats: NatsOptions,
    stream: str,
    *,
    timeout: float = 5.0,
    stale_after_s: float = 5.0,
    sign_key: SignKey | None = None,
) -> DoctorReport:
    """Reachable, stream exists, sources seen, (with `sign_key`) signatures, newest snapshot ages,
    lag: one check each."""
    rep = DoctorReport(f"{nats.redacted()} stream {stream}", None)
    sr = _reach(rep, nats, stream, timeout, sign_key)
    if sr is None or not _stream_exists(rep, sr, stream) or not _sources(rep, sr):
        return rep
    if sign_key is not None:
        _signatures(rep, sr.sources, sign_key)
    _snapshots(rep, sr)
    _lag(rep, sr, stale_after_s)
    return rep


def _reach(
    rep: DoctorReport, nats: NatsOptions, stream: str, timeout: float, sign_key: SignKey | None
) -> StreamReport | None:
    """Check "nats reachable": fetch the stream's report; None (check failed) when the server does not answer."""
    try:
        sr = stream_report(nats, stream, timeout=timeout, sign_key=sign_key)
    except NatsUnavailable as exc:
        rep.add(
            "nats reachable",
            "fail",
            str(exc),
            "is nats-server running with JetStream (-js)? check the --nats URL (a cluster takes several, "
            "comma-separated) and credentials / TLS (KVEVENTS_NATS_CREDS, KVEVENTS_NATS_TLS_CA ...)",
        )
        return None
    rep.add("nats reachable", "ok", nats.redacted())
    return sr


def _stream_exists(rep: DoctorReport, sr: StreamReport, stream: str) -> bool:
    """Check "stream exists": its size and seqs, and fill the report's `seen`; False when there is no such stream."""
    if not sr.exists:
        rep.add(
            "stream exists",
            "fail",
            f"no stream {stream!r}",
            f"start `kvevents bridge --stream {stream} ...` (it creates the stream) or check the name",
        )
        return False
    rep.seen = sr.as_dict()
    rep.add(
        "stream exists",
        "ok",
        f"{sr.messages} messages, {sr.bytes} bytes, seqs {sr.first_seq}..{sr.last_seq}, max age {sr.max_age_s or 0:g}s",
    )
    return True


def _sources(rep: DoctorReport, sr: StreamReport) -> bool:
    """Check "sources": each source/rank with its batches and newest seq; False when no kvevents subject is stored."""
    if not sr.sources:
        rep.add("sources", "fail", "no kvevents subjects stored", "is a bridge running and are its engines publishing?")
        return False
    rep.add(
        "sources",
        "ok",
        _listing(
            [
                f"{s.source} rank {s.rank}: {s.live_messages} batches"
                + (f", newest seq {s.newest_seq}" if s.newest_seq is not None else "")
                for s in sr.sources
            ]
        ),
    )
    return True


def _snapshots(rep: DoctorReport, sr: StreamReport) -> None:
    """Check "snapshots": warn when a source has none (a cold router cannot start from one) or they near the max age."""
    missing = [f"{s.source}/{s.rank}" for s in sr.sources if s.snapshot_seq is None]
    ages = [s.snapshot_age_s for s in sr.sources if s.snapshot_age_s is not None]
    detail = f"newest snapshot {min(ages):.1f}s old, oldest of the newest {max(ages):.1f}s" if ages else "none stored"
    if missing:
        rep.add(
            "snapshots",
            "warn",
            f"{detail}; none for {', '.join(missing)}",
            "the bridge stores snapshots only for engines with a replay endpoint (NAME=LIVE,REPLAY) "
            "that answer KVE/SNAPSHOT; without one a cold router waits for seq 0 or starts clean",
        )
    elif sr.max_age_s and ages and max(ages) > sr.max_age_s / 2:
        rep.add(
            "snapshots",
            "warn",
            detail,
            "snapshots older than half the stream's max age: is --snapshot-every "
            "well below --max-age, and is the bridge running?",
        )
    else:
        rep.add("snapshots", "ok", detail)


def _lag(rep: DoctorReport, sr: StreamReport, stale_after_s: float) -> None:
    """Check "lag": warn for sources whose newest batch is older than `stale_after_s` (live ones heartbeat)."""
    lagging = [
        f"{s.source}/{s.rank} {s.newest_age_s:.1f}s"
        for s in sr.sources
        if s.newest_age_s is not None and s.newest_age_s > stale_after_s
    ]
    consumers = ", ".join(f"{k} {v} pending" for k, v in sorted(sr.consumers.items()))
    if lagging:
        rep.add(
            "lag",
            "warn",
            f"newest batch older than {stale_after_s:g}s: {', '.join(lagging)}"
            + (f"; durable consumers: {consumers}" if consumers else ""),
            "engines heartbeat, so a live source's newest batch is fresh: is its bridge running and the engine up?",
        )
    else:
        rep.add(
            "lag",
            "ok",
            "every source's newest batch is fresh" + (f"; durable consumers: {consumers}" if consumers else ""),
        )
