"""StreamOrder distrusting what the stream holds (issue 28), with a stepped clock: conflicts,
anti-entropy against stored snapshots, epoch changes only once the old epoch is quiet, a far-future
seq that must not wipe a worker, and the bounds on sources and ranks. No NATS, no sleeps."""

from __future__ import annotations

from kvevents.events import BatchEncoder, BlockStored
from kvevents.feed import Delivery, Reset
from kvevents.jetstream.order import LiveMsg, Snapshot, StreamOrder

ENC = BatchEncoder()


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def payload(*hashes: int) -> bytes:
    return ENC.encode(1.0, [BlockStored([h], None, [1, 2], 2, None, "GPU", None) for h in hashes], 0)


def live(seq: int, *hashes: int, epoch: int | None = 7, source: str = "w0", rank: int = 0) -> LiveMsg:
    return LiveMsg(source, rank, seq, epoch, payload(*(hashes or (100 + seq,))))


def snap(seq: int, hashes: tuple[int, ...], epoch: int | None = 7, start: int = 1) -> Snapshot:
    return Snapshot("w0", 0, seq, epoch, [payload(h) for h in hashes], start=start)


def order(clock: Clock) -> StreamOrder:
    return StreamOrder(reorder_wait_s=1.0, resync_timeout_s=10.0, clock=clock)


def kinds(items: list) -> list[tuple[str, int]]:
    return [(d.kind, d.seq) if isinstance(d, Delivery) else ("reset", -1) for d in items]


def hashes_after(items: list, start: set[int] | None = None) -> set[int]:
    """The block hashes a consumer holds after applying `items` (one source, one rank)."""
    held = set(start or ())
    for it in items:
        if isinstance(it, Reset):
            held.clear()
        else:
            held.update(h for ev in it.batch.events for h in ev.block_hashes)
    return held


def test_a_second_different_batch_for_a_delivered_seq_is_a_conflict_and_resyncs():
    """Regression: junk or a forged batch at the next seq took it; the real batch was then dropped
    as a duplicate and the state stayed wrong for good."""
    clock = Clock()
    o = order(clock)
    o.live(live(0))
    o.live(live(1, 666))  # forged: stored before the real seq 1
    o.live(live(1))  # the real one
    out = o.take()
    assert kinds(out) == [("live", 0), ("live", 1), ("reset", -1)] and out[-1].reason == "gap"
    assert o.counters["conflicts"] == 1 and o.counters.get("duplicates", 0) == 0
    o.live(live(2))
    o.snapshot(snap(0, (100,)))  # older than the conflict: cannot settle it
    assert o.take() == []
    o.snapshot(snap(1, (100, 101), start=2))  # covers seq 1: delivery goes on from it
    out = o.take()
    assert kinds(out) == [("snapshot", 1), ("snapshot", 1), ("live", 2)]
    assert hashes_after(out) == {100, 101, 102}


def test_junk_at_the_next_seq_is_not_kept_over_the_real_batch():
    clock = Clock()
    o = order(clock)
    o.live(live(0))
    o.live(LiveMsg("w0", 0, 1, 7, b"\xc1junk"))  # undecodable: counted, and remembered
    o.live(live(1))
    assert kinds(o.take()) == [("live", 0), ("reset", -1)]
    assert o.counters["bad_payloads"] == 1 and o.counters["conflicts"] == 1


def test_identical_copies_are_plain_duplicates():
    o = order(Clock())
    for s in (0, 1, 1, 0, 2):
        o.live(live(s))
    assert kinds(o.take()) == [("live", 0), ("live", 1), ("live", 2)]
    assert o.counters["duplicates"] == 2 and o.counters.get("conflicts", 0) == 0


def test_a_snapshot_behind_the_stream_heals_a_wrong_state_anti_entropy():
    """Regression: a stored snapshot was only read after a reset, so a state gone wrong without a
    reset pending (a batch the engine never published) stayed wrong."""
    clock = Clock()
    o = order(clock)
    o.live(live(0))
    o.live(live(1, 101, 999))  # what was stored at seq 1 holds a block the engine never had
    for s in range(2, 6):
        o.live(live(s))
    before = hashes_after(o.take())
    assert 999 in before
    o.snapshot(snap(3, (100, 101, 102, 103), start=40))  # the engine's true state at seq 3
    out = o.take()
    assert kinds(out) == [("reset", -1)] + [("snapshot", 3)] * 4
    assert o.counters["anti_entropy_repairs"] == 1
    assert o.take_refills()[0].start == 40  # seqs 4 and 5 are read again from stream seq 40 on
    o.live(live(4))
    o.live(live(5))
    o.refilled("w0", 0)
    out += o.take()
    assert hashes_after(out) == {100, 101, 102, 103, 104, 105}
    o.snapshot(snap(5, (100, 101, 102, 103, 104, 105)))
    assert o.take() == [] and o.counters["anti_entropy_checks"] == 1


def test_a_snapshot_ahead_is_compared_once_the_stream_reaches_it():
    clock = Clock()
    o = order(clock)
    o.live(live(0, 500))  # wrong from the start
    o.snapshot(snap(1, (100, 101)))  # ahead: seq 1 still to come
    o.live(live(1))
    out = o.take()
    assert kinds(out) == [("live", 0), ("live", 1), ("reset", -1), ("snapshot", 1), ("snapshot", 1)]
    assert hashes_after(out) == {100, 101} and o.counters["anti_entropy_repairs"] == 1
    assert o.take_refills() == []  # nothing was delivered past S


def test_one_far_future_seq_does_not_wipe_a_moving_stream():
    """Regression: one forged far-future seq became a gap after reorder_wait_s: Reset, the worker
    at 0 blocks until the next snapshot (60% of the time at 5 s snapshots)."""
    clock = Clock()
    o = order(clock)
    o.live(live(0))
    o.live(live(10**9, 1))
    seq = 1
    for _ in range(10):  # the engine goes on (heartbeats or batches every 0.4 s)
        clock.t += 0.4
        o.live(live(seq))
        seq += 1
        o.tick()
    out = o.take()
    assert not [x for x in out if isinstance(x, Reset)]
    assert [d.seq for d in out] == list(range(seq))
    assert o.counters["far_ahead_dropped"] == 1 and o.counters.get("gaps", 0) == 0
    assert o.lowest_pending_stream_seq() is None  # nothing left holding durable acks back


def test_a_stalled_stream_still_turns_into_a_gap():
    clock = Clock()
    o = order(clock)
    o.live(live(0))
    o.live(live(5))  # 1..4 lost, nothing more arrives
    clock.t += 1.0
    o.tick()
    assert kinds(o.take()) == [("live", 0), ("reset", -1)] and o.counters["gaps"] == 1


def test_a_stray_new_epoch_does_not_blind_a_live_stream():
    """Regression: one message carrying a new Kve-Epoch was adopted at once; every real batch and
    snapshot after it was dropped as belonging to a superseded epoch."""
    clock = Clock()
    o = order(clock)
    o.live(live(0))
    o.live(live(1, epoch=12345))  # the stray (forged) epoch
    o.snapshot(snap(1, (999,), epoch=12345))
    for s in range(1, 12):  # the real engine goes on
        clock.t += 0.4
        o.live(live(s))
        o.tick()
    out = o.take()
    assert [d.seq for d in out if isinstance(d, Delivery)] == list(range(12))
    assert not [x for x in out if isinstance(x, Reset)] and o.counters.get("restarts", 0) == 0
    assert o.streams[("w0", 0)].epoch == 7 and o.counters["epoch_candidates"] == 1


def test_a_real_restart_is_adopted_once_the_old_epoch_is_quiet():
    clock = Clock()
    o = order(clock)
    o.live(live(0))
    o.live(live(1))
    o.take()
    o.live(live(0, epoch=8))  # the new process
    o.live(live(1, epoch=8))
    clock.t += 0.5
    o.tick()
    assert o.take() == []
    clock.t += 0.5
    o.tick()
    out = o.take()
    assert kinds(out) == [("reset", -1), ("live", 0), ("live", 1)] and out[0].reason == "restart"
    o.live(live(2, epoch=7))
    assert o.counters["stale_epoch"] == 1 and o.streams[("w0", 0)].epoch == 8


def test_sources_and_ranks_are_bounded():
    o = StreamOrder(reorder_wait_s=1.0, max_sources=3, max_ranks=2, clock=Clock())
    for i in range(3000):
        o.live(live(0, source=f"fake{i}"))
    for r in range(5):
        o.live(live(0, source="fake0", rank=r))
    assert len({s for s, _ in o.streams}) == 3 and len([k for k in o.streams if k[0] == "fake0"]) == 2
    assert o.counters["sources_refused"] == 2997 and o.counters["ranks_refused"] == 3


def test_a_snapshot_claiming_a_far_future_seq_does_not_stall_a_cold_start():
    """Regression: a cold start on a snapshot claiming seq 10**9 dropped every real batch as a
    duplicate, and every real snapshot as behind it, for good."""
    clock = Clock()
    o = order(clock)
    o.snapshot(snap(10**9, (999,)))  # the cold start's pick (forged)
    o.take()
    for s in range(100, 110):  # the real engine, 2.5 seqs/s: it would never get there
        clock.t += 0.4
        o.live(live(s, s))
        o.tick()
    assert o.counters["positions_distrusted"] == 1
    o.snapshot(snap(104, (100, 101, 102, 103, 104)))  # the next real snapshot
    out = o.take()
    assert kinds(out)[:2] == [("reset", -1), ("snapshot", 104)]
    assert hashes_after(out) == set(range(100, 110))


def test_old_batches_read_while_catching_up_do_not_distrust_a_newer_snapshot():
    """A cold start reads from the earliest source's snapshot position: another source's older
    batches then come long after its own, newer snapshot was applied, and prove nothing."""
    clock = Clock()
    o = order(clock)
    o.catching_up = True
    o.snapshot(snap(5000, (1,)))
    for s in range(2000, 2010):
        clock.t += 0.5
        o.live(live(s))
    assert o.counters.get("positions_distrusted", 0) == 0 and o.counters["duplicates"] == 10
    o.catching_up = False
    for s in (2011, 2012):
        clock.t += 1.0
        o.live(live(s))
    assert o.counters["positions_distrusted"] == 1


def test_a_backlog_catching_up_on_a_newer_snapshot_is_waited_for():
    """A bridge's backlog stored after its newer snapshot: far behind the position, but coming
    fast enough to reach it within resync_timeout_s, so no resync."""
    clock = Clock()
    o = order(clock)
    o.snapshot(snap(5000, (1,)))
    o.take()
    for s in range(0, 5000, 50):  # 5,000 seqs in 10 s (500 per second)
        clock.t += 0.1
        o.live(live(s))
        o.tick()
    for s in range(5001, 5005):
        o.live(live(s))
    out = o.take()
    assert o.counters.get("positions_distrusted", 0) == 0 and not [x for x in out if isinstance(x, Reset)]
    assert [d.seq for d in out] == [5001, 5002, 5003, 5004]
