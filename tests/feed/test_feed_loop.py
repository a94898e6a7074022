"""kvevents.feed: the one feed thread loop (backoff, rate-limited logging, counted errors), the
kinds and reasons as typed strings, and dispatch."""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from typing import get_args

import pytest

from kvevents.events import KVEventBatch
from kvevents.feed import (
    DELIVERY_KINDS,
    RESET_REASONS,
    Delivery,
    DeliveryKind,
    FeedLoop,
    Output,
    Reset,
    ResetReason,
    backoff_s,
)

LOG = logging.getLogger("tests.feed_loop")


def _delivery(seq: int) -> Delivery:
    return Delivery("w0", seq, KVEventBatch(0.0, []))


class _Polls:
    """A poll function playing back a script: a list of outputs, or an exception to raise."""

    def __init__(self, script: list[list[Output] | Exception]) -> None:
        self.script = list(script)
        self.timeouts: list[float] = []

    def __call__(self, timeout_s: float) -> list[Output]:
        self.timeouts.append(timeout_s)
        step = self.script.pop(0) if self.script else []
        if isinstance(step, Exception):
            raise step
        return step


def _loop(poll, got: list, **kw) -> FeedLoop:
    kw.setdefault("counters", Counter())
    kw.setdefault("stop", threading.Event())
    return FeedLoop(poll, got.append, got.append, logger=LOG, name="test-feed", **kw)


def test_backoff_doubles_from_50_ms_to_at_most_5_s():
    assert [backoff_s(n) for n in range(1, 10)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]


def test_a_failing_poll_is_counted_backed_off_and_logged_once_per_log_every(caplog):
    poll = _Polls([RuntimeError("down")] * 5 + [[_delivery(0)]])
    got: list = []
    loop = _loop(poll, got, log_every=3)
    with caplog.at_level("ERROR", logger=LOG.name):
        waits = [loop.step() for _ in range(6)]
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.8, 0.0]  # the good poll ends the backoff
    assert loop.counters == {"loop_errors": 5} and loop.errors == 0
    assert [r.getMessage() for r in caplog.records] == [
        "test-feed loop error (1 in a row, logged once per 3)",
        "test-feed loop error (4 in a row, logged once per 3)",
    ]
    assert [d.seq for d in got] == [0] and poll.timeouts == [0.05] * 6


def test_a_raising_callback_is_counted_and_the_rest_are_handed_out():
    seen: list[int] = []

    def on_delivery(d: Delivery) -> None:
        if d.seq == 1:
            raise ValueError("consumer bug")
        seen.append(d.seq)

    resets: list[Reset] = []
    counters: Counter[str] = Counter()
    poll = _Polls([[_delivery(0), _delivery(1), Reset("w0", 0, "gap"), _delivery(2)]])
    loop = FeedLoop(poll, on_delivery, resets.append, stop=threading.Event(), counters=counters, logger=LOG)
    assert loop.step() == 0.0
    assert seen == [0, 2] and [r.reason for r in resets] == ["gap"] and counters == {"callback_errors": 1}


def test_the_thread_runs_until_stopped_then_runs_on_exit():
    stop = threading.Event()
    exited = threading.Event()
    handed = threading.Event()
    got: list = []

    def on_delivery(d: Delivery) -> None:
        got.append(d.seq)
        if len(got) == 3:
            handed.set()

    poll = _Polls([[_delivery(0)], RuntimeError("once"), [_delivery(1), _delivery(2)]])
    loop = FeedLoop(poll, on_delivery, None, stop=stop, counters={}, logger=LOG, on_exit=exited.set, poll_s=0.01)
    thread = loop.start()
    try:
        assert handed.wait(5.0)
    finally:
        stop.set()
        thread.join(5.0)
    assert not thread.is_alive() and exited.is_set() and got == [0, 1, 2]
    assert loop.counters == {"loop_errors": 1} and thread.name == "kvevents-feed"


def test_on_exit_runs_when_the_loop_is_stopped_before_it_polls():
    stop = threading.Event()
    stop.set()
    exited: list[bool] = []
    poll = _Polls([])
    FeedLoop(poll, lambda d: None, None, stop=stop, counters={}, on_exit=lambda: exited.append(True)).run()
    assert exited == [True] and poll.timeouts == []


def test_kinds_and_reasons_are_plain_strings_on_the_wire_and_in_json():
    assert DELIVERY_KINDS == get_args(DeliveryKind) == ("live", "replay", "snapshot")
    assert RESET_REASONS == get_args(ResetReason) == ("restart", "gap", "first")
    d = Delivery("w0", 3, KVEventBatch(0.0, []), kind="replay")
    r = Reset("w0", None, "restart")
    assert json.dumps({"kind": d.kind, "reason": r.reason}) == '{"kind": "replay", "reason": "restart"}'
    assert f"resets_{r.reason}" == "resets_restart"


@pytest.mark.parametrize("log_every", [0, 1])
def test_log_every_one_or_less_logs_every_error(caplog, log_every):
    loop = _loop(_Polls([RuntimeError("x")] * 3), [], log_every=log_every)
    with caplog.at_level("ERROR", logger=LOG.name):
        for _ in range(3):
            loop.step()
    assert len(caplog.records) == 3
