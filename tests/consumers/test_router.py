"""PrefixRouter: longest consecutive prefix per worker, medium weights, lora_strict, ties."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.router import PrefixRouter
from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from kvevents.hashing import Namespace, event_hashes, to_int64
from kvevents.sim.worker import Request, SimWorker

PAGE = 4


def hashes(tokens, salt=None):
    return [to_int64(h) for h in event_hashes(tokens, PAGE, Namespace(cache_salt=salt))]


def store(idx, source, tokens, *, n_pages=None, medium="GPU", lora=None, salt=None, rank=None):
    hs = hashes(tokens, salt)[:n_pages]
    idx.apply(
        source,
        KVEventBatch(
            0.0, [BlockStored(hs, None, list(tokens[: len(hs) * PAGE]), PAGE, None, medium, lora, salt)], rank
        ),
    )
    return hs


TOKENS = list(range(100, 100 + 40 * PAGE))


def test_picks_the_worker_with_the_longest_prefix():
    idx = BlockIndex()
    store(idx, "short", TOKENS, n_pages=3)
    store(idx, "long", TOKENS, n_pages=30)
    store(idx, "mid", TOKENS, n_pages=12)
    store(idx, "none", [7] * 16)
    r = PrefixRouter(idx, PAGE, seed=1)
    ranked = r.score(TOKENS + [1, 2])  # a partial tail page is never matched
    assert [s.worker for s in ranked[:3]] == ["long", "mid", "short"]
    assert [s.matched_pages for s in ranked] == [30, 12, 3, 0]
    assert ranked[0].matched_tokens == 30 * PAGE and ranked[0].score == pytest.approx(30.0)
    assert r.score_hashes(hashes(TOKENS))[0].worker == "long"


def test_prefix_must_be_consecutive_from_the_first_page():
    idx = BlockIndex()
    hs = hashes(TOKENS)
    idx.apply("holey", KVEventBatch(0.0, [BlockStored(hs[:2] + hs[3:20], None, [], PAGE, None, "GPU", None)]))
    store(idx, "whole", TOKENS, n_pages=5)
    ranked = PrefixRouter(idx, PAGE).score(TOKENS)
    assert [(s.worker, s.matched_pages) for s in ranked] == [("whole", 5), ("holey", 2)]


def test_salt_changes_the_hashes_and_so_the_match():
    idx = BlockIndex()
    store(idx, "salted", TOKENS, n_pages=10, salt="tenant-a")
    store(idx, "plain", TOKENS, n_pages=4)
    r = PrefixRouter(idx, PAGE)
    assert r.score(TOKENS, cache_salt="tenant-a")[0].worker == "salted"
    assert r.score(TOKENS)[0].worker == "plain"
    assert r.score(TOKENS, cache_salt="tenant-b")[0].matched_pages == 0


def test_medium_weights():
    idx = BlockIndex()
    store(idx, "gpu", TOKENS, n_pages=10)
    store(idx, "cpu", TOKENS, n_pages=12, medium="CPU_PINNED")
    store(idx, "disk", TOKENS, n_pages=14, medium="STORAGE")
    r = PrefixRouter(idx, PAGE)
    got = {s.worker: s.score for s in r.score(TOKENS)}
    assert got == pytest.approx({"gpu": 10.0, "cpu": 12 * 0.8, "disk": 14 * 0.5})
    # a worker with its first pages on GPU and the rest offloaded gets each page's best medium
    store(idx, "mixed", TOKENS, n_pages=6)
    hs = hashes(TOKENS)
    idx.apply("mixed", KVEventBatch(0.0, [BlockStored(hs[6:20], hs[5], [], PAGE, None, "CPU_PINNED", None)]))
    ex = {w["worker"]: w for w in r.explain(TOKENS)["workers"]}
    assert ex["mixed"]["matched_pages"] == 20
    assert ex["mixed"]["score"] == pytest.approx(6 + 14 * 0.8)
    assert ex["mixed"]["pages_by_medium"] == {"GPU": 6, "CPU_PINNED": 14}
    custom = PrefixRouter(idx, PAGE, medium_weights={"GPU": 1.0, "CPU_PINNED": 1.0, "STORAGE": 1.0})
    assert custom.score(TOKENS)[0].worker == "mixed"


def test_lora_strict_credits_only_the_requests_adapter():
    idx = BlockIndex()
    store(idx, "adapter-a", TOKENS, n_pages=20, lora="lora-a")
    store(idx, "adapter-b", TOKENS, n_pages=30, lora="lora-b")
    store(idx, "base", TOKENS, n_pages=10)
    store(idx, "base", [1] * PAGE, lora="lora-c")  # base publishes lora names: its lora-less copies are base
    strict = PrefixRouter(idx, PAGE, lora_strict=True)
    loose = PrefixRouter(idx, PAGE, lora_strict=False)
    assert strict.score(TOKENS, lora_name="lora-a")[0].worker == "adapter-a"
    assert {s.worker: s.matched_pages for s in strict.score(TOKENS, lora_name="lora-a")} == {
        "adapter-a": 20,
        "adapter-b": 0,
        "base": 0,
    }
    assert strict.score(TOKENS)[0].worker == "base"  # the base model's copy only
    assert strict.score(TOKENS, lora_name="lora-z")[0].matched_pages == 0
    assert loose.score(TOKENS, lora_name="lora-a")[0].worker == "adapter-b"  # hashes ignore adapters


def test_lora_strict_with_real_sim_workers():
    """Two workers cache the same tokens under different adapters: only the right one is credited."""
    toks = list(range(5000, 5000 + 20 * PAGE))
    wa, wb = SimWorker("wa", page_size=PAGE), SimWorker("wb", page_size=PAGE)
    wa.serve(Request(toks, Namespace("lora-a"), "lora-a"))
    wb.serve(Request(toks[: 15 * PAGE], Namespace("lora-b"), "lora-b"))
    idx = BlockIndex()
    for w in (wa, wb):
        idx.apply(w.name, KVEventBatch(0.0, w.take_events()))
    r = PrefixRouter(idx, PAGE)
    assert [(s.worker, s.matched_pages) for s in r.score(toks, lora_name="lora-b")] == [("wb", 15), ("wa", 0)]
    assert r.score(toks, lora_name="lora-a")[0].worker == "wa"


def test_sources_that_never_publish_lora_names_are_credited_to_everyone():
    idx = BlockIndex()
    store(idx, "old-engine", TOKENS, n_pages=8)  # no lora_name, ever
    r = PrefixRouter(idx, PAGE)
    assert r.score(TOKENS, lora_name="lora-a")[0].matched_pages == 8
    store(idx, "old-engine", [1] * PAGE, lora="lora-x")  # now it does: its lora-less copies are base
    assert r.score(TOKENS, lora_name="lora-a")[0].matched_pages == 0


def test_ties_by_load_hint_then_seeded_random():
    idx = BlockIndex()
    for name in ("a", "b", "c", "d"):
        store(idx, name, TOKENS, n_pages=5)
    r = PrefixRouter(idx, PAGE, seed=3)
    r.set_load("a", 5)
    r.set_load("b", 1)
    first = r.score(TOKENS, loads={"c": 0.5, "d": 0.5})
    assert [s.worker for s in first[:1]] == ["c"] or [s.worker for s in first[:1]] == ["d"]
    assert [s.worker for s in first[2:]] == ["b", "a"]
    picks = {r.score(TOKENS, loads={"a": 0, "b": 0})[0].worker for _ in range(60)}
    assert picks == {"a", "b", "c", "d"}  # random among equals
    seq1 = [PrefixRouter(idx, PAGE, seed=9).score(TOKENS)[0].worker for _ in range(5)]
    r9 = PrefixRouter(idx, PAGE, seed=9)
    r9b = PrefixRouter(idx, PAGE, seed=9)
    assert [r9.score(TOKENS)[0].worker for _ in range(5)] == [r9b.score(TOKENS)[0].worker for _ in range(5)]
    assert len(seq1) == 5


def test_removal_shortens_the_prefix_and_bad_input_raises_valueerror():
    idx = BlockIndex()
    hs = store(idx, "w", TOKENS, n_pages=10)
    idx.apply("w", KVEventBatch(0.0, [BlockRemoved(hs[4:5], "GPU")]))
    r = PrefixRouter(idx, PAGE)
    assert r.score(TOKENS)[0].matched_pages == 4
    with pytest.raises(ValueError):
        r.score([1, 2, -1, 4])
    with pytest.raises(ValueError):
        r.score([2**32] * PAGE)
    with pytest.raises(ValueError):
        PrefixRouter(idx, 0)
    assert PrefixRouter(BlockIndex(), PAGE).score(TOKENS) == []


def test_random_workload_agrees_with_a_brute_force_scorer():
    rnd = random.Random(5)
    idx = BlockIndex()
    docs = [[rnd.randrange(1000) for _ in range(24 * PAGE)] for _ in range(5)]
    truth = {}
    for i in range(12):
        doc = rnd.randrange(5)
        n = rnd.randint(1, 24)
        store(idx, f"w{i}", docs[doc], n_pages=n)
        truth[f"w{i}"] = (doc, n)
    r = PrefixRouter(idx, PAGE, seed=0)
    for d, doc in enumerate(docs):
        got = {s.worker: s.matched_pages for s in r.score(doc)}
        assert got == {w: (n if dd == d else 0) for w, (dd, n) in truth.items()}


def test_many_workers_past_the_mask_stride_and_mixed_media():
    idx = BlockIndex()
    for i in range(100):  # 100 workers: masks are re-packed past the first 64-bit stride
        store(idx, f"w{i:03d}", TOKENS, n_pages=1 + i % 37, medium="GPU" if i % 3 else "CPU_PINNED")
    ranked = PrefixRouter(idx, PAGE, seed=0).score(TOKENS)
    assert len(ranked) == 100
    got = {s.worker: s.matched_pages for s in ranked}
    assert got == {f"w{i:03d}": 1 + i % 37 for i in range(100)}
    assert ranked[0].worker == "w073" and ranked[0].score == pytest.approx(37)  # 37 pages on GPU
    by = {s.worker: s.score for s in ranked}
    assert by["w035"] == pytest.approx(36) and by["w036"] == pytest.approx(37 * 0.8)  # w036: on CPU
    assert [s.score for s in ranked] == sorted((s.score for s in ranked), reverse=True)
    store(idx, "late", TOKENS, n_pages=40, medium="NVME")  # an unknown medium: default weight 0.5
    lora_idx_plan = PrefixRouter(idx, PAGE).score(TOKENS, lora_name="x")  # every worker is lora-blind
    assert {s.worker: s.matched_pages for s in lora_idx_plan}["late"] == 40


def test_single_offloaded_medium_and_lora_filters_use_the_same_prefix_semantics():
    """One medium that is not GPU (its bit group is shifted), with a lora plan that ORs two views."""
    for medium, weight in (("CPU_PINNED", 0.8), (None, 1.0), ("NVME", 0.5)):
        idx = BlockIndex()
        store(idx, "a", TOKENS, n_pages=7, medium=medium)
        store(idx, "b", TOKENS, n_pages=3, medium=medium, lora="lora-a")
        store(idx, "c", TOKENS, n_pages=9, medium=medium, lora="lora-b")
        r = PrefixRouter(idx, PAGE, seed=0)
        got = {s.worker: (s.matched_pages, s.score) for s in r.score(TOKENS, lora_name="lora-a")}
        assert got == {"a": (7, pytest.approx(7 * weight)), "b": (3, pytest.approx(3 * weight)), "c": (0, 0.0)}
        assert {s.worker: s.matched_pages for s in r.score(TOKENS)} == {"a": 7, "b": 0, "c": 0}
        ex = {w["worker"]: w["pages_by_medium"] for w in r.explain(TOKENS, lora_name="lora-b")["workers"]}
        assert ex == {"a": {str(medium): 7}, "b": {}, "c": {str(medium): 9}}


MEDIA = ["GPU", "CPU_PINNED", "STORAGE", None, "NVME"]


def reference_scores(model, lora_pub, workers, hs, lora, strict, weights):
    """Brute force: per worker, consecutive pages credited on any medium, each at its best weight."""

    def weight(m):
        return weights.get("GPU", 1.0) if m is None else weights.get(m, 0.5)

    out = {}
    for w in workers:
        pages, score, by_weight = 0, 0.0, {}
        for h in hs:
            media = {
                m
                for (ww, m, lo, hh), n in model.items()
                if n > 0
                and ww == w
                and hh == h
                and (not strict or lo == lora or (lora is not None and lo is None and w not in lora_pub))
            }
            if not media:
                break
            best = max(weight(m) for m in media)
            pages, score = pages + 1, score + best
            by_weight[best] = by_weight.get(best, 0) + 1
        out[w] = (pages, score, by_weight)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_random_media_and_adapters_agree_with_a_brute_force_scorer(seed):
    rnd = random.Random(seed)
    idx = BlockIndex()
    model: dict = {}
    lora_pub: set = set()
    docs = [[rnd.randrange(3) for _ in range(12 * PAGE)] for _ in range(2)]
    media = rnd.sample(MEDIA, rnd.randint(1, 3))
    workers = [f"w{i}" for i in range(rnd.choice([3, 6]))]
    for w in workers:
        idx.apply(w, KVEventBatch(0.0, [AllBlocksCleared()]))
    for _ in range(40):
        w, medium, lora = rnd.choice(workers), rnd.choice(media), rnd.choice([None, None, "a", "b"])
        hs = hashes(docs[rnd.randrange(2)])
        lo = rnd.randrange(12)
        part = hs[lo : rnd.randint(lo, 12)]
        if rnd.random() < 0.75:
            idx.apply(w, KVEventBatch(0.0, [BlockStored(part, None, [], PAGE, None, medium, lora)]))
            lora_pub |= {w} if lora is not None else set()
            for h in part:
                model[(w, medium, lora, h)] = model.get((w, medium, lora, h), 0) + 1
        else:  # a remove names no adapter: the index drops one holding view's copy (lowest view id)
            idx.apply(w, KVEventBatch(0.0, [BlockRemoved(part, medium)]))
            for h in part:
                held = [k for k, n in model.items() if n > 0 and k[0] == w and k[1] == medium and k[3] == h]
                if held:
                    order = {lo_: i for i, lo_ in enumerate(idx._loras)}
                    k = min(held, key=lambda k: order[k[2]])
                    model[k] -= 1
    weights = rnd.choice([None, {"GPU": 1.0, "CPU_PINNED": 1.0, "STORAGE": 0.25}])
    for strict in (True, False):
        r = PrefixRouter(idx, PAGE, lora_strict=strict, medium_weights=weights, seed=seed)
        w_map = weights or {"GPU": 1.0, "CPU_PINNED": 0.8, "STORAGE": 0.5}
        for doc in docs:
            for lora in (None, "a", "zz"):
                want = reference_scores(model, lora_pub, workers, hashes(doc), lora, strict, w_map)
                ranked = r.score(doc, lora_name=lora)
                assert [s.score for s in ranked] == sorted((s.score for s in ranked), reverse=True)
                assert {s.worker: s.matched_pages for s in ranked} == {w: v[0] for w, v in want.items()}
                assert {s.worker: s.score for s in ranked} == {w: pytest.approx(v[1]) for w, v in want.items()}
                for ex in r.explain(doc, lora_name=lora)["workers"]:
                    by_weight: dict = {}
                    for m, n in ex["pages_by_medium"].items():
                        wt = w_map.get("GPU", 1.0) if m == "None" else w_map.get(m, 0.5)
                        by_weight[wt] = by_weight.get(wt, 0) + n
                    assert by_weight == want[ex["worker"]][2]


@pytest.mark.parametrize("medium", ["GPU", "STORAGE"])
def test_masks_that_keep_changing_switch_to_the_running_intersection(medium):
    """Holdings that are not prefixes make a new mask run per page; lengths stay exact."""
    rnd = random.Random(11)
    toks = [rnd.randrange(50_000) for _ in range(120 * PAGE)]
    hs = hashes(toks)
    idx = BlockIndex()
    holdings = {"all": hs, "even": hs[::2], "odd": hs[1::2]}
    for i in range(20):
        holdings[f"pre{i}"] = hs[: rnd.randrange(121)]
        holdings[f"sparse{i}"] = hs[: rnd.randrange(121)] + rnd.sample(hs, 60)
    for name, held in holdings.items():
        idx.apply(name, KVEventBatch(0.0, [BlockStored(held, None, [], PAGE, None, medium, None)]))
    want = {}
    for name, held in holdings.items():
        n, have = 0, set(held)
        while n < len(hs) and hs[n] in have:
            n += 1
        want[name] = n
    r = PrefixRouter(idx, PAGE, seed=0)
    assert {s.worker: s.matched_pages for s in r.score(toks)} == want
    assert {s.worker: s.matched_pages for s in r.score(toks[: 50 * PAGE])} == {k: min(v, 50) for k, v in want.items()}


def test_prefixes_ending_at_every_chunk_boundary_of_the_lazy_hashing():
    """score() hashes in chunks (32 pages, then doubling) and stops after a chunk whose last page
    nobody holds: prefixes ending just before, at or just after a boundary keep their exact
    length, with or without a worker holding everything, and under a lora filter."""
    from kvevents.consumers.router import _chunk_bounds

    n_pages = 600
    bounds = [stop for _, stop in _chunk_bounds(n_pages)]
    assert bounds == [32, 64, 128, 256, 512, 600]
    toks = list(range(7, 7 + n_pages * PAGE))
    hs = hashes(toks)
    idx = BlockIndex()
    want = {}
    for b in bounds[:-1]:
        for n in (b - 1, b, b + 1):
            idx.apply(f"p{n}", KVEventBatch(0.0, [BlockStored(hs[:n], None, [], PAGE, None, "GPU", None)]))
            want[f"p{n}"] = n
    # holds every page but the first chunk's last one: its prefix is 31 pages, and no one's runs on
    idx.apply("gap", KVEventBatch(0.0, [BlockStored(hs[:31] + hs[32:], None, [], PAGE, None, "GPU", None)]))
    want["gap"] = 31
    r = PrefixRouter(idx, PAGE, seed=0)
    full = {s.worker: s.matched_pages for s in r.score_hashes(hs)}
    assert full == want
    assert {s.worker: s.matched_pages for s in r.score(toks)} == want
    idx.apply("all", KVEventBatch(0.0, [BlockStored(hs, None, [], PAGE, None, "GPU", None)]))
    assert {s.worker: s.matched_pages for s in r.score(toks)} == {**want, "all": n_pages}
    assert len(r.prefix_hashes(toks)) == n_pages
    idx.drop_source("all")
    want["all"] = 0  # known, holding nothing
    for n in sorted({*bounds, 31, 33}):  # the hashing stops at the first chunk end nobody holds
        idx.apply("gap", KVEventBatch(0.0, [AllBlocksCleared()]))
        idx.apply("gap", KVEventBatch(0.0, [BlockStored(hs[:n], None, [], PAGE, None, "GPU", None)]))
        got = {s.worker: s.matched_pages for s in r.score(toks)}
        assert got == {**want, "gap": n}
    # an adapter's copy at a chunk end does not make a strict request for another adapter go on
    idx.apply("lora", KVEventBatch(0.0, [BlockStored(hs, None, [], PAGE, None, "GPU", "a")]))
    assert {s.worker: s.matched_pages for s in r.score(toks, lora_name="a")}["lora"] == n_pages
    assert {s.worker: s.matched_pages for s in r.score(toks, lora_name="b")}["lora"] == 0


@pytest.mark.parametrize("seed", range(6))
def test_lazy_hashing_scores_like_the_full_hash_list(seed):
    """score() (hashing stopped early) ranks exactly like score_hashes() of every page, for random
    holdings with gaps, several media and adapters, strict or not."""
    rnd = random.Random(seed)
    toks = [rnd.randrange(50_000) for _ in range(300 * PAGE)]
    hs = hashes(toks)
    idx = BlockIndex()
    for i in range(rnd.randint(1, 8)):
        lo = rnd.choice([0, 0, 0, rnd.randrange(300)])
        hi = rnd.choice([31, 32, 63, 64, 65, 127, 128, 255, 256, 300, rnd.randrange(lo, 301)])
        held = hs[lo:hi]
        if held and rnd.random() < 0.4:  # punch a hole
            held = held[: rnd.randrange(len(held))] + held[rnd.randrange(len(held)) :]
        medium, lora = rnd.choice(["GPU", "CPU_PINNED", None]), rnd.choice([None, "a", "b"])
        idx.apply(f"w{i % 5}", KVEventBatch(0.0, [BlockStored(held, None, [], PAGE, None, medium, lora)]))
    for strict in (True, False):
        r = PrefixRouter(idx, PAGE, lora_strict=strict, seed=1)
        for lora in (None, "a", "zz"):
            lazy = {s.worker: (s.matched_pages, s.score) for s in r.score(toks, lora_name=lora)}
            full = {s.worker: (s.matched_pages, s.score) for s in r.score_hashes(hs, lora_name=lora)}
            assert lazy == full
            assert len(r.prefix_hashes(toks, lora_name=lora)) >= max((m for m, _ in lazy.values()), default=0)


CROWD = np.arange(1, 200_000, dtype=np.int64) * 1_000_003  # candidates for keys sharing a home bucket


def test_prefixes_through_keys_off_their_home_bucket():
    """Pages whose keys spilled past a full home bucket are found like any other."""
    idx = BlockIndex()
    t = idx._views[0]
    t.reserve(64)  # sized now, so storing the chain below does not rebuild (homes stay put)
    chain = CROWD[t._home(CROWD) == t._home(CROWD[:1])[0]][:24].tolist()  # 24 keys for one 8-slot bucket
    assert len(chain) == 24
    idx.apply("w0", KVEventBatch(0.0, [BlockStored(chain, None, [1] * 24 * PAGE, PAGE, None, "GPU", None)]))
    idx.apply("w1", KVEventBatch(0.0, [BlockStored(chain[:12], None, [1] * 12 * PAGE, PAGE, None, "GPU", None)]))
    idx.apply("w2", KVEventBatch(0.0, [BlockStored(chain[:20], None, [1] * 20 * PAGE, PAGE, None, "CPU_PINNED", None)]))
    spilled = [i for i, k in enumerate(chain) if k in t.spill]
    assert len(spilled) == 16 and t.capacity == 256  # the premise: 16 of the 24 pages spilled
    q = np.array(chain, np.int64)
    r = PrefixRouter(idx, PAGE, seed=0)
    labels = idx.labels()
    for start in (0, 8, 10):
        got = {s.worker: s.matched_pages for s in r.score_hashes(chain[start:])}
        assert got == {"w0": 24 - start, "w1": 12 - start, "w2": 20 - start}
        found = idx.prefix_match(q[start:])
        by_label = {labels[wi]: (m.pages, m.pages_by_medium) for wi, m in found.workers.items()}
        assert by_label == {
            "w0": (24 - start, {"GPU": 24 - start}),
            "w1": (12 - start, {"GPU": 12 - start}),
            "w2": (20 - start, {"CPU_PINNED": 20 - start}),
        }


def test_spilled_keys_in_an_adapter_view_beside_lora_blind_workers():
    """Two views OR'd (the adapter's, and lora-less copies of workers that never name one), with
    spilled keys in the adapter's view."""
    idx = BlockIndex()
    idx.apply("la", KVEventBatch(0.0, [BlockStored([7], None, [1] * PAGE, PAGE, None, "GPU", "a")]))
    t = idx._views[idx._lora_ix["a"]]
    t.reserve(64)
    idx._views[0].reserve(20_000)  # so large that the keys crowding t's bucket spread out there
    chain = CROWD[t._home(CROWD) == t._home(CROWD[:1])[0]][:24].tolist()
    for src, n, lora in (("la", 24, "a"), ("lb", 12, "a"), ("blind", 24, None)):
        idx.apply(src, KVEventBatch(0.0, [BlockStored(chain[:n], None, [1] * n * PAGE, PAGE, None, "GPU", lora)]))
    assert sum(k in t.spill for k in chain) == 16 and chain[0] not in t.spill and not idx._views[0].spill
    r = PrefixRouter(idx, PAGE, seed=0)
    got = {s.worker: s.matched_pages for s in r.score_hashes(chain, lora_name="a")}
    assert got == {"la": 24, "lb": 12, "blind": 24}


def _model_prefixes(holdings, chain, lora, strict):
    """Longest held prefix per source, from the raw holdings (source, hashes, medium, lora)."""
    named = {src for src, _, _, lo in holdings if lo is not None}
    held: dict = {}
    for src, hs, _medium, lo in holdings:
        if not strict or lo == lora or (lo is None and lora is not None and src not in named):
            held.setdefault(src, set()).update(hs)
    out = {}
    for src in {h[0] for h in holdings}:
        n = 0
        while n < len(chain) and chain[n] in held.get(src, ()):
            n += 1
        out[src] = n
    return out


@pytest.mark.slow
@given(st.data())
def test_lookup_over_crowded_tables_equals_a_model(data):
    """Random holdings of keys crowding a few home buckets (a third or more spill), several
    workers, media, adapters and lora-blind sources: prefixes equal a plain-set model."""
    idx = BlockIndex()
    holdings = [("seed", [11], "GPU", "a")]
    idx.apply("seed", KVEventBatch(0.0, [BlockStored([11], None, [], PAGE, None, "GPU", "a")]))
    for t in idx._views:
        t.reserve(64)
    homes = idx._views[0]._home(CROWD)
    pool = [k for h in np.unique(homes)[:3].tolist() for k in CROWD[homes == h][:16].tolist()]
    idx.apply("fill", KVEventBatch(0.0, [BlockStored(pool, None, [], PAGE, None, "GPU", None)]))  # 8 spill a bucket
    holdings.append(("fill", pool, "GPU", None))
    chain = data.draw(st.permutations(pool))[: data.draw(st.integers(8, 48))]
    for i in range(data.draw(st.integers(1, 6))):
        lo = data.draw(st.sampled_from([0, 0, data.draw(st.integers(0, len(chain)))]))
        held = chain[lo : data.draw(st.integers(lo, len(chain)))]
        medium, lora = data.draw(st.sampled_from(["GPU", "CPU_PINNED"])), data.draw(st.sampled_from([None, "a"]))
        idx.apply(f"w{i % 4}", KVEventBatch(0.0, [BlockStored(held, None, [], PAGE, None, medium, lora)]))
        holdings.append((f"w{i % 4}", held, medium, lora))
    assert len(idx._views[0].spill) >= 24  # a third or more (page by page: 40)
    for strict in (True, False):
        r = PrefixRouter(idx, PAGE, lora_strict=strict, seed=1)
        for lora in (None, "a"):
            got = {s.worker: s.matched_pages for s in r.score_hashes(chain, lora_name=lora)}
            want = _model_prefixes(holdings, chain, lora, strict)
            assert got == {w: want.get(w, 0) for w in got}
