"""What `kvevents record` says it recorded (issue 29, item 6): the figures of the log it wrote, not
of the feed (history replayed and left out is not in the log), and no file when nothing was
written. Real publishers and subscribers on 127.0.0.1, real files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from kvevents.recordlog import Recorder, RecordWriter, read_records
from kvevents.recordlog.live import LiveRecording
from kvevents.testing.zeromq import EPH, chain_events
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.subscriber import Source, Subscriber
from tests.helpers.recordlog import heartbeat_when_short


def _session(pub: Publisher, out: Path, count: int, duration: float = 10.0) -> LiveRecording:
    src = Source(pub.endpoint, pub.replay_endpoint, "w0")
    writer = RecordWriter(out)
    rec = Recorder(writer, count=count, start="snapshot")
    feed = Subscriber([src], on_delivery=rec.on_delivery, on_reset=rec.on_reset)  # replays from the oldest
    return LiveRecording(feed, rec, writer, sources=[src], duration=duration)


def test_the_summary_counts_what_the_log_holds(tmp_path: Path) -> None:
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0.0)
    out = tmp_path / "rec.kvlog"
    try:
        for events in chain_events(1, 30):  # history: in the snapshot, replayed by the feed, left out
            pub.publish(events)
        session = _session(pub, out, count=4)
        try:
            session.open()
            for events in chain_events(100, 4):
                pub.publish(events)
            session.wait(on_tick=heartbeat_when_short(pub, session.recorder, 4, []))
        finally:
            session.close()
    finally:
        pub.close(0)
    held = Counter(r.kind for r in read_records(out))
    lines = session.summary("snapshot")
    assert lines[0].startswith("recorded 4 batches in ") and f"-> {out} ({out.stat().st_size} bytes)" in lines[0]
    want = ", ".join(f"{held[k]} {k}" for k in ("snapshot", "replay", "live") if held[k])
    assert lines[1] == f"the log holds {want} batches and {held['reset']} reset marker", lines
    assert session.feed.counters()["replayed"] > held["replay"]  # what the feed did is not what the log holds
    assert "replayed" not in " ".join(lines) and "left out" in lines[2]


def test_nothing_written_leaves_no_file(tmp_path: Path) -> None:
    pub = Publisher(endpoint=EPH, replay_endpoint=None, heartbeat_interval_s=0.0)
    out = tmp_path / "none.kvlog"
    try:
        session = _session(pub, out, count=1, duration=0.2)
        try:
            session.open()
            session.wait()
        finally:
            session.close()
    finally:
        pub.close(0)
    assert session.removed_empty and not out.exists() and session.nothing_received()
    assert session.summary("snapshot")[0].endswith(f"no file left at {out}")


def test_an_appended_log_is_never_removed(tmp_path: Path) -> None:
    out = tmp_path / "kept.kvlog"
    RecordWriter(out).close()  # an existing, empty log the user asked to continue
    pub = Publisher(endpoint=EPH, replay_endpoint=None, heartbeat_interval_s=0.0)
    try:
        src = Source(pub.endpoint, None, "w0")
        writer = RecordWriter(out, append=True)
        rec = Recorder(writer, count=1)
        feed = Subscriber([src], on_delivery=rec.on_delivery, on_reset=rec.on_reset)
        session = LiveRecording(feed, rec, writer, sources=[src], duration=0.2)
        try:
            session.open()
            session.wait()
        finally:
            session.close()
    finally:
        pub.close(0)
    assert out.exists() and not session.removed_empty
