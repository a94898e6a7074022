"""/score ranks by a documented cost (issue 26 part 1): Dynamo's linear form, overlap credited per
medium, prefill_load_scale, a seeded temperature, the prefix policy, and (part 5) an answer of the
matched workers plus top_k others, the rest counted."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kvevents.consumers.cost import CostSettings, rank_workers
from kvevents.consumers.service.core import RoutingOptions
from tests.helpers.push_feed import PAGE, by_name, score, service

DOC = list(range(1000, 1000 + 10 * PAGE))  # 10 pages
OTHER = list(range(5000, 5000 + 3 * PAGE))
LOADS = [
    {"worker": "a", "active_prefill_blocks": 20, "active_decode_blocks": 5, "queue": 3},
    {"worker": "b", "active_prefill_blocks": 0, "active_decode_blocks": 0},
    {"worker": "c", "active_prefill_blocks": 0, "active_decode_blocks": 1, "queue": 0},
]


@pytest.fixture
def trio():
    """a holds 8 pages of DOC on GPU, b the same 8 on host memory (CPU_PINNED), c none of them."""
    svc, feed = service(["a", "b", "c"])
    feed.store("a", DOC[: 8 * PAGE])
    feed.store("b", DOC[: 8 * PAGE], medium="CPU_PINNED")
    feed.store("c", OTHER)
    svc.process()
    yield svc
    svc.stop()


def test_the_cost_is_dynamos_linear_form_with_credit_per_medium(trio):
    out = score(trio, DOC, loads=LOADS, route=False)
    w = by_name(out)
    # a: max(20 + 10 - 8 x 1.0, 0) + 5 = 27; b: max(0 + 10 - 8 x 0.8, 0) + 0 = 3.6; c: 10 + 1 = 11
    assert [x["worker"] for x in out["workers"]] == ["b", "c", "a"]
    assert (w["a"]["cost"], w["b"]["cost"], w["c"]["cost"]) == (27.0, 3.6, 11.0)
    assert (out["pick"], out["best"], out["policy"], out["workers_total"]) == ("b", "b", "cost", 3)
    assert (w["a"]["overlap_blocks"], w["a"]["matched_pages"], w["a"]["score"]) == (8, 8, 8.0)
    assert (w["b"]["score"], w["b"]["overlap_blocks"]) == (6.4, 8)
    assert (w["a"]["active_prefill_blocks"], w["a"]["active_decode_blocks"], w["a"]["queue"]) == (20.0, 5.0, 3)
    assert (w["b"]["queue"], w["a"]["load_source"], w["a"]["load_stale"]) == (None, "request", False)


def test_prefill_load_scale_weighs_prefill_against_decode(trio):
    out = score(trio, DOC, loads=LOADS, prefill_load_scale=0.0, route=False)
    assert [(x["worker"], x["cost"]) for x in out["workers"]] == [("b", 0.0), ("c", 1.0), ("a", 5.0)]
    out = score(trio, DOC, loads=LOADS, prefill_load_scale=2.0, route=False)
    assert [(x["worker"], x["cost"]) for x in out["workers"]] == [("b", 7.2), ("c", 21.0), ("a", 49.0)]


def test_the_prefix_policy_ranks_as_before(trio):
    """Longest weighted prefix first whatever the load: a (8.0) before b (6.4) before c."""
    out = score(trio, DOC, loads=LOADS, policy="prefix", route=False)
    assert [x["worker"] for x in out["workers"]] == ["a", "b", "c"] and out["policy"] == "prefix"
    assert by_name(out)["a"]["cost"] == 27.0  # the cost is still reported
    svc, feed = service(["a", "b", "c"], RoutingOptions(cost=CostSettings(policy="prefix")))
    feed.store("a", DOC[: 8 * PAGE])
    feed.store("b", DOC[: 8 * PAGE], medium="CPU_PINNED")
    feed.store("c", OTHER)
    svc.process()
    out = score(svc, DOC, loads=LOADS, route=False)
    assert out["policy"] == "prefix" and out["pick"] == "a"
    assert score(svc, DOC, loads=LOADS, policy="cost", route=False)["pick"] == "b"


def test_without_loads_the_cost_order_is_the_prefix_order(trio):
    out = score(trio, DOC, route=False)
    assert [(x["worker"], x["cost"]) for x in out["workers"]] == [("a", 2.0), ("b", 3.6), ("c", 10.0)]
    assert all(x["load_source"] is None and x["queue"] is None for x in out["workers"])


def test_temperature_draws_the_pick_from_a_seeded_rng():
    def picks(seed: int, temperature: float) -> list[str]:
        svc, feed = service(["a", "b", "c"], seed=seed)
        for name in "abc":
            feed.store(name, OTHER)
        svc.process()
        loads = [{"worker": n, "active_decode_blocks": d} for n, d in (("a", 0), ("b", 2), ("c", 4))]
        return [score(svc, DOC, loads=loads, temperature=temperature, route=False)["pick"] for _ in range(60)]

    assert set(picks(1, 0.0)) == {"a"}  # 0: the lowest cost, always
    hot = picks(1, 5.0)
    assert hot == picks(1, 5.0)  # the same seed draws the same picks
    assert set(hot) == {"a", "b", "c"} and Counter(hot)["a"] > Counter(hot)["c"]
    assert Counter(picks(1, 0.05))["a"] > 50  # a low temperature nearly always takes the cheapest


def test_an_answer_lists_the_matched_plus_top_k_and_counts_the_rest():
    names = [f"w{i}" for i in range(100)]
    svc, feed = service(names)
    for i, name in enumerate(names):
        feed.store(name, DOC[: (i % 4 + 1) * PAGE] if i < 12 else OTHER)  # 12 match 1..4 pages
    svc.process()
    out = score(svc, DOC, route=False)
    assert out["workers_total"] == 100 and len(out["workers"]) == 12 + 0  # the 8 cheapest all matched
    assert [x["matched_pages"] for x in out["workers"]] == [4, 4, 4, 3, 3, 3, 2, 2, 2, 1, 1, 1]
    out = score(svc, DOC, route=False, top_k=20)
    assert len(out["workers"]) == 20 and sum(1 for x in out["workers"] if x["matched_pages"]) == 12
    loads = [{"worker": n, "active_prefill_blocks": 50} for n in names[:12]]
    loads += [{"worker": n, "active_decode_blocks": 0 if n == "w99" else 1} for n in names[12:]]
    out = score(svc, DOC, loads=loads, route=False, top_k=3)
    # the matched ones are loaded now: three unmatched head the list (w99 at 10, two at 11), every match listed
    assert len(out["workers"]) == 15 and all(x["matched_pages"] == 0 for x in out["workers"][:3])
    assert out["pick"] == "w99" and [x["cost"] for x in out["workers"][:3]] == [10.0, 11.0, 11.0]


def test_ties_fall_at_random():
    svc, feed = service([f"w{i}" for i in range(8)])
    for i in range(8):
        feed.store(f"w{i}", OTHER)
    svc.process()
    picks = Counter(score(svc, DOC, route=False)["pick"] for _ in range(80))
    assert len(picks) >= 6  # 8 equal workers: nobody is always first
    loads = [{"worker": f"w{i}", "active_decode_blocks": 3} for i in range(8)]
    picks = Counter(score(svc, DOC, route=False, loads=loads, top_k=1)["pick"] for _ in range(80))
    assert len(picks) >= 6  # the vector path's ties too


def test_rank_workers_with_no_workers_is_empty():
    from kvevents.consumers.cost import WorkerSlots
    from kvevents.consumers.loads import LoadVectors

    assert rank_workers({}, WorkerSlots(), {}, LoadVectors(0), 4, CostSettings(), random.Random(0)) == []


@pytest.mark.parametrize(
    "field, value",
    [("policy", "fastest"), ("temperature", -1), ("prefill_load_scale", 1e9), ("temperature", "1"), ("loads", [{}])],
)
def test_bad_cost_fields_are_400(trio, field, value):
    import json

    status, out = trio.handle_score(json.dumps({"tokens": DOC, field: value}).encode())
    assert status == 400 and field in out["error"]


def test_cost_settings_refuse_nonsense():
    for bad in ({"policy": "x"}, {"prefill_load_scale": -1}, {"temperature": float("inf")}, {"top_k": 0}):
        with pytest.raises(ValueError):
            CostSettings(**bad)  # type: ignore[arg-type]
