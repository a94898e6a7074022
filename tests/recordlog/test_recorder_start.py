"""Recorder start modes (where a capture begins), driven step by step with real Delivery/Reset
objects and a real log: no sockets, so every ordering the subscriber can produce is covered."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvevents.events import AllBlocksCleared, decode_batch
from kvevents.recordlog import Recorder, RecordWriter, read_records
from tests.helpers.recordlog import payload

sub = pytest.importorskip("kvevents.zeromq.subscriber")
PAY = payload([], epoch=7)
SNAP = payload([AllBlocksCleared()], epoch=7)


def _d(seq: int, kind: str, source: str = "w0", rank: int = 0, epoch: int = 7) -> object:
    p = payload([], epoch=epoch, rank=rank)
    return sub.Delivery(source, seq, decode_batch(p), p, "", kind, rank, epoch, "tcp://x:1", 1.0 + seq)


def _log(tmp_path: Path, start: str, feed: list, snapshot: tuple | None = None) -> tuple[list, Recorder]:
    p = tmp_path / f"{start}.kvlog"
    with RecordWriter(p) as w:
        rec = Recorder(w, start=start)  # type: ignore[arg-type]
        if snapshot is not None:
            rec.begin_with_snapshot("w0", *snapshot)
        for item in feed:
            (rec.on_reset if isinstance(item, sub.Reset) else rec.on_delivery)(item)
        rec.stop()
    return [(r.kind, r.seq) for r in read_records(p)], rec


def test_oldest_keeps_everything(tmp_path: Path) -> None:
    got, rec = _log(tmp_path, "oldest", [_d(0, "replay"), _d(1, "replay"), _d(2, "live")])
    assert got == [("replay", 0), ("replay", 1), ("live", 2)] and rec.history_dropped == 0


def test_now_starts_each_stream_at_its_first_live_batch(tmp_path: Path) -> None:
    feed = [
        _d(0, "replay"),
        _d(1, "replay"),
        _d(0, "replay", rank=1),
        _d(2, "live"),
        sub.Reset("w0", 1, "first", 7),
        _d(5, "snapshot", rank=1),
        _d(3, "replay"),
        _d(6, "live", rank=1),
        sub.Reset("w0", 0, "gap", 7),
        _d(9, "snapshot"),
    ]
    got, rec = _log(tmp_path, "now", feed)
    # rank 1's first-join reset and snapshot precede its first live batch; rank 0's later repair is kept
    assert got == [("live", 2), ("replay", 3), ("live", 6), ("reset", None), ("snapshot", 9)]
    assert rec.history_dropped == 5 and rec.received == 10


def test_snapshot_leaves_out_what_the_snapshot_already_holds(tmp_path: Path) -> None:
    feed = [_d(s, "replay") for s in range(5)] + [_d(5, "live"), _d(6, "live")]
    got, rec = _log(tmp_path, "snapshot", feed, ([SNAP, SNAP], 4))
    assert got == [("reset", None), ("snapshot", 4), ("snapshot", 4), ("live", 5), ("live", 6)]
    assert rec.snapshot_batches == 2 and rec.batches == 2 and rec.history_dropped == 5


def test_snapshot_filter_ends_at_a_restart_or_a_subscriber_reset(tmp_path: Path) -> None:
    restarted = [_d(0, "replay"), _d(2, "live", epoch=8), _d(3, "live", epoch=8)]  # a new epoch starts at low seqs
    got, _ = _log(tmp_path, "snapshot", restarted, ([SNAP], 10))
    assert got == [("reset", None), ("snapshot", 10), ("live", 2), ("live", 3)]
    # the subscriber could not replay from 0 and resyncs by its own snapshot: one starting state, its own
    resync = [_d(9, "replay"), sub.Reset("w0", 0, "first", 7), _d(12, "snapshot"), _d(13, "live")]
    (tmp_path / "b").mkdir()
    got, rec = _log(tmp_path / "b", "snapshot", resync, ([SNAP], 10))
    assert got == [("reset", None), ("snapshot", 12), ("live", 13)] and rec.snapshot_batches == 0


def test_a_held_snapshot_is_written_at_stop(tmp_path: Path) -> None:
    p = tmp_path / "idle.kvlog"
    with RecordWriter(p) as w:
        rec = Recorder(w, start="snapshot")
        assert rec.begin_with_snapshot("w0", [SNAP, SNAP], 4) == 2
        rec.on_delivery(_d(3, "replay"))  # already in the snapshot
        rec.stop()
        rec.on_delivery(_d(5, "live"))  # after stop: nothing
    assert [(r.kind, r.seq) for r in read_records(p)] == [("reset", None), ("snapshot", 4), ("snapshot", 4)]
    assert rec.snapshot_batches == 2 and rec.history_dropped == 1


def test_snapshot_of_a_publisher_that_published_nothing_writes_nothing(tmp_path: Path) -> None:
    got, rec = _log(tmp_path, "snapshot", [_d(0, "live")], ([SNAP], None))
    assert got == [("live", 0)] and rec.snapshots_taken == 1


def test_unknown_start_is_refused(tmp_path: Path) -> None:
    with RecordWriter(tmp_path / "x.kvlog") as w, pytest.raises(ValueError, match="start must be one of"):
        Recorder(w, start="later")  # type: ignore[arg-type]
