"""StreamOrder (the JetStream consumer's ordering rules) with a stepped clock: no NATS, no sleeps."""

from __future__ import annotations

from kvevents.jetstream.feed import pick_snapshots
from kvevents.jetstream.link import H_EPOCH, H_FROM, H_KIND, H_PART, H_PARTS, H_SEQ, H_SNAP
from kvevents.jetstream.order import LiveMsg, Snapshot, SnapshotAssembler, StreamOrder
from kvevents.zeromq.subscriber import Delivery, Reset
from tests.helpers.clock import FakeClock as Clock
from tests.helpers.payloads import one_store as payload


def live(seq: int, epoch: int | None = 7, source: str = "w0") -> LiveMsg:
    return LiveMsg(source, 0, seq, epoch, payload(100 + seq))


def snap(seq: int, epoch: int | None = 7, hashes: tuple[int, ...] = (1, 2)) -> Snapshot:
    return Snapshot("w0", 0, seq, epoch, [payload(h) for h in hashes], start=1)


def order(clock: Clock | None = None) -> StreamOrder:
    return StreamOrder(reorder_wait_s=1.0, resync_timeout_s=10.0, clock=clock or Clock())


def seqs(items: list) -> list[tuple[str, int]]:
    return [(d.kind, d.seq) if isinstance(d, Delivery) else ("reset", -1) for d in items]


def test_in_order_from_seq_zero_and_duplicates_dropped():
    o = order()
    for s in (0, 1, 1, 2, 0, 3):
        o.live(live(s))
    assert seqs(o.take()) == [("live", 0), ("live", 1), ("live", 2), ("live", 3)]
    assert o.counters["duplicates"] == 2 and o.counters["clean_starts"] == 1


def test_out_of_order_within_the_wait_is_reordered_without_reset():
    clock = Clock()
    o = order(clock)
    o.live(live(0))
    o.live(live(2))  # 1 stored later (a bridge's republish)
    clock.t += 0.5
    o.tick()
    o.live(live(1))
    assert seqs(o.take()) == [("live", 0), ("live", 1), ("live", 2)]
    assert o.counters["gaps"] == 0 and o.counters["resets"] == 0


def test_lasting_gap_resets_then_next_snapshot_resyncs():
    clock = Clock()
    o = order(clock)
    o.live(live(0))
    o.live(live(5))
    clock.t += 1.5
    o.tick()
    out = o.take()
    assert seqs(out) == [("live", 0), ("reset", -1)] and out[1].reason == "gap"
    o.live(live(6))
    o.snapshot(snap(4))  # covers 1..4: delivery goes on at 5
    assert seqs(o.take()) == [("snapshot", 4), ("snapshot", 4), ("live", 5), ("live", 6)]
    assert o.counters["gaps"] == 1 and o.counters["snapshots_applied"] == 1


def test_snapshot_behind_the_position_is_ignored_and_one_ahead_kept_for_a_gap():
    clock = Clock()
    o = order(clock)
    for s in range(4):
        o.live(live(s))
    o.take()
    o.snapshot(snap(2, hashes=(100, 101, 102)))  # the state delivered at seq 2 (anti-entropy agrees)
    assert o.take() == [] and o.counters["snapshots_behind"] == 1 and o.counters["anti_entropy_checks"] == 1
    o.snapshot(snap(9))  # ahead: 4..9 should still come
    assert o.take() == []
    o.live(live(10))  # they never do
    clock.t += 1.5
    o.tick()
    assert seqs(o.take()) == [("reset", -1), ("snapshot", 9), ("snapshot", 9), ("live", 10)]


def test_new_epoch_resets_and_waits_for_its_snapshot_old_epoch_is_stale():
    clock = Clock()
    o = order(clock)
    o.live(live(0, epoch=7))
    o.live(live(1, epoch=7))
    o.take()
    o.live(live(3, epoch=8))  # the restarted engine, its first batches unseen
    assert o.take() == []  # adopted once epoch 7 has been quiet for reorder_wait_s (issue 28)
    clock.t += 1.0
    o.tick()
    out = o.take()
    assert seqs(out) == [("reset", -1)] and out[0].reason == "restart" and isinstance(out[0], Reset)
    o.live(live(2, epoch=7))  # a late batch of the old process (a slow bridge)
    assert o.take() == [] and o.counters["stale_epoch"] == 1
    o.snapshot(snap(2, epoch=8))
    assert seqs(o.take()) == [("snapshot", 2), ("snapshot", 2), ("live", 3)]
    assert o.counters["restarts"] == 1 and o.streams[("w0", 0)].epoch == 8


def test_new_epoch_starting_at_zero_needs_no_snapshot():
    clock = Clock()
    o = order(clock)
    o.live(live(0, epoch=7))
    o.live(live(1, epoch=7))
    o.take()
    o.live(live(0, epoch=9))
    o.live(live(1, epoch=9))
    clock.t += 1.0
    o.tick()
    assert seqs(o.take()) == [("reset", -1), ("live", 0), ("live", 1)]


def test_no_snapshot_within_the_timeout_starts_clean_counted_as_loss():
    clock = Clock()
    o = order(clock)
    o.live(live(5))  # first contact, no snapshot stored, seq 0 long gone
    clock.t += 5
    o.tick()
    assert o.take() == []
    clock.t += 6
    o.tick()
    assert seqs(o.take()) == [("live", 5)] and o.counters["losses"] == 1


def _headers(kind: str, sid: str, seq: int, **extra: str) -> dict[str, str]:
    return {H_KIND: kind, H_SNAP: sid, H_SEQ: str(seq), H_EPOCH: "7", H_FROM: "3", **extra}


def test_pick_snapshots_takes_the_newest_complete_one():
    subj = "kvevents.KV.w0.0.snap"
    msgs = [
        (subj, _headers("part", "a-1", 5, **{H_PART: "0"}), b"p0", 1),
        (subj, _headers("end", "a-1", 5, **{H_PARTS: "1"}), b"", 2),
        (subj, _headers("part", "b-1", 9, **{H_PART: "1"}), b"q1", 3),  # part 0 purged: incomplete
        (subj, _headers("end", "b-1", 9, **{H_PARTS: "2"}), b"", 4),
        (subj, _headers("part", "a-2", 12, **{H_PART: "0"}), b"r0", 5),  # no end marker yet
    ]
    got = pick_snapshots(msgs)
    s = got[("w0", 0)]
    assert (s.seq, s.epoch, s.payloads, s.start) == (5, 7, [b"p0"], 3)


def test_assembler_forgets_abandoned_snapshots():
    a = SnapshotAssembler(keep=2)
    for i in range(4):
        a.add_part(f"s{i}", 0, b"x")
    assert a.add_end("s0", 1, {}) is None
