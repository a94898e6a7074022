"""The /score answer built from columns: the compiled ranking order and rows against their Python
twins, bad columns refused, and whole answers (loads, predictions, hints, policies, temperature,
explain) equal on the compiled and the pure-Python paths."""

from __future__ import annotations

import json
import random
from contextlib import nullcontext

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvevents import native
from kvevents.consumers.cost import tie_orders
from kvevents.consumers.loads import WorkerLoad
from kvevents.consumers.service.answer_rows import ROW_TEMPLATE, rows_py
from kvevents.consumers.service.core import RouterService
from kvevents.consumers.service.score_body import ScoreBody, ScoreHead
from kvevents.consumers.service.scoring import FUSED_MAX_BYTES
from kvevents.consumers.worker_key import WorkerKey
from kvevents.events import BlockStored, KVEventBatch
from kvevents.hashing import pack_tokens
from tests.helpers.push_feed import PushFeed

compiled = pytest.mark.skipif(not native.active(), reason="kvevents.native._speedups not built")

COSTS = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 2.5, float("inf"), float("nan"), 512.0]),
    st.floats(-1e18, 1e18, allow_nan=False),
)


@compiled
@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    st.lists(st.tuples(COSTS, st.integers(0, 5000)), max_size=300, unique_by=lambda t: t[1]), st.integers(0, 2**64 - 1)
)
def test_cost_order_is_numpys_lexsort_of_cost_then_tie(rows, salt):
    cost = np.array([c for c, _ in rows], np.float64)
    worker = np.array([w for _, w in rows], np.int64)
    got = np.frombuffer(native.cost_order(cost, worker, salt), np.intp)
    assert got.tolist() == np.lexsort((tie_orders(worker, salt), cost)).tolist()


@compiled
@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    st.lists(st.tuples(COSTS, st.integers(0, 5000)), max_size=300, unique_by=lambda t: t[1]),
    st.integers(0, 2**64 - 1),
    st.integers(0, 4096),
    st.sampled_from([0.0, 0.5, 1.0, 3.0]),
)
def test_prefix_rank_is_numpys_cost_then_lexsort(rows, salt, pages, scale):
    have = np.array([c for c, _ in rows], np.float64)
    worker = np.array([w for _, w in rows], np.int64)
    raw = native.prefix_rank(have, worker, float(pages), scale, salt)
    n = len(rows)
    assert len(raw) == 24 * n
    cost = np.maximum(float(pages) - have, 0.0) * scale  # the twin (consumers/cost.py)
    order = np.lexsort((tie_orders(worker, salt), cost))
    got_cost = np.frombuffer(raw, np.float64, n, 8 * n)
    assert np.frombuffer(raw, np.int64, n).tolist() == worker[order].tolist()
    np.testing.assert_array_equal(got_cost, cost[order])  # NaN where NaN
    assert np.signbit(got_cost).tolist() == np.signbit(cost[order]).tolist()  # -0.0 where -0.0
    assert np.frombuffer(raw, np.intp, n, 16 * n).tolist() == order.tolist()


@compiled
def test_prefix_rank_refuses_columns_that_differ_or_are_not_8_byte_numbers():
    with pytest.raises(ValueError, match="prefix_rank: 2 haves but 1 workers"):
        native.prefix_rank(np.zeros(2), np.zeros(1, np.int64), 4.0, 1.0, 0)
    with pytest.raises(ValueError, match="have"):
        native.prefix_rank(np.zeros(2, np.float32), np.zeros(2, np.int64), 4.0, 1.0, 0)
    with pytest.raises(ValueError, match="worker"):
        native.prefix_rank(np.zeros(2), np.zeros(2), 4.0, 1.0, 0)
    assert native.prefix_rank(np.zeros(0), np.zeros(0, np.int64), 4.0, 1.0, 0) == b""


@st.composite
def _columns(draw):
    nsrc = draw(st.integers(1, 40))
    sources = [f"w{i}" for i in range(nsrc)]
    dps = [draw(st.integers(0, 3)) for _ in range(nsrc)]
    n = draw(st.integers(0, 30))
    nm = draw(st.integers(0, 30))
    worker = np.array([draw(st.integers(0, nsrc - 1)) for _ in range(n)], np.int64)
    at = np.array([draw(st.integers(-1, nm + 2)) for _ in range(n)], np.intp)
    cost = np.array([draw(COSTS) for _ in range(n)], np.float64)
    pages = np.array([draw(st.sampled_from([0, 1, 255, 256, 257, 512, 10**12])) for _ in range(nm)], np.int64)
    score = np.array([draw(COSTS) for _ in range(nm)], np.float64)
    predicted = draw(st.none() | st.just(np.array([draw(st.integers(0, 600)) for _ in range(n)], np.int64)))
    names = tuple(draw(st.lists(st.sampled_from(["queue", "load", "stale", "pages_by_medium"]), unique=True)))
    extra = tuple([draw(st.sampled_from([None, 1, 0.5, True, "x"])) for _ in range(n)] for _ in names)
    return (
        ROW_TEMPLATE,
        sources,
        dps,
        worker,
        at,
        cost,
        pages,
        score,
        predicted,
        draw(st.integers(1, 64)),
        names,
        extra,
    )


@compiled
@settings(max_examples=150, derandomize=True, deadline=None)
@given(_columns())
def test_score_rows_are_the_python_rows(args):
    got, want = native.score_rows(*args), rows_py(*args)
    assert json.dumps(got) == json.dumps(want)  # the same keys, in the same order, the same values
    assert got == want or any(v != v for row in want for v in row.values() if isinstance(v, float))  # NaN != NaN


@pytest.mark.parametrize("path", ["c", "python"])
def test_bad_columns_are_refused_with_value_error(path):
    if path == "c" and not native.active():
        pytest.skip("kvevents.native._speedups not built")
    build = native.score_rows if path == "c" else rows_py
    i64, f64 = (lambda *v: np.array(v, np.int64)), (lambda *v: np.array(v, np.float64))
    ok = (ROW_TEMPLATE, ["w0"], [0], i64(0), np.array([0], np.intp), f64(1.0), i64(3), f64(3.0), None, 16, (), ())
    assert build(*ok)[0]["matched_tokens"] == 48
    with pytest.raises(ValueError, match="worker 5"):
        build(*ok[:3], i64(5), *ok[4:])
    if path == "c":  # the twin trusts its caller's shapes; the compiled rows check them
        with pytest.raises(ValueError, match="column cost"):
            build(*ok[:5], f64(1.0, 2.0), *ok[6:])
        with pytest.raises(ValueError, match="extra column 0"):
            build(*ok[:10], ("queue",), ([1, 2],))


def _answers(seed: int) -> list[str]:
    """A fleet of 80 workers over two media and a long chain; answers under every option, as JSON."""
    rnd = random.Random(seed)
    svc = RouterService(feed=PushFeed([]), page_size=4, seed=seed)
    chain = [rnd.randrange(-(2**63), 2**63) for _ in range(40)]
    for w in range(80):
        upto = rnd.choice([40, 40, rnd.randrange(1, 41)])
        medium = rnd.choice(["GPU", "GPU", "CPU_PINNED"])
        svc.index.apply(f"w{w}", KVEventBatch(0.0, [BlockStored(chain[:upto], None, [], 4, None, medium, None)], 0))
    tokens = [rnd.randrange(50_000) for _ in range(160)]
    hashes = svc.router.hash_array(tokens)
    for w in range(80):  # the chain above under this request's own hashes too
        upto = rnd.randrange(0, 41)
        if upto:
            batch = KVEventBatch(0.0, [BlockStored(hashes[:upto].tolist(), None, [], 4, None, "GPU", None)], 0)
            svc.index.apply(f"w{w}", batch)
    out = []
    fresh = tokens[:80] + [rnd.randrange(50_000) for _ in range(80)]  # pages 20-39 held by nobody
    bodies = [
        ScoreBody(tokens=tokens, route=False),
        ScoreBody(tokens=tokens, route=False, policy="prefix"),
        ScoreBody(tokens=tokens, route=False, explain=True, top_k=3),
        ScoreBody(tokens=tokens[:37], route=True),  # credits predictions for the next ones
        ScoreBody(tokens=tokens, route=True),
        ScoreBody(tokens=fresh, route=True),  # its pick is credited pages nobody holds...
        ScoreBody(tokens=fresh, route=False),  # ...so it is listed with predicted pages
        ScoreBody(tokens=tokens, route=False, temperature=0.5),
    ]
    for body in bodies:
        out.append(json.dumps(svc.answer_score(body, body.tokens)))
    at = svc.loads.clock() + 1e9
    for w in range(0, 80, 3):
        svc.loads.put(WorkerKey(f"w{w}"), WorkerLoad(float(w % 7), float(w % 5), w % 4 or None, at, "metrics"))
    svc.router.set_load(WorkerKey("w4"), 3.0)
    for body in bodies:
        out.append(json.dumps(svc.answer_score(body, body.tokens)))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_whole_answers_equal_on_the_compiled_and_python_paths(seed):
    fast = _answers(seed)
    with native.python_only():
        slow = _answers(seed)
    assert fast == slow
    first = json.loads(fast[0])
    assert first["workers"] and first["workers"][0]["matched_pages"] > 0
    loaded = [row for a in fast[6:] for row in json.loads(a)["workers"]]
    assert any(row["active_prefill_blocks"] for row in loaded) and any(row["load"] for row in loaded)
    assert any(row["predicted_blocks"] for a in fast for row in json.loads(a)["workers"])


def test_a_fresh_service_answers_with_no_workers_on_either_path():
    for ctx in (nullcontext(), native.python_only()):
        with ctx:
            svc = RouterService(feed=PushFeed([]), page_size=4, seed=0)
            got = svc.answer_score(ScoreBody(tokens=list(range(12)), route=True), list(range(12)))
            assert got["workers"] == [] and got["pick"] is None


@pytest.mark.parametrize("path", ["c", "python"])
def test_packed_ids_answer_as_their_token_list_does(path):
    """Packed ids up to FUSED_MAX_BYTES are hashed inside the lock as the walk reads them (compiled),
    longer ones outside it: every answer equals the one its token list gets (from a twin service, so
    the tie draws of the workers listed without a match agree)."""
    if path == "c" and not native.active():
        pytest.skip("kvevents.native._speedups not built")
    rnd = random.Random(7)
    by_list, by_packed = (RouterService(feed=PushFeed([]), page_size=4, seed=0) for _ in range(2))
    tokens = [rnd.randrange(50_000) for _ in range(FUSED_MAX_BYTES // 4 + 40)]  # past the cap
    for salt in (None, "tenant-a"):
        hashes = by_list.router.hash_array(tokens, salt).tolist()
        for w in range(12):
            upto = rnd.randrange(1, len(hashes))
            batch = KVEventBatch(0.0, [BlockStored(hashes[:upto], None, [], 4, None, "GPU", None)], 0)
            by_list.index.apply(f"w{w}", batch)
            by_packed.index.apply(f"w{w}", batch)
    with native.python_only() if path == "python" else nullcontext():
        for n in (0, 3, 4, 37, 400, FUSED_MAX_BYTES // 4, len(tokens)):
            for salt in (None, "tenant-a"):
                for lora in (None, "lora-a"):
                    body = ScoreBody(tokens=tokens[:n], route=False, cache_salt=salt, lora_name=lora)
                    head = ScoreHead(tokens=msgspec.Raw(b"[]"), route=False, cache_salt=salt, lora_name=lora)
                    want = by_list.answer_score(body, body.tokens)
                    assert by_packed.answer_score(head, pack_tokens(tokens[:n])) == want, (n, salt, lora)
        assert want["workers"] and want["workers"][0]["matched_pages"] > 0
