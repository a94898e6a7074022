"""Load from three sources, newest wins per worker (issue 26 part 1): the request's `loads`, the
engines' scraped metrics, the router's own in-flight count (RouterService.set_inflight_source);
a load older than --load-stale-after is `load_stale`. Injected clock: no sleeps."""

from __future__ import annotations

import pytest

from kvevents.consumers.loads import LoadBoard, WorkerLoad
from kvevents.consumers.service.core import RoutingOptions
from kvevents.consumers.worker_key import WorkerKey
from tests.helpers.push_feed import PAGE, Clock, by_name, score, service

DOC = list(range(10 * PAGE))


@pytest.fixture
def pair():
    clock = Clock(100.0)
    svc, feed = service(["a", "b"], RoutingOptions(load_stale_after_s=5.0), clock)
    feed.store("a", DOC[:PAGE])
    feed.store("b", DOC[:PAGE], rank=1)  # b's rank 1
    svc.process()
    yield svc, clock
    svc.stop()


def test_a_scraped_load_then_newer_sources_win(pair):
    svc, clock = pair
    a, b = WorkerKey("a"), WorkerKey("b", 1)
    svc.loads.put(a, WorkerLoad(4.0, 30.0, 2, clock.now, "metrics"))
    svc.loads.put(b, WorkerLoad(0.0, 10.0, 0, clock.now, "metrics"))
    w = by_name(score(svc, DOC, route=False))
    assert (w["a"]["active_prefill_blocks"], w["a"]["active_decode_blocks"], w["a"]["queue"]) == (4.0, 30.0, 2)
    assert w["a"]["load_source"] == "metrics" and w["a"]["cost"] == 4 + 10 - 1 + 30
    # the router's in-flight count (its proxy's) is current: it wins over the scrape; the queue stays the scrape's
    svc.set_inflight_source(lambda: {a: (1, 2), WorkerKey("nobody"): (9, 9)})
    w = by_name(score(svc, DOC, route=False))
    assert (w["a"]["active_prefill_blocks"], w["a"]["active_decode_blocks"], w["a"]["queue"]) == (1.0, 2.0, 2)
    assert w["a"]["load_source"] == "inflight" and w["b"]["load_source"] == "metrics"
    # the request's own loads are the newest of all (b named with its dp rank)
    given = [{"worker": "a", "active_decode_blocks": 7}, {"worker": "b", "dp_rank": 1, "active_prefill_blocks": 3}]
    w = by_name(score(svc, DOC, loads=given, route=False))
    assert (w["a"]["active_decode_blocks"], w["a"]["load_source"], w["a"]["queue"]) == (7.0, "request", None)
    assert (w["b"]["active_prefill_blocks"], w["b"]["active_decode_blocks"], w["b"]["dp_rank"]) == (3.0, 0.0, 1)
    svc.set_inflight_source(None)
    assert by_name(score(svc, DOC, route=False))["a"]["load_source"] == "metrics"


def test_an_old_scrape_does_not_replace_a_newer_one():
    board = LoadBoard(Clock(), 5.0)
    key = WorkerKey("a")
    assert board.put(key, WorkerLoad(1, 1, 1, 10.0, "metrics"))
    assert not board.put(key, WorkerLoad(2, 2, 2, 9.0, "metrics"))
    assert board.get(key) == WorkerLoad(1, 1, 1, 10.0, "metrics")


def test_load_stale_by_age_on_the_injected_clock(pair):
    svc, clock = pair
    svc.loads.put(WorkerKey("a"), WorkerLoad(0.0, 1.0, 0, clock.now, "metrics"))
    assert by_name(score(svc, DOC, route=False))["a"]["load_stale"] is False
    clock.now += 5.0
    assert by_name(score(svc, DOC, route=False))["a"]["load_stale"] is False
    clock.now += 0.01
    w = by_name(score(svc, DOC, route=False))
    assert w["a"]["load_stale"] is True and w["a"]["active_decode_blocks"] == 1.0  # the last known load still counts
    assert w["b"]["load_stale"] is False  # no load at all and none expected: 0, not stale
    svc.set_inflight_source(lambda: {WorkerKey("a"): (0, 0)})
    assert by_name(score(svc, DOC, route=False))["a"]["load_stale"] is False  # in-flight counts are current


def test_a_scraped_source_without_a_load_yet_is_stale():
    svc, feed = service(["a", "b"], RoutingOptions(metrics_urls={"a": "http://127.0.0.1:9/metrics"}))
    feed.store("a", DOC[:PAGE])
    feed.store("b", DOC[:PAGE])
    svc.process()
    w = by_name(score(svc, DOC, route=False))
    assert w["a"]["load_stale"] is True and w["b"]["load_stale"] is False


def test_vectors_follow_new_workers_and_loads():
    """Loads put before a worker exists reach it when it appears; later puts reach it incrementally."""
    svc, feed = service(["a", "b"])
    svc.loads.put(WorkerKey("b"), WorkerLoad(0.0, 9.0, 1, 100.0, "metrics"))
    feed.store("a", DOC[:PAGE])
    svc.process()
    assert [w["worker"] for w in score(svc, DOC, route=False)["workers"]] == ["a"]
    feed.store("b", DOC[:PAGE])
    svc.process()
    assert by_name(score(svc, DOC, route=False))["b"]["active_decode_blocks"] == 9.0
    svc.loads.put(WorkerKey("b"), WorkerLoad(0.0, 4.0, 1, 101.0, "metrics"))
    assert by_name(score(svc, DOC, route=False))["b"]["active_decode_blocks"] == 4.0


def test_the_publisher_stale_flag_is_read_from_the_cached_view(pair):
    svc, _ = pair
    feed = svc.feed
    feed.stale.add("b")  # type: ignore[attr-defined]
    svc.freshness.refresh()
    out = score(svc, DOC, route=False)
    assert out["stale"] is True and by_name(out)["b"]["stale"] is True and by_name(out)["a"]["stale"] is False
