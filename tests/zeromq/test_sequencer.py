"""The subscriber's sequencing and repair, driven step by step: frames and a fake clock in,
deliveries, resets and DEALER commands out. No sockets, no threads, no sleeps."""

from __future__ import annotations

import msgspec

from kvevents.feed import Delivery, Reset
from kvevents.zeromq.sequencer import DropDealer, Send, Sequencer
from kvevents.zeromq.source import Source
from kvevents.zeromq.wire import DESCRIBE_REQUEST, END_SEQ, SNAPSHOT_REQUEST, SNAPSHOT_SEQ, pack_seq
from tests.helpers.clock import FakeClock as Clock
from tests.helpers.payloads import one_store as payload

SRC = Source("tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "w")


def live(seq: int, h: int | None = None) -> list[bytes]:
    return [b"", pack_seq(seq), payload(seq if h is None else h)]


def describe(epoch: int) -> list[bytes]:
    return [b"", msgspec.msgpack.encode({"epoch": epoch})]


def replay(seq: int) -> list[bytes]:
    return [b"", b"", pack_seq(seq), payload(seq)]


END = [b"", b"", END_SEQ, b""]


def seqs(out) -> list[int]:
    return [d.seq for d in out if isinstance(d, Delivery)]


def joined(clock: Clock, **kw) -> Sequencer:
    """A sequencer whose stream of `w` has started at seq 0 with epoch 7."""
    q = Sequencer([SRC], clock=clock, **kw)
    q.on_live("w", live(0))
    out, cmds = q.take()
    assert cmds == [Send("w", DESCRIBE_REQUEST)] and not out  # first contact: the epoch first
    q.on_reply("w", describe(7))
    out, cmds = q.take()
    assert seqs(out) == [0] and cmds == []
    return q


def test_a_gap_asks_describe_then_replays_it_and_buffers_live_batches():
    clock = Clock()
    q = joined(clock)
    q.on_live("w", live(3))  # 1, 2 lost
    out, cmds = q.take()
    assert not out and cmds == [Send("w", DESCRIBE_REQUEST)]
    q.on_live("w", live(4))  # held while the repair runs
    q.on_reply("w", describe(7))  # same epoch: now the replay itself
    assert q.take() == ([], [Send("w", pack_seq(1))])
    for s in (1, 2, 3):
        q.on_reply("w", replay(s))
    q.on_reply("w", END)
    out, cmds = q.take()
    assert seqs(out) == [1, 2, 3, 4] and [d.kind for d in out] == ["replay"] * 3 + ["live"]
    assert q.counters["gaps"] == 1 and q.counters["duplicates"] == 1  # live 3 came again by replay


def test_a_new_epoch_in_describe_is_a_restart_resynced_by_snapshot():
    clock = Clock()
    q = joined(clock)
    q.on_live("w", live(5))  # a restarted publisher whose first seqs we missed: looks like a gap
    q.take()
    q.on_reply("w", describe(8))
    out, cmds = q.take()
    assert [type(o) for o in out] == [Reset] and out[0].reason == "restart"
    assert cmds == [Send("w", SNAPSHOT_REQUEST)]
    q.on_reply("w", [b"", b"", SNAPSHOT_SEQ, payload(50)])
    q.on_reply("w", [b"", b"", END_SEQ, pack_seq(9)])
    out, _ = q.take()
    assert [(d.kind, d.seq) for d in out] == [("snapshot", 9)]
    q.on_live("w", live(10))
    assert seqs(q.take()[0]) == [10] and q.status()["w"].epoch == 8 and q.counters["restarts"] == 1


def test_a_seq_going_backwards_is_a_restart():
    clock = Clock()
    q = joined(clock)
    for s in (1, 2, 3):
        q.on_live("w", live(s))
    q.take()
    q.on_live("w", live(1, h=50))  # a new process, heard from its seq 1 on
    out, cmds = q.take()
    assert isinstance(out[0], Reset) and cmds == [Send("w", SNAPSHOT_REQUEST)]
    q.on_live("w", live(0, h=60))  # seq 0 of a new process: the whole stream, nothing to ask
    out, cmds = q.take()
    assert isinstance(out[0], Reset) and seqs(out) == [0] and q.counters["restarts"] == 2


def test_timeouts_drop_the_dealer_retry_with_backoff_then_start_clean():
    clock = Clock()
    q = joined(clock, request_timeout_s=2.0, max_attempts=2)
    q.on_live("w", live(3))
    q.on_reply("w", describe(7))
    assert q.take()[1] == [Send("w", DESCRIBE_REQUEST), Send("w", pack_seq(1))]
    clock.t += 2.1
    q.tick()  # replay timed out: new DEALER, retry after a backoff
    assert q.take()[1] == [DropDealer("w")]
    assert 0 < q.wait_s(10.0) <= 0.21
    clock.t += 0.25
    q.tick()
    assert q.take()[1] == [Send("w", DESCRIBE_REQUEST)]  # a gap replay asks DESCRIBE first, again
    q.on_reply("w", describe(7))
    assert q.take()[1] == [Send("w", pack_seq(1))]
    clock.t += 2.1
    q.tick()  # second attempt failed: unrecoverable, Reset and snapshot
    out, cmds = q.take()
    assert isinstance(out[0], Reset) and out[0].reason == "gap" and cmds == [DropDealer("w")]
    sent: list = []
    got: list = []
    for _ in range(6):  # the snapshot request, after the backoff: one attempt, the endpoint just failed
        clock.t += 2.5
        q.tick()
        out, cmds = q.take()
        sent += cmds
        got += out
    assert sent.count(Send("w", SNAPSHOT_REQUEST)) == 1
    assert seqs(got) == [3] and q.counters["snapshot_failures"] == 1 and q.counters["losses"] == 1


def test_a_publisher_without_describe_costs_one_timeout_and_a_restart_replays_from_zero():
    clock = Clock()
    q = Sequencer([SRC], clock=clock)
    q.on_live("w", live(0))
    q.take()
    clock.t += 1.01
    q.tick()  # DESCRIBE unanswered (vLLM): go on with seqs alone
    out, cmds = q.take()
    assert seqs(out) == [0] and cmds == [DropDealer("w")] and q.counters["describe_timeouts"] == 1
    for s in (1, 2, 3):
        q.on_live("w", live(s))
    q.on_live("w", live(1, h=99))  # restarted, heard from seq 1: no snapshots there, its ring holds seq 0
    out, cmds = q.take()
    assert isinstance(out[-1], Reset) and cmds == [Send("w", pack_seq(0))]
    q.on_reply("w", replay(0))
    q.on_reply("w", replay(1))
    q.on_reply("w", END)
    out, _ = q.take()
    assert [(d.kind, d.seq) for d in out] == [("replay", 0), ("replay", 1)]


def test_staleness_and_a_reconnect_make_the_next_batch_confirm_the_epoch():
    clock = Clock()
    q = joined(clock, stale_after_s=5.0)
    clock.t += 6
    q.tick()
    assert q.status()["w"].stale and q.counters["stale_sources"] == 1
    q.on_live("w", live(1))  # back from stale: DESCRIBE before applying
    assert q.take() == ([], [Send("w", DESCRIBE_REQUEST)]) and q.counters["stale_returns"] == 1
    q.on_reply("w", describe(7))
    assert seqs(q.take()[0]) == [1]
    q.on_connect("w")
    q.on_connect("w")  # the first connection is not a reconnect; the second is
    q.on_live("w", live(2))
    assert q.take() == ([], [Send("w", DESCRIBE_REQUEST)]) and q.counters["reconnects"] == 1


def test_a_describe_lost_to_a_restarting_publisher_is_asked_again_not_given_up():
    """A publisher that answered DESCRIBE before, silent now (its process restarting): the
    DESCRIBE is asked again after a backoff, nothing is applied unconfirmed, and the new epoch is
    a restart. Before, one lost DESCRIBE meant "no DESCRIBE here": the new process's seqs were
    then replayed as the old one's, and the index stayed wrong until its next restart."""
    clock = Clock()
    q = joined(clock)
    for s in (1, 2):
        q.on_live("w", live(s))
    assert seqs(q.take()[0]) == [1, 2]
    q.on_live("w", live(5))  # the new process, heard from seq 5: looks like a gap
    assert q.take() == ([], [Send("w", DESCRIBE_REQUEST)])
    clock.t += 1.01
    q.tick()  # lost with the old process
    assert q.take() == ([], [DropDealer("w")])
    q.on_live("w", live(6))  # held: not applied before the epoch is known
    clock.t += 0.25
    q.tick()
    assert q.take() == ([], [Send("w", DESCRIBE_REQUEST)])  # asked again, not a replay of 3..4
    q.on_reply("w", describe(8))
    out, cmds = q.take()
    assert [type(o) for o in out] == [Reset] and out[0].reason == "restart"
    assert cmds == [Send("w", SNAPSHOT_REQUEST)]
    assert q.counters["describe_timeouts"] == 1 and q.counters["restarts"] == 1 and q.counters["replays_requested"] == 0


def test_after_a_reconnect_a_lost_describe_is_asked_again_before_any_batch_is_applied():
    clock = Clock()
    q = joined(clock)
    q.on_live("w", live(1))
    q.take()
    q.on_connect("w")
    q.on_connect("w")  # re-made: the publisher may be a new process
    q.on_live("w", live(40))  # a new process, far ahead of the old seqs: nothing says restart yet
    assert q.take() == ([], [Send("w", DESCRIBE_REQUEST)])
    for _ in range(2):  # two DESCRIBEs lost, each asked again
        clock.t += 1.01
        q.tick()
        assert q.take() == ([], [DropDealer("w")])
        clock.t += 0.5
        q.tick()
        assert q.take() == ([], [Send("w", DESCRIBE_REQUEST)])
    q.on_reply("w", describe(9))
    out, cmds = q.take()
    assert [type(o) for o in out] == [Reset] and cmds == [Send("w", SNAPSHOT_REQUEST)]


def test_a_describe_that_answered_before_is_given_up_after_its_attempts():
    """A publisher gone for good (or one that stopped answering DESCRIBE): after max_attempts the
    stream goes on without, as for a publisher that never answered."""
    clock = Clock()
    q = joined(clock, max_attempts=2)
    q.on_live("w", live(3))
    assert q.take()[1] == [Send("w", DESCRIBE_REQUEST)]
    clock.t += 1.01
    q.tick()
    clock.t += 0.5
    q.tick()
    assert q.take()[1] == [DropDealer("w"), Send("w", DESCRIBE_REQUEST)]
    clock.t += 1.01
    q.tick()  # the second attempt: given up, the replay itself goes out
    assert q.take()[1] == [DropDealer("w"), Send("w", pack_seq(1))]
    assert q.counters["describe_timeouts"] == 2
