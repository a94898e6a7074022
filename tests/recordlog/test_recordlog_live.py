"""kvevents.recordlog.live and .republish: the record, fetch and replay loops the CLI drives, run as a
library against real publishers and subscribers on 127.0.0.1 and real log files."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvevents.events import BatchEncoder
from kvevents.feed import Delivery, Reset
from kvevents.recordlog import Recorder, RecordWriter, read_records
from kvevents.recordlog.live import LiveRecording, drain_feed, fetch_replay
from kvevents.recordlog.republish import Republisher, count_by_source, first_record, publisher_config
from kvevents.testing.zeromq import EPH, chain_events, collect
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.subscriber import Source, Subscriber
from tests.helpers.recordlog import heartbeat_when_short

_enc = BatchEncoder()


def _payload(events: list, epoch: int | None = 7, rank: int = 0) -> bytes:
    return _enc.encode(1700000000.0, events, rank, epoch)


def _log(path: Path, payloads: list[bytes], source: str = "w0", topic: str = "kv", epoch: int | None = 7) -> Path:
    with RecordWriter(path) as w:
        for seq, p in enumerate(payloads):
            w.write(p, source=source, topic=topic, seq=seq, epoch=epoch, dp_rank=0)
    return path


@pytest.mark.parametrize("lost", [0, 3], ids=["all-live", "all-lost-live"])
def test_a_live_recording_writes_the_snapshot_then_counted_batches(tmp_path: Path, lost: int) -> None:
    """The three batches reach the log live, or (none of them sent live, as when the PUB socket had
    not yet seen the subscription) through the replay the next heartbeat's sequence number asks for."""
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0.0)
    out = tmp_path / "rec.kvlog"
    try:
        for events in chain_events(1, 2):  # before the recording: reaches the log as the snapshot
            pub.publish(events)
        src = Source(pub.endpoint, pub.replay_endpoint, "w0")
        writer = RecordWriter(out)
        rec = Recorder(writer, count=3, start="snapshot")
        feed = Subscriber([src], on_delivery=rec.on_delivery, on_reset=rec.on_reset)
        session = LiveRecording(feed, rec, writer, sources=[src], duration=10.0)
        ticks: list[int] = []
        try:
            session.open()
            assert rec.snapshots_taken == 1  # held, written before the first batch after it
            pub.drop_live(lost)
            for events in chain_events(10, 3):
                pub.publish(events)
            session.wait(on_tick=heartbeat_when_short(pub, rec, 3, ticks))
        finally:
            session.close()
        assert rec.error is None and rec.batches == 3 and rec.snapshot_batches >= 1 and not session.nothing_received()
        assert ticks and ticks[-1] <= 3
        kinds = [r.kind for r in read_records(out)]
        assert kinds[0] == "reset" and "snapshot" in kinds and kinds.count("live") + kinds.count("replay") == 3
    finally:
        pub.close(0)


def test_a_source_without_snapshots_is_told_and_recorded_from_its_oldest_batch(tmp_path: Path) -> None:
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0.0, snapshots=False)
    missing: list[str] = []
    try:
        src = Source(pub.endpoint, pub.replay_endpoint, "w0")
        writer = RecordWriter(tmp_path / "nosnap.kvlog")
        rec = Recorder(writer, count=1, start="snapshot")
        feed = Subscriber([src], on_delivery=rec.on_delivery, on_reset=rec.on_reset)
        session = LiveRecording(
            feed,
            rec,
            writer,
            sources=[src],
            duration=5.0,
            on_no_snapshot=lambda name, exc: missing.append(name),
            snapshot_timeout_s=0.3,
        )
        try:
            session.open()
            pub.publish(chain_events(1, 1)[0])
            session.wait(on_tick=heartbeat_when_short(pub, rec, 1, []))
        finally:
            session.close()
        assert missing == ["w0"] and rec.snapshots_taken == 0 and rec.batches == 1
    finally:
        pub.close(0)


def test_silence_is_told_once_and_the_duration_ends_the_wait(tmp_path: Path) -> None:
    now = [0.0]
    src = Source("tcp://127.0.0.1:1", None, "nobody")  # nothing listens there: nothing arrives
    writer = RecordWriter(tmp_path / "silent.kvlog")
    rec = Recorder(writer, start="now")
    feed = Subscriber([src], on_delivery=rec.on_delivery, on_reset=rec.on_reset, start="now")
    told: list[str] = []

    def clock() -> float:
        now[0] += 0.5  # every look at the clock: half a second later
        return now[0]

    session = LiveRecording(feed, rec, writer, sources=[src], duration=4.0, clock=clock)
    try:
        session.open()
        session.wait(on_silence=lambda: told.append("silent"), silence_s=3.0)
    finally:
        session.close()
    assert told == ["silent"] and session.nothing_received() and writer.closed


def test_fetch_writes_the_replay_buffer_and_leaves_no_file_when_nothing_answers(tmp_path: Path) -> None:
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0.0)
    try:
        for events in chain_events(1, 5):
            pub.publish(events)
        assert pub.replay_endpoint is not None
        res = fetch_replay(pub.replay_endpoint, 2, str(tmp_path / "f.kvlog"), "w0", timeout=2.0)
        assert (res.batches, res.first_seq, res.last_seq) == (3, 2, 4)
        assert [(r.kind, r.seq, r.source) for r in read_records(tmp_path / "f.kvlog")] == [
            ("replay", 2, "w0"),
            ("replay", 3, "w0"),
            ("replay", 4, "w0"),
        ]
    finally:
        pub.close(0)
    gone = tmp_path / "gone.kvlog"
    with pytest.raises(Exception, match="(?i)no|timed|reply"):
        fetch_replay("tcp://127.0.0.1:1", 0, str(gone), "x", timeout=0.2)
    assert not gone.exists()


class _StoredStream:
    """A feed over a stored stream, scripted: polls return these lists, then `synced` turns on."""

    def __init__(self, polls: list[list], synced_after: int | None) -> None:
        self.polls, self.synced_after, self.n = polls, synced_after, 0
        self.error: BaseException | None = None

    @property
    def synced(self) -> bool:
        return self.synced_after is not None and self.n > self.synced_after

    def poll(self, timeout_s: float) -> list:
        self.n += 1
        return self.polls.pop(0) if self.polls else []


def _delivery(seq: int) -> Delivery:
    from kvevents.events import decode_batch

    p = _payload([])
    return Delivery("w0", seq, decode_batch(p), p, "", "live", 0, 7, "nats://x", 1.0)


def test_drain_reads_until_caught_up_and_says_when_it_was_not() -> None:
    got: list = []
    feed = _StoredStream([[_delivery(0), _delivery(1)], [Reset("w0", 0, "snapshot")], []], synced_after=2)
    res = drain_feed(feed, got.append, got.append, timeout=5.0)
    assert (res.batches, res.resets, res.synced) == (2, 1, True) and len(got) == 3
    t = [0.0]

    def clock() -> float:
        t[0] += 1.0
        return t[0]

    never = _StoredStream([], synced_after=None)
    res = drain_feed(never, got.append, got.append, timeout=3.0, clock=clock)
    assert (res.batches, res.resets, res.synced) == (
        0,
        0,
        False,
    ) and never.n == 4  # t0 = 1; clock 2, 3, 4 are within 3 s, 5 is not
    broken = _StoredStream([], synced_after=None)
    broken.error = ConnectionError("stream gone")
    with pytest.raises(ConnectionError):
        drain_feed(broken, got.append, got.append, timeout=3.0)


def test_republishing_keeps_the_recorded_topic_and_epoch_and_skips_undecodable_records(tmp_path: Path) -> None:
    good = [_payload(e, epoch=None) for e in chain_events(1, 4)]  # strict 3-element batches: sent as they are
    path = _log(tmp_path / "log.kvlog", [good[0], good[1], b"\xc1 not msgpack", good[2], good[3]])
    assert count_by_source(str(path)) == (5, {"w0": 5})
    first = first_record(str(path), {}, None)
    assert first is not None and first.topic == "kv"
    pub = Publisher(publisher_config(first, EPH, EPH, None, 0.2, True))  # a heartbeat: the subscriber joins, replays
    sub = None
    try:
        assert pub.epoch == 7 and pub.config.topic == "kv"
        sub = Subscriber([Source(pub.endpoint, pub.replay_endpoint, "r")], topic="kv")
        sub.poll(0.2)
        skipped: list[int] = []
        progress: list[int] = []
        rep = Republisher(pub, str(path), {}, rate=None)
        rep.run(on_damage=lambda d: None, on_progress=progress.append, on_skip=lambda r, exc: skipped.append(r.index))
        assert (rep.sent, rep.skipped, rep.loops) == (4, 1, 1) and skipped == [2] and progress[0] == 0

        def batches(got: list) -> list[bytes]:
            return [d.payload for d in got if isinstance(d, Delivery) and d.batch.events]

        assert batches(collect(sub, lambda got: len(batches(got)) >= 4)) == good  # the original bytes
    finally:
        if sub is not None:
            sub.stop()
        pub.close(0)


def test_a_recorded_epoch_out_of_range_gets_a_fresh_one(tmp_path: Path) -> None:
    path = _log(tmp_path / "odd.kvlog", [_payload([])], epoch=2**63)
    cfg = publisher_config(first_record(str(path), {}, None), EPH, None, "t", 1.0, True)
    assert cfg.epoch is None and cfg.topic == "t"
