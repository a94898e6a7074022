"""kvevents.sim.serve: the `kvevents serve` loop (a fake clock: no sleeps), its endpoint rules, and a
real fleet of publishers on 127.0.0.1."""

from __future__ import annotations

import threading
import uuid

import pytest
import zmq

from kvevents.sim.serve import ServeConfig, ServeLoop, SimFleet, default_replay_endpoint, rank_endpoints
from kvevents.testing.zeromq import EPH, collect
from kvevents.zeromq.subscriber import Delivery, Source, Subscriber
from tests.helpers.wait import wait_until


class _Clock:
    """A clock that moves only when the loop sleeps (or a step costs time)."""

    def __init__(self, step_cost: float = 0.0) -> None:
        self.now = 100.0
        self.step_cost = step_cost
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        assert s > 0, "the loop never sleeps for nothing"
        self.sleeps.append(s)
        self.now += s


class _Fleet:
    """The loop's view of a fleet: how many workers, and a step per request (it records which)."""

    def __init__(self, n: int, clock: _Clock, stop_after: int | None = None, stop: threading.Event | None = None):
        self.n, self.clock, self.stop_after, self.stop = n, clock, stop_after, stop
        self.steps: list[int] = []

    def __len__(self) -> int:
        return self.n

    def serve_next(self, k: int) -> None:
        self.steps.append(k)
        self.clock.now += self.clock.step_cost
        if self.stop is not None and len(self.steps) == self.stop_after:
            self.stop.set()


def test_the_rate_is_kept_round_robin_with_a_status_each_second() -> None:
    clock = _Clock()
    fleet = _Fleet(3, clock)
    loop = ServeLoop(fleet, rate=8.0, duration=2.5, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    statuses: list[float] = []
    loop.run(threading.Event(), statuses.append)
    assert loop.served == 20 == len(fleet.steps)  # requests at t = 0, 0.125, ..., 2.375
    assert fleet.steps[:7] == [0, 1, 2, 0, 1, 2, 0]
    assert statuses == pytest.approx([1.0, 2.0])
    assert max(clock.sleeps) <= 0.05 + 1e-9  # short sleeps: SIGTERM and Ctrl-C are seen at once
    assert loop.elapsed() == pytest.approx(2.5)


def test_rate_zero_serves_without_sleeping_until_stopped() -> None:
    clock = _Clock(step_cost=0.001)
    stop = threading.Event()
    fleet = _Fleet(2, clock, stop_after=500, stop=stop)
    loop = ServeLoop(fleet, rate=0.0, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    loop.run(stop, lambda elapsed: None)
    assert loop.served == 500 and clock.sleeps == []


def test_a_set_stop_serves_nothing() -> None:
    clock = _Clock()
    stop = threading.Event()
    stop.set()
    loop = ServeLoop(_Fleet(1, clock), rate=5.0, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    loop.run(stop, lambda elapsed: None)
    assert loop.served == 0


@pytest.mark.parametrize(
    ("endpoint", "workers", "want"),
    [
        ("tcp://127.0.0.1:5557", 1, "tcp://127.0.0.1:5558"),
        ("tcp://127.0.0.1:5557", 4, "tcp://127.0.0.1:5561"),
        ("tcp://127.0.0.1:*", 2, "tcp://127.0.0.1:*"),
        ("tcp://127.0.0.1:0", 2, "tcp://127.0.0.1:0"),
        ("ipc:///tmp/kve", 1, "ipc:///tmp/kve-replay"),
    ],
)
def test_the_default_replay_endpoint_follows_the_last_live_port(endpoint: str, workers: int, want: str) -> None:
    assert default_replay_endpoint(endpoint, workers) == want


def test_rank_endpoints_offset_each_rank_and_refuse_ports_past_65535() -> None:
    lives, replays = rank_endpoints("tcp://127.0.0.1:6000", "tcp://127.0.0.1:6010", 3)
    assert lives == ["tcp://127.0.0.1:6000", "tcp://127.0.0.1:6001", "tcp://127.0.0.1:6002"]
    assert replays == ["tcp://127.0.0.1:6010", "tcp://127.0.0.1:6011", "tcp://127.0.0.1:6012"]
    assert rank_endpoints("tcp://127.0.0.1:6000", "", 2)[1] == []
    with pytest.raises(ValueError):
        rank_endpoints("tcp://127.0.0.1:65535", "", 2)


def test_a_real_fleet_publishes_what_its_workers_serve() -> None:
    cfg = ServeConfig(
        endpoint=EPH, replay_endpoint=EPH, workers=2, heartbeat_s=0.2
    )  # a stream the slow join missed is found by its heartbeat
    fleet = SimFleet.open(cfg)
    sub = None
    try:
        assert [p.config.dp_rank for p in fleet.pubs] == [0, 1]
        sources = [Source(p.endpoint, p.replay_endpoint, f"w{i}") for i, p in enumerate(fleet.pubs)]
        sub = Subscriber(sources)
        sub.poll(0.2)  # connect before anything is published (replay fills what a slow join missed)
        for k in (0, 1, 0, 1):
            fleet.serve_next(k)
        status = fleet.status(served=4)
        assert status.requests == 4 and status.batches >= 4 and status.events >= 4
        items = collect(
            sub, lambda got: {d.source for d in got if isinstance(d, Delivery) and d.batch.events} == {"w0", "w1"}
        )
        assert all(d.dp_rank in (0, 1) for d in items if isinstance(d, Delivery))
    finally:
        if sub is not None:
            sub.stop()
        assert fleet.close(0.5) == 0


def _opens(cfg: ServeConfig) -> bool:
    try:
        SimFleet.open(cfg).close(0)
    except ValueError:
        return False
    return True


def test_a_fleet_that_cannot_open_closes_the_publishers_it_had() -> None:
    """Rank 1's endpoint is taken (inproc names live in the shared context, so no port is guessed):
    the open fails naming it, and rank 0, bound first, is closed again."""
    name = f"inproc://fleet-open-fails-{uuid.uuid4().hex}"
    squatter = zmq.Context.instance().socket(zmq.PUB)
    try:
        squatter.bind(f"{name}_dp1")  # what rank 1 of a fleet at `name` binds
        with pytest.raises(ValueError, match="already in use"):
            SimFleet.open(ServeConfig(endpoint=name, replay_endpoint="", workers=2))
        # rank 0's name was released by the failed open (a socket of the shared context lets its
        # inproc name go a moment after close(), on libzmq's reaper thread: hence the wait)
        wait_until(
            "rank 0's name free again", lambda: _opens(ServeConfig(endpoint=name, replay_endpoint="", workers=1))
        )
    finally:
        squatter.close(0)
