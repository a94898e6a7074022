"""Both replay framings end to end, and replay endpoints that answer garbage, slowly or never.

A late joiner must repair by replay through `Subscriber`, `kvevents tail`, `route`'s /workers,
`conformance stream` and `doctor`, against an engine whose ROUTER answers in the 3-frame form
(SGLang 0.5.20, vLLM < 0.26) or the 4-frame one (vLLM >= 0.26): tests.conformance_fakes.FakeEngine,
a raw XPUB + ROUTER on 127.0.0.1 written from the byte layout. A misbehaving endpoint may cost a
counted resync, never the live stream. Real sockets; each engine and subscriber is closed after.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from kvevents.conformance.profiles import get_profile
from kvevents.conformance.report import Status
from kvevents.conformance.rules import StreamChecker
from kvevents.consumers.service.core import RouterService
from kvevents.doctor.zeromq import run_doctor
from kvevents.events import AllBlocksCleared
from kvevents.testing.zeromq import apply, stored
from kvevents.zeromq.framing import NO_TOPIC_FRAMING, TOPIC_FRAMING
from kvevents.zeromq.subscriber import Delivery, Reset, Source, Subscriber
from kvevents.zeromq.wire import END_SEQ, pack_seq
from tests.helpers.cli import CliResult, invoke
from tests.helpers.conformance_fakes import FakeEngine, observe_fake
from tests.helpers.payloads import batch as payload

FRAMING_NAMES = {3: NO_TOPIC_FRAMING, 4: TOPIC_FRAMING}
BEFORE, LIVE = 40, 40  # batches kept in the ring before the subscriber joins, then sent live


def _batch(seq: int) -> bytes:
    return payload([stored(seq + 1, seq if seq else None)])


def _ring(eng: FakeEngine, n: int = BEFORE) -> None:
    for s in range(n):
        eng.send(s, _batch(s), live=False)


def _late_join(eng: FakeEngine, sub: Subscriber, timeout: float = 10.0) -> list:
    """The ring holds seqs 0..39; the subscriber joins, then 40..79 go live (one per poll)."""
    _ring(eng)
    sub.poll(0)  # opens the SUB
    eng.wait_joined()
    items: list = []
    seq, last = BEFORE, BEFORE + LIVE - 1
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(isinstance(d, Delivery) and d.seq == last for d in items):
        if seq <= last:
            eng.send(seq, _batch(seq))
            seq += 1
        items += sub.poll(0.01)
    return items


def _seqs(items, kind: str | None = None) -> list[int]:
    return [d.seq for d in items if isinstance(d, Delivery) and (kind is None or d.kind == kind)]


@pytest.fixture
def engines() -> Iterator[list[FakeEngine]]:
    made: list[FakeEngine] = []
    yield made
    for e in made:
        e.close()


def _engine(engines: list[FakeEngine], **kw) -> FakeEngine:
    e = FakeEngine(**kw)
    engines.append(e)
    return e


@pytest.mark.parametrize("framing, mode, delay", [(3, "ok", 0.0), (4, "ok", 0.0), (3, "slow", 0.1)])
def test_a_late_joiner_repairs_by_replay_in_either_framing(engines, framing, mode, delay) -> None:
    eng = _engine(engines, framing=framing, replay_mode=mode, delay=delay)
    sub = Subscriber([Source(eng.endpoint, eng.replay_endpoint, "w")], request_timeout_s=0.5)
    try:
        items = _late_join(eng, sub)
        seqs = _seqs(items)
        assert seqs == list(range(BEFORE + LIVE)), sub.counters()  # every batch once, in order
        assert set(_seqs(items, "replay")) >= set(range(BEFORE))  # the history came by replay
        assert not any(isinstance(i, Reset) for i in items)
        state: dict = {}
        for d in items:
            apply(state, d.batch)
        assert state == {("GPU", h): 1 for h in range(1, BEFORE + LIVE + 1)}
        assert sub.status()["w"].replay_framing == FRAMING_NAMES[framing]
        c = sub.counters()
        assert c["losses"] == 0 and c["bad_replies"] == 0 and c["describes_unsupported"] == 1
        assert c["describe_timeouts"] == 0  # DESCRIBE answered by the end marker alone: no wait
    finally:
        sub.stop()


@pytest.mark.parametrize("mode, delay", [("garbage", 0.0), ("slow", 1.0), ("mute", 0.0)])
def test_a_misbehaving_replay_endpoint_costs_a_counted_resync_never_the_live_stream(engines, mode, delay) -> None:
    eng = _engine(engines, framing=3, replay_mode=mode, delay=delay)
    sub = Subscriber([Source(eng.endpoint, eng.replay_endpoint, "w")], request_timeout_s=0.2)
    try:
        t0 = time.monotonic()
        items = _late_join(eng, sub)
        took = time.monotonic() - t0
        assert _seqs(items) == list(range(BEFORE, BEFORE + LIVE)), sub.counters()  # all live, in order, once
        assert _seqs(items, "replay") == []  # a slow endpoint's late answers died with their DEALERs
        resets = [i for i in items if isinstance(i, Reset)]
        assert [r.reason for r in resets] == ["first"]
        c = sub.counters()
        assert c["losses"] == 1 and c["snapshot_failures"] == 1
        if mode == "garbage":
            assert c["bad_replies"] >= 2 and c["requests_abandoned"] >= 2 and c["replay_timeouts"] == 0
        else:
            assert c["replay_timeouts"] >= 3 and c["bad_replies"] == 0
        assert took < 8.0
        assert eng.requests  # the endpoint was asked
    finally:
        sub.stop()


def test_route_workers_show_the_framing_of_each_publisher(engines) -> None:
    old = _engine(engines, framing=3)
    new = _engine(engines, framing=4)
    for e in (old, new):
        _ring(e, 3)
    service = RouterService(
        [Source(old.endpoint, old.replay_endpoint, "sglang"), Source(new.endpoint, new.replay_endpoint, "vllm")]
    )
    try:
        service.process(0)
        old.wait_joined()
        new.wait_joined()
        deadline = time.monotonic() + 10
        want = {"sglang": ("3-frame", 5), "vllm": ("4-frame", 5)}  # framing, blocks: 0..2 replayed, 3..4 live
        got: dict = {}
        seq = 3
        while time.monotonic() < deadline and got != want:
            if seq < 5:
                for e in (old, new):
                    e.send(seq, _batch(seq))
                seq += 1
            service.process(0.02)
            got = {w["worker"]: (w["replay_framing"], w["blocks"]) for w in service.workers_view()["workers"]}
        assert got == want
    finally:
        service.stop()


# ---------------------------------------------------------------- conformance stream


@pytest.mark.parametrize("framing", [3, 4])
def test_conformance_replay_protocol_passes_either_framing_and_names_it(engines, framing) -> None:
    eng = _engine(engines, framing=framing)
    script = [(0, payload([AllBlocksCleared()]), True), (1, _batch(1), False), (2, _batch(2), True)]
    report = observe_fake(eng, script)
    rule = report.result("replay-protocol")
    assert rule.status is Status.PASS, report.table()
    assert f"framing {FRAMING_NAMES[framing]}" in rule.detail
    assert report.figures["replay_framing"] == FRAMING_NAMES[framing]
    assert report.result("gaps-healed").status is Status.PASS
    assert report.result("describe").status is Status.NOT_OFFERED  # answered as an empty replay
    assert report.result("snapshot").status is Status.NOT_OFFERED


def test_conformance_fails_a_publisher_mixing_framings() -> None:
    c = StreamChecker(get_profile("contract"), 2)
    c.on_live([b"", pack_seq(0), payload([AllBlocksCleared()])])
    replies = [[b"", b"", pack_seq(0), payload([AllBlocksCleared()])], [b"", END_SEQ, b""]]
    c.on_replay(0, replies, True, upto=None, heal=False)
    rule = c.report().result("replay-protocol")
    assert rule.status is Status.FAIL and "3-frame framing, earlier replies 4-frame" in rule.detail


def test_conformance_names_a_reply_in_neither_framing() -> None:
    c = StreamChecker(get_profile("contract"), 2)
    c.on_replay(0, [[b"", b"x", b"y", b"z", b"w"], [b"", END_SEQ, b""]], True, upto=None, heal=False)
    rule = c.report().result("replay-protocol")
    assert rule.status is Status.FAIL and "5 frames" in rule.detail


# ---------------------------------------------------------------- doctor and tail


class _Feeder:
    """Sends live batches from seq `start` on a thread (every `interval` s) until closed."""

    def __init__(self, eng: FakeEngine, start: int, interval: float = 0.02) -> None:
        self.eng, self.seq, self.interval = eng, start, interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            self.eng.send(self.seq, _batch(self.seq))
            self.seq += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


@pytest.mark.parametrize("framing", [3, 4])
def test_doctor_names_the_framing(engines, framing) -> None:
    eng = _engine(engines, framing=framing)
    _ring(eng, 5)
    feeder = _Feeder(eng, 5)
    try:
        rep = run_doctor(eng.endpoint, replay=eng.replay_endpoint, timeout=1.0)
    finally:
        feeder.close()
    checks = {c.name: c for c in rep.checks}
    assert checks["replay answers"].status == "ok", checks["replay answers"]
    assert f"framing {FRAMING_NAMES[framing]}" in checks["replay answers"].detail
    assert rep.seen["replay_framing"] == FRAMING_NAMES[framing]
    assert checks["describe answers"].status == "skip" and "not offered" in checks["describe answers"].detail


def _kv(*args: str, timeout: float = 60) -> CliResult:
    """The real entry point in process (these commands end by themselves; no traceback, checked)."""
    return invoke(*args, timeout=timeout)


def test_doctor_cli_shows_the_3_frame_framing(engines) -> None:
    eng = _engine(engines, framing=3)
    _ring(eng, 5)
    feeder = _Feeder(eng, 5)
    try:
        r = _kv("doctor", eng.endpoint, "--replay", eng.replay_endpoint, "--timeout", "1.0")
    finally:
        feeder.close()
    said = " ".join((r.stdout + r.stderr).replace("│", " ").split())  # the table wraps its details at 80 columns
    assert "3-frame" in said and "SGLang <= 0.5.20" in said, r.stdout + r.stderr


@pytest.mark.parametrize("framing", [3, 4])
def test_tail_announces_the_framing_and_repairs(engines, framing) -> None:
    eng = _engine(engines, framing=framing)
    _ring(eng)
    feeder = _Feeder(eng, BEFORE)
    try:
        r = _kv("tail", eng.endpoint, "--replay", eng.replay_endpoint, "--json", "--count", "50", "--duration", "20")
    finally:
        feeder.close()
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    notes = [x for x in lines if x["type"] == "notice" and x["what"] == "replay_framing"]
    assert [n["framing"] for n in notes] == [FRAMING_NAMES[framing]]
    batches = [x for x in lines if x["type"] == "batch"]
    assert [b["seq"] for b in batches] == list(range(50))  # replayed 0..39 first, then live
    assert lines.index(notes[0]) < lines.index(batches[0])


def test_tail_against_a_garbage_endpoint_goes_on_live(engines) -> None:
    eng = _engine(engines, framing=3, replay_mode="garbage")
    _ring(eng)
    feeder = _Feeder(eng, BEFORE)
    try:
        r = _kv("tail", eng.endpoint, "--replay", eng.replay_endpoint, "--json", "--count", "10", "--duration", "20")
    finally:
        feeder.close()
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    what = {x["what"] for x in lines if x["type"] == "notice"}
    assert {"bad_replies", "requests_abandoned", "losses"} <= what
    seqs = [x["seq"] for x in lines if x["type"] == "batch"]
    assert len(seqs) == 10 and seqs == list(range(seqs[0], seqs[0] + 10)) and seqs[0] >= BEFORE
