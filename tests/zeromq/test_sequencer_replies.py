"""The sequencer reads both replay framings per reply, and no repair holds the live stream:
garbage, a trickle past the request budget, or silence each end in a counted resync or loss,
after which the buffered live batches are delivered. Step by step with a fake clock, no sockets."""

from __future__ import annotations

import logging

import pytest

from kvevents.events import BlockStored, KVEventBatch, encode_batch
from kvevents.feed import Delivery, Reset
from kvevents.zeromq.framing import NO_TOPIC_FRAMING, TOPIC_FRAMING, parse_reply
from kvevents.zeromq.sequencer import DropDealer, Send, Sequencer
from kvevents.zeromq.source import Source
from kvevents.zeromq.wire import DESCRIBE_REQUEST, END_SEQ, SNAPSHOT_REQUEST, SNAPSHOT_SEQ, pack_seq

SRC = Source("tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "w")
TOPIC = b"kv"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def payload(h: int) -> bytes:
    return encode_batch(KVEventBatch(1.0, [BlockStored([h], None, [1, 2], 2, None, "GPU", None)], 0))


def live(seq: int) -> list[bytes]:
    return [TOPIC, pack_seq(seq), payload(seq)]


def reply3(seq: int) -> list[bytes]:
    """SGLang 0.5.20 / vLLM < 0.26: no topic frame."""
    return [b"", pack_seq(seq), payload(seq)]


def reply4(seq: int) -> list[bytes]:
    return [b"", TOPIC, pack_seq(seq), payload(seq)]


END3 = [b"", END_SEQ, b""]
END4 = [b"", b"", END_SEQ, b""]


def seqs(out) -> list[int]:
    return [d.seq for d in out if isinstance(d, Delivery)]


def engine_joined(clock: Clock, end=END3, **kw) -> Sequencer:
    """A sequencer past first contact with an engine that reads KVE/DESCRIBE as a replay start:
    the end marker alone answers it, at once (no timeout), and the replay from 0 is sent."""
    q = Sequencer([SRC], clock=clock, **kw)
    q.on_live("w", live(0))
    assert q.take() == ([], [Send("w", DESCRIBE_REQUEST)])
    q.on_reply("w", end)
    out, cmds = q.take()
    assert seqs(out) == [0] and cmds == [] and q.counters["describes_unsupported"] == 1
    assert q.counters["describe_timeouts"] == 0 and q.counters["bad_replies"] == 0
    return q


def gap_replay_sent(q: Sequencer, start: int = 1, upto: int = 4) -> None:
    """Live seq `upto` arrives after a gap: the replay request goes out, live batches are buffered."""
    q.on_live("w", live(upto))
    q.on_live("w", live(upto + 1))
    assert q.take() == ([], [Send("w", pack_seq(start))])


@pytest.mark.parametrize("make, end, framing", [(reply3, END3, NO_TOPIC_FRAMING), (reply4, END4, TOPIC_FRAMING)])
def test_either_framing_fills_a_gap_and_is_shown(make, end, framing) -> None:
    q = engine_joined(Clock(), end)
    gap_replay_sent(q)
    for s in (1, 2, 3, 4):
        q.on_reply("w", make(s))
    q.on_reply("w", end)
    out, cmds = q.take()
    assert seqs(out) == [1, 2, 3, 4, 5] and cmds == []
    assert [d.kind for d in out] == ["replay"] * 4 + ["live"]
    assert all(d.topic == "kv" for d in out)  # a 3-frame reply is filed under the live topic
    assert q.status()["w"].replay_framing == framing
    assert q.counters["bad_replies"] == 0 and q.counters["losses"] == 0


def test_framings_are_read_per_reply() -> None:
    q = engine_joined(Clock(), END4)
    gap_replay_sent(q)
    q.on_reply("w", reply4(1))
    q.on_reply("w", reply3(2))
    q.on_reply("w", reply4(3))
    q.on_reply("w", END3)
    assert seqs(q.take()[0]) == [1, 2, 3, 4, 5] and q.status()["w"].replay_framing == NO_TOPIC_FRAMING


def test_a_3_frame_snapshot_and_its_end_marker_carrying_s() -> None:
    clock = Clock()
    q = engine_joined(clock)
    q.on_live("w", live(1))
    q.on_live("w", live(0))  # seq going backwards: a restart, and seq 0 of the new process is all of it
    out, cmds = q.take()
    assert [type(o) for o in out] == [Delivery, Reset, Delivery] and cmds == []
    q.on_live("w", live(3))  # a gap: replay answered "first reply past start" -> unrecoverable
    assert q.take()[1] == [Send("w", pack_seq(1))]
    q.on_reply("w", reply3(3))
    q.on_reply("w", END3)
    out, cmds = q.take()
    assert isinstance(out[0], Reset) and cmds == [Send("w", SNAPSHOT_REQUEST)]
    q.on_reply("w", [b"", SNAPSHOT_SEQ, payload(77)])
    q.on_reply("w", [b"", END_SEQ, pack_seq(3)])
    out, _ = q.take()
    assert [(d.kind, d.seq) for d in out] == [("snapshot", 3)] and q.counters["snapshots_applied"] == 1


@pytest.mark.parametrize(
    "garbage",
    [
        [b"hello"],
        [b"", b"short", payload(1)],  # a seq frame of 5 bytes
        [b"x", pack_seq(1), payload(1)],  # no empty delimiter
        [b"", b"", b"", pack_seq(1), payload(1)],  # 5 frames
    ],
)
def test_garbage_fails_the_replay_and_the_snapshot_at_once_and_live_flows(garbage, caplog) -> None:
    clock = Clock()
    q = engine_joined(clock)
    gap_replay_sent(q)
    with caplog.at_level(logging.WARNING, "kvevents.zeromq.subscriber"):
        q.on_reply("w", garbage)  # no retry, no waiting for a timeout
        out, cmds = q.take()
        assert [type(o) for o in out] == [Reset] and out[0].reason == "gap"
        assert cmds == [DropDealer("w"), Send("w", SNAPSHOT_REQUEST)]
        q.on_reply("w", garbage)
        out, cmds = q.take()
    assert cmds == [DropDealer("w")]
    assert seqs(out) == [4, 5] and [d.kind for d in out] == ["live", "live"]  # the buffered batches
    c = q.counters
    assert c["bad_replies"] == 2 and c["requests_abandoned"] == 2 and c["losses"] == 1 and c["replay_timeouts"] == 0
    assert "starting clean (state lost)" in caplog.text and "resync by snapshot" in caplog.text
    q.on_live("w", live(6))
    assert seqs(q.take()[0]) == [6]


def test_a_batch_in_answer_to_describe_is_unusable_and_the_stream_goes_on() -> None:
    q = Sequencer([SRC], clock=Clock())
    q.on_live("w", live(0))
    q.take()
    q.on_reply("w", reply3(0))
    out, cmds = q.take()
    assert seqs(out) == [0] and cmds == [DropDealer("w")] and q.counters["requests_abandoned"] == 1


def test_a_trickle_past_the_request_budget_is_abandoned() -> None:
    clock = Clock()
    q = engine_joined(clock, request_timeout_s=1.0, request_budget_s=5.0)
    gap_replay_sent(q, upto=100)
    got: list = []
    for s in range(1, 6):  # one reply every 0.9 s: never a timeout, never an end
        clock.t += 0.9
        q.tick()
        q.on_reply("w", reply3(s))
        out, cmds = q.take()
        got += out
        assert cmds == []
    assert seqs(got) == [1, 2, 3, 4, 5]
    assert 0 < q.wait_s(10.0) <= 0.51  # the budget (t0 + 5 s) falls due before the reply deadline
    clock.t = 1005.01
    q.tick()
    out, cmds = q.take()
    assert [type(o) for o in out] == [Reset]  # what came was applied; now a resync
    assert cmds == [DropDealer("w"), Send("w", SNAPSHOT_REQUEST)] and q.counters["requests_abandoned"] == 1
    q.on_reply("w", END3)  # an engine without snapshots: the end marker alone
    out, _ = q.take()
    assert seqs(out) == [100, 101] and q.counters["losses"] == 1


def test_a_mute_endpoint_costs_bounded_time_then_live_is_delivered() -> None:
    clock = Clock()
    q = engine_joined(clock, request_timeout_s=2.0, max_attempts=3)
    gap_replay_sent(q)
    sent: list = []
    got: list = []
    for _ in range(40):
        clock.t += 0.5
        q.tick()
        out, cmds = q.take()
        sent += cmds
        got += out
        if seqs(got):
            break
    # replay: 3 attempts of 2 s (and backoffs); then one snapshot attempt: the endpoint just failed
    assert sent.count(Send("w", pack_seq(1))) == 2 and sent.count(Send("w", SNAPSHOT_REQUEST)) == 1  # + the first
    assert seqs(got) == [4, 5] and clock.t - 1000.0 <= 10.5
    assert q.counters["losses"] == 1 and q.counters["snapshot_failures"] == 1


def test_an_endpoint_that_answers_again_is_retried_again() -> None:
    clock = Clock()
    q = engine_joined(clock, request_timeout_s=1.0, max_attempts=2)
    gap_replay_sent(q)
    q.on_reply("w", [b"junk"])  # replay fails at once: the endpoint is failing
    q.on_reply("w", END3)  # the snapshot (an empty one: none offered) ends well: no longer failing
    out, _ = q.take()
    assert seqs(out) == [4, 5]
    q.on_live("w", live(8))
    assert q.take()[1] == [Send("w", pack_seq(6))]
    clock.t += 1.1
    q.tick()
    clock.t += 0.3
    q.tick()
    assert q.take()[1] == [DropDealer("w"), Send("w", pack_seq(6))]  # retried


def test_parse_reply_reads_both_forms_and_refuses_the_rest() -> None:
    r = parse_reply([b"", b"t", pack_seq(5), b"p"])
    assert r is not None and (r.framing, r.topic, r.payload, r.is_end) == (TOPIC_FRAMING, b"t", b"p", False)
    r = parse_reply(END3)
    assert r is not None and (r.framing, r.topic, r.is_end) == (NO_TOPIC_FRAMING, None, True)
    assert parse_reply([b"", b"p"]) is None and parse_reply([b"", b"1234567", b"p"]) is None
    assert parse_reply([]) is None
