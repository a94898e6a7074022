"""The pacing of long /score bodies (kvevents.consumers.service.score_pool.ReadRate), on a fake
clock: how long a reader waits follows the bytes read and the rate, never the call count."""

from __future__ import annotations

import pytest

from kvevents.consumers.service.score_pool import LongBodies, ReadRate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_passes_then_reading_follows_the_rate():
    clock = Clock()
    rate = ReadRate(1_000_000, burst=200_000, clock=clock)
    assert [rate.pause(50_000) for _ in range(4)] == [0.0] * 4  # 200 KB: the burst
    assert rate.pause(100_000) == pytest.approx(0.1)  # 100 KB past it: 0.1 s at 1 MB/s
    clock.now += 0.1  # the reader slept as told
    waits = []
    for _ in range(10):
        waits.append(rate.pause(100_000))
        clock.now += waits[-1]
    assert sum(waits) == pytest.approx(1.0)  # 1 MB more: 1 s, however it is cut
    assert rate.pauses == 11 and rate.paused_s == pytest.approx(1.1)


def test_idle_time_refills_up_to_one_burst_only():
    clock = Clock()
    rate = ReadRate(1_000_000, burst=200_000, clock=clock)
    rate.pause(200_000)
    clock.now += 60.0  # a minute with nothing read
    assert rate.pause(200_000) == 0.0
    assert rate.pause(300_000) == pytest.approx(0.3)  # not 60 s of credit


def test_a_slow_reader_is_never_paused():
    """A client sending slower than the rate: it has paid for its bytes by the time they come."""
    clock = Clock()
    rate = ReadRate(1_000_000, burst=100_000, clock=clock)
    for _ in range(20):
        clock.now += 0.2
        assert rate.pause(100_000) == 0.0  # 0.5 MB/s arriving
    assert rate.pauses == 0


def test_rate_zero_never_paces_and_bad_rates_are_refused():
    rate = ReadRate(0)
    assert rate.pause(1 << 30) == 0.0 and rate.seconds(1 << 30) == 0.0
    with pytest.raises(ValueError, match="bytes_per_s >= 0"):
        ReadRate(-1)
    with pytest.raises(ValueError, match="burst >= 0"):
        ReadRate(1, burst=-5)


def test_the_body_timeout_grows_by_the_paced_read_time_of_every_place():
    long = LongBodies(slots=2, queue=1, wait_s=1.0, bytes_per_s=4_000_000)
    try:
        assert long.read_allowance(16_000_000) == pytest.approx(8.0)  # two bodies share 4 MB/s
        assert long.counts()["paced"] == 0 and long.counts()["paced_ms"] == 0
    finally:
        long.close()
    unpaced = LongBodies(slots=2, queue=1, wait_s=1.0)
    try:
        assert unpaced.read_allowance(16_000_000) == 0.0
    finally:
        unpaced.close()
