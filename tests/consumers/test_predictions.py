"""Predicted blocks (issue 26 part 1): a routed request's whole pages are credited to the pick for
--predicted-ttl seconds, replaced by the engine's own BlockStored, dropped at expiry or reset, and
never counted as the index's copies."""

from __future__ import annotations

import numpy as np
import pytest

from kvevents.consumers.predictions import PredictedBlocks
from kvevents.consumers.service.core import RoutingOptions
from kvevents.consumers.worker_key import WorkerKey
from kvevents.hashing import Namespace, event_hashes_int64
from tests.helpers.push_feed import PAGE, Clock, by_name, score, service

SYSTEM = list(range(7000, 7000 + 12 * PAGE))  # a new system prompt: 12 pages nobody holds yet
NAMES = ["w0", "w1", "w2", "w3"]


def _fleet(ttl: float, clock: Clock | None = None, seed: int = 3):
    svc, feed = service(NAMES, RoutingOptions(predicted_ttl_s=ttl), clock, seed=seed)
    for i, name in enumerate(NAMES):
        feed.store(name, list(range(100 * i, 100 * i + 2 * PAGE)))  # each worker known, holding its own pages
    svc.process()
    return svc, feed


def _sibling(i: int) -> list[int]:
    return SYSTEM + [50_000 + 10 * i + t for t in range(2 * PAGE)]  # the shared prompt + a user turn of 2 pages


def test_a_burst_of_siblings_lands_on_one_worker():
    svc, _ = _fleet(ttl=2.0)
    outs = [score(svc, _sibling(i)) for i in range(8)]  # no engine event arrives meanwhile
    picks = {o["pick"] for o in outs}
    assert len(picks) == 1, picks
    assert outs[0]["best"] is None and outs[0]["routed"] is True  # the first finds nothing cached
    later = by_name(outs[5])[outs[0]["pick"]]
    assert (later["matched_pages"], later["predicted_blocks"], later["overlap_blocks"]) == (0, 12, 12)
    assert outs[5]["best"] == outs[0]["pick"]


def test_without_predictions_the_burst_spreads_by_ties():
    """The same burst and seed with --predicted-ttl 0: the siblings tie and spread."""
    svc, _ = _fleet(ttl=0.0)
    picks = {score(svc, _sibling(i))["pick"] for i in range(8)}
    assert len(picks) > 1


def test_predictions_never_reach_the_index_or_workers():
    svc, _ = _fleet(ttl=2.0)
    before = (svc.workers_view()["workers"], len(svc.index), svc.index.block_counts(), svc.index.distinct_hashes)
    for i in range(4):
        score(svc, _sibling(i))
    after = (svc.workers_view()["workers"], len(svc.index), svc.index.block_counts(), svc.index.distinct_hashes)
    assert before == after and svc.predictions.pages > 0
    metrics = svc.metrics.render().decode()
    assert "kvevents_router_predicted_blocks{" in metrics
    assert 'kvevents_router_block_copies{medium="GPU",worker="w0"} 2.0' in metrics


def test_the_engines_block_stored_replaces_the_prediction():
    svc, feed = _fleet(ttl=2.0)
    first = score(svc, _sibling(0))
    pick = first["pick"]
    assert svc.predictions.per_worker() == {WorkerKey(pick): 14}
    feed.store(pick, _sibling(0))  # the engine has done the prefill
    svc.process()
    assert svc.predictions.pages == 0 and svc.predictions.counters["confirmed"] == 14
    w = by_name(score(svc, _sibling(1), route=False))[pick]
    assert (w["matched_pages"], w["predicted_blocks"], w["overlap_blocks"]) == (12, 0, 12)


def test_predictions_expire_on_the_injected_clock():
    clock = Clock(50.0)
    svc, _ = _fleet(ttl=2.0, clock=clock)
    pick = score(svc, _sibling(0))["pick"]
    clock.now += 1.9
    assert by_name(score(svc, _sibling(1), route=False))[pick]["predicted_blocks"] == 12
    clock.now += 0.2
    out = score(svc, _sibling(1), route=False)
    assert all(w["predicted_blocks"] == 0 for w in out["workers"]) and svc.predictions.pages == 0
    assert svc.predictions.counters["expired"] == 14


def test_a_reset_drops_the_workers_predictions():
    svc, feed = _fleet(ttl=2.0)
    pick = score(svc, _sibling(0))["pick"]
    feed.reset(pick)
    svc.process()
    assert svc.predictions.pages == 0


def test_route_false_credits_nothing_and_lora_names_stay_apart():
    svc, _ = _fleet(ttl=2.0)
    out = score(svc, _sibling(0), route=False)
    assert out["routed"] is False and svc.predictions.pages == 0
    pick = score(svc, _sibling(0), lora_name="lora-a")["pick"]
    assert by_name(score(svc, _sibling(1), route=False)).get(pick, {}).get("predicted_blocks", 0) == 0
    assert by_name(score(svc, _sibling(1), lora_name="lora-a", route=False))[pick]["predicted_blocks"] == 12


def _chain(tokens: list[int]) -> np.ndarray:
    return np.asarray(event_hashes_int64(tokens, PAGE, Namespace()), np.int64)


def test_predicted_blocks_extend_an_index_prefix_and_stay_bounded():
    clock = Clock(0.0)
    p = PredictedBlocks(2.0, clock, max_pages=30)
    a, b = WorkerKey("a"), WorkerKey("b", 1)
    p.credit(a, _chain(_sibling(0)), None)
    # a request sharing 12 pages: a's prefix runs on the prediction; b's index prefix of 3 is not predicted
    assert p.extend(_chain(_sibling(1)), None, {b: 3}, clock.now) == {a: 12}
    assert p.extend(_chain(_sibling(1)), None, {a: 12}, clock.now) == {}  # nothing past what a holds
    assert p.extend(_chain(_sibling(0)), "lora-a", {}, clock.now) == {}
    p.credit(a, _chain(_sibling(0)), None)  # routed again: replaced, not doubled
    assert p.pages == 14 and p.counters["replaced"] == 14
    p.credit(b, _chain(_sibling(2)), None)
    p.credit(b, _chain(_sibling(3)), None)  # a sibling routed to b again: the newest chain stands for both
    assert p.pages == 28 and p.counters["replaced"] == 28
    p.credit(WorkerKey("c"), _chain(_sibling(4)), None)  # 42 pages > 30: the oldest chain (a's) goes
    assert p.pages == 28 and p.counters["evicted"] == 14 and a not in p.per_worker()
    assert p.extend(_chain(_sibling(5)), None, {}, clock.now) == {b: 12, WorkerKey("c"): 12}
    assert p.confirm(b, [int(_chain(_sibling(3))[-1]), "junk"], None) == 14 and p.pages == 14
    with pytest.raises(ValueError):
        PredictedBlocks(-1, clock)
