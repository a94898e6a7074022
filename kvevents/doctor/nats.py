"""`kvevents doctor --nats`: the checklist for a kvevents JetStream stream, with a hint per failure.

Built on kvevents.jetstream.admin.stream_report; the checks and the report type are
those of kvevents.doctor.zeromq, so the CLI renders both the same way.
"""

from __future__ import annotations

from kvevents.doctor.zeromq import DoctorReport
from kvevents.jetstream.admin import SourceReport, stream_report
from kvevents.jetstream.link import NatsOptions, NatsUnavailable
from kvevents.jetstream.signing import SignKey

__all__ = ["nats_doctor"]

_LISTED = 20  # sources named in one check's detail; the rest are counted


def _listing(items: list[str]) -> str:
    more = len(items) - _LISTED
    return "; ".join(items[:_LISTED]) + (f"; ... and {more} more" if more > 0 else "")


def _signatures(rep: DoctorReport, sources: list[SourceReport], sign_key: SignKey) -> None:
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
        return rep
    rep.add("nats reachable", "ok", nats.redacted())
    if not sr.exists:
        rep.add(
            "stream exists",
            "fail",
            f"no stream {stream!r}",
            f"start `kvevents bridge --stream {stream} ...` (it creates the stream) or check the name",
        )
        return rep
    rep.seen = sr.as_dict()
    rep.add(
        "stream exists",
        "ok",
        f"{sr.messages} messages, {sr.bytes} bytes, seqs {sr.first_seq}..{sr.last_seq}, max age {sr.max_age_s or 0:g}s",
    )
    if not sr.sources:
        rep.add("sources", "fail", "no kvevents subjects stored", "is a bridge running and are its engines publishing?")
        return rep
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
    if sign_key is not None:
        _signatures(rep, sr.sources, sign_key)
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
    return rep
