"""The compiled index walk and apply loops against the pure-Python ones (kvevents.native).

Random indexes (stores and removes of chains on several workers, media and lora names, repeated
and crowded hashes that spill past their home bucket, the vacant key, entries held by hundreds of
workers whose holder records grow, shrink and move) are applied twice, once per path; the tables
(slot arrays and holder pools), refcounts, counters and every lookup must come out identical.
Malformed views and records raise ValueError. Skipped where the extension is not built.
"""

from __future__ import annotations

from collections import Counter
from contextlib import nullcontext

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvevents import native
from kvevents.consumers.copies import clear_worker, remove_each, store_each
from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.lookup import MatchColumns, PrefixMatch, WorkerMatch
from kvevents.consumers.table import VACANT, HashTable
from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from kvevents.native.layout import CVIEW

pytestmark = pytest.mark.skipif(
    not native.active(), reason="kvevents.native._speedups not built, or KVEVENTS_PURE_PYTHON set"
)

_MIX_INV = pow(0x9E3779B97F4A7C15, -1, 2**64)


def crowded(i: int) -> int:
    """A key whose home bucket is 0 in any table (its mixed value's top bits are zero)."""
    u = (i * _MIX_INV) % 2**64
    return u - 2**64 if u >= 2**63 else u


KEYS = st.one_of(
    st.integers(0, 40),  # a small pool: repeats, shared prefixes
    st.integers(0, 30).map(crowded),  # spills past a full home bucket
    st.integers(-(2**63), 2**63 - 1),
    st.just(VACANT),
)
MEDIA = st.sampled_from(["GPU", "CPU_PINNED", "STORAGE", None, "DISK"])
LORAS = st.sampled_from([None, None, "a", "b"])
SOURCES = st.sampled_from(["w0", "w1", "w2", "w3"])
STORE = st.tuples(
    st.just("store"), SOURCES, st.lists(KEYS, min_size=1, max_size=30), st.one_of(st.none(), KEYS), MEDIA, LORAS
)
REMOVE = st.tuples(st.just("remove"), SOURCES, st.lists(KEYS, min_size=1, max_size=30), MEDIA, LORAS)
CLEAR = st.tuples(st.just("clear"), SOURCES)
OPS = st.lists(st.one_of(STORE, STORE, REMOVE, CLEAR), max_size=40)


def _event(op):
    if op[0] == "store":
        _, _, hs, parent, medium, lora = op
        return BlockStored(list(hs), parent, [], 16, None, medium, lora)
    if op[0] == "remove":
        _, _, hs, medium, lora = op
        return BlockRemoved(list(hs), medium, lora)
    return AllBlocksCleared()


def _build(ops, many_workers: bool) -> BlockIndex:
    idx = BlockIndex()
    if many_workers:  # a second word of 64 workers, so layouts have several words
        for i in range(70):
            idx.apply(f"pad{i}", KVEventBatch(0.0, [], 0))
    for op in ops:
        idx.apply(op[1], KVEventBatch(0.0, [_event(op)], 0))
    return idx


def _state(idx: BlockIndex):
    return (
        dict(idx.counters),
        {src: idx.copies(src) for src in idx.source_counts()},
        idx.block_counts(),
        idx.medium_counts(),
        idx.stats(),
    )


WEIGHTS = {"GPU": 1.0, "CPU_PINNED": 0.5, "STORAGE": 0.25, None: 1.0, "DISK": 0.125}


@settings(max_examples=60, derandomize=True, deadline=None)
@given(OPS, st.booleans(), st.lists(st.lists(KEYS, max_size=40), min_size=1, max_size=4))
def test_apply_and_walk_equal_the_python_paths(ops, many, requests):
    fast = _build(ops, many)
    with native.python_only():
        slow = _build(ops, many)
    assert _state(fast) == _state(slow)
    stored = [list(op[2]) for op in ops if op[0] == "store"]
    for req in requests + stored[:4]:
        q = np.array(req, np.int64)
        for lora in (None, "a", "zzz"):
            for strict in (True, False):
                for weight in (lambda m: 1.0, lambda m: WEIGHTS.get(m, 0.3), lambda m: 2):  # ints: the Python twin runs
                    got = fast.prefix_match(q, lora, strict=strict, medium_weight=weight)
                    with native.python_only():
                        want = slow.prefix_match(q, lora, strict=strict, medium_weight=weight)
                    assert got == want
                    assert list(got.workers) == list(want.workers)  # the same order too
                    _columns_equal(fast.prefix_columns(q, lora, strict=strict, medium_weight=weight), want)
        for h in req[:5]:
            assert fast.holds(h) == slow.holds(h)
            assert fast.workers_for(h) == slow.workers_for(h)
            assert fast.parent_of(h) == slow.parent_of(h)


def _tables_equal(a: HashTable, b: HashTable) -> None:
    for name in ("keys", "state", "parent", "rows"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert np.array_equal(a.pool.words, b.pool.words) and np.array_equal(a.pool.meta, b.pool.meta)
    assert a.spill == b.spill and a.live == b.live and a.used == b.used and a.vacant == b.vacant


CHAINS = st.lists(
    st.tuples(
        st.lists(KEYS, min_size=1, max_size=40), st.integers(0, 255), st.sampled_from(["store", "remove", "clear"])
    ),
    max_size=25,
)


@settings(max_examples=60, derandomize=True, deadline=None)
@given(CHAINS)
def test_table_store_and_remove_loops_equal_the_python_ones(chains):
    """Raw tables (two views, eight columns): the same arrays, holder pools, spill dict, counts, extras."""

    def run():
        tables, extra = [HashTable(), HashTable()], {}
        views = list(enumerate(tables))
        results = []
        for i, (hs, wi, op) in enumerate(chains):
            col = (wi // 32) % 8
            if op == "remove":
                results.append(
                    remove_each(views, extra, 0, col, wi, list(hs), i % 3 - 1 if i % 3 else None, i % 2 == 0)
                )
            elif op == "clear":
                results.append(clear_worker(tables[i % 2], [col, (col + 1) % 8], 1 << (wi % 32)))
            else:
                t = tables[i % 2]
                t.reserve(len(hs))
                results.append(store_each(t, extra, i % 2, 0, col, wi, list(hs), hs[0] if i % 4 == 0 else None))
        return tables, extra, results

    fv, fe, fr = run()
    with native.python_only():
        sv, se, sr = run()
    assert fr == sr and fe == se
    for a, b in zip(fv, sv):
        _tables_equal(a, b)


def test_fast_walk_stops_at_the_first_page_nobody_holds():
    idx = BlockIndex()
    idx.apply("a", KVEventBatch(0.0, [BlockStored([1, 2, 3], None, [], 16, None, "GPU", None)], 0))
    idx.apply("b", KVEventBatch(0.0, [BlockStored([1, 2], None, [], 16, None, "CPU_PINNED", None)], 0))
    got = idx.prefix_match(np.array([1, 2, 3, 99, 4], np.int64), medium_weight=lambda m: 2.0 if m == "GPU" else 0.5)
    assert got == PrefixMatch(5, {0: WorkerMatch(3, 6.0, {"GPU": 3}), 1: WorkerMatch(2, 1.0, {"CPU_PINNED": 2})})


# ---------------------------------------------------------------- malformed input: ValueError, never a crash


def _view(**change):
    t = HashTable()
    t.reserve(5)
    t.set_bits_each([1, 2, 3], 0, 1, None)
    t.set_bits_each([1, 2], 1, 1, None)  # two columns: 1 and 2 have records in the pool
    v = list(t.cview())
    for k, val in change.items():
        v[CVIEW.index(k)] = val
    return tuple(v)


BAD_VIEWS = [
    {"keys": np.zeros(64, np.float64)},
    {"keys": np.zeros(64, np.int32)},
    {"keys": np.zeros(63, np.int64)},
    {"keys": np.zeros(24, np.int64)},
    {"keys": np.zeros(8, np.int64)},
    {"state": np.zeros(3, np.uint8)},
    {"parent": np.zeros(3, np.int64)},
    {"rows": np.zeros(64, np.uint64)},
    {"rows": np.zeros(200, np.float64)},
    {"overflow": np.zeros(1, np.uint8)},
    {"nshift": 0},
    {"nshift": 200},
    {"nshift": 2**70},
    {"nshift": "61"},
    {"spill": []},
    {"pool": np.zeros(0, np.uint64)},
    {"pool": np.zeros(64, np.int32)},
    {"pmeta": np.zeros(5, np.int64)},
    {"pmeta": np.zeros(28, np.int64)},  # a bump pointer of 0: word 0 is never a record
    {"pmeta": np.array([10**6] + [0] * 27, np.int64)},  # past the pool's end
    {"keys": "not an array"},
    {"keys": np.zeros(128, np.int64)[::2]},
]


@pytest.mark.parametrize("change", BAD_VIEWS, ids=lambda c: f"{next(iter(c))}")
def test_malformed_views_raise_value_error(change):
    v = _view(**change)
    layout_cls = __import__("kvevents.consumers.lookup", fromlist=["WordLayout"]).WordLayout
    layout = [layout_cls(0, [(0, 0)], 1)]
    with pytest.raises(ValueError):
        native.walk(np.array([1, 2], np.int64), [(v, None)], layout, ["GPU"], [1.0], PrefixMatch, WorkerMatch)
    with pytest.raises(ValueError):
        native.set_bits_each(v, [1, 2], 0, 1, None)
    with pytest.raises(ValueError):
        native.remove_each([v], [0], {}, 0, 0, 0, [1], None, False)
    with pytest.raises(ValueError):
        native.holds_bit([v], 1, [0], 1)
    with pytest.raises(ValueError):
        native.clear_worker(v, [0], 1)


def test_malformed_arguments_raise_value_error():
    from kvevents.consumers.lookup import WordLayout

    v = _view()
    ok_layout = [WordLayout(0, [(0, 0)], 1)]
    q = np.array([1, 2], np.int64)
    bad_calls = [
        lambda: native.walk(np.array([1.0]), [(v, None)], ok_layout, ["GPU"], [1.0], PrefixMatch, WorkerMatch),
        lambda: native.walk(np.array([1], np.int32), [(v, None)], ok_layout, ["GPU"], [1.0], PrefixMatch, WorkerMatch),
        lambda: native.walk(
            q, [(v, np.zeros(1, np.uint64))], [WordLayout(0, [(1, 0)], 1)], ["GPU"], [1.0], PrefixMatch, WorkerMatch
        ),
        lambda: native.walk(
            q,
            [(v, np.zeros(1, np.uint64)), (v, np.zeros(2, np.uint64))],
            ok_layout,
            ["GPU"],
            [1.0],
            PrefixMatch,
            WorkerMatch,
        ),
        lambda: native.walk(
            q,
            [(v, None)],
            [WordLayout(0, [(0, 0)], 1), WordLayout(1, [(0, 0)], 1)],
            ["GPU"],
            [1.0],
            PrefixMatch,
            WorkerMatch,
        ),
        lambda: native.walk(q, [(v, None)], [WordLayout(0, [(2**40, 0)], 1)], ["GPU"], [1.0], PrefixMatch, WorkerMatch),
        lambda: native.walk(q, [(v, np.zeros(2, np.int8))], ok_layout, ["GPU"], [1.0], PrefixMatch, WorkerMatch),
        lambda: native.walk(q, [(v,)], ok_layout, ["GPU"], [1.0], PrefixMatch, WorkerMatch),
        lambda: native.walk(q, [(v, None)], [WordLayout(0, [(-1, 0)], 1)], ["GPU"], [1.0], PrefixMatch, WorkerMatch),
        lambda: native.walk(q, [(v, None)], [WordLayout(0, [(0, 3)], 1)], ["GPU"], [1.0], PrefixMatch, WorkerMatch),
        lambda: native.walk(q, [(v, None)], [WordLayout(0, [], 1)], ["GPU"], [1.0], PrefixMatch, WorkerMatch),
        lambda: native.walk(q, [(v, None)], [WordLayout(0, [(0, 0)], -1)], ["GPU"], [1.0], PrefixMatch, WorkerMatch),
        lambda: native.walk(q, [(v, None)], ok_layout, ["GPU"], [1.0, 2.0], PrefixMatch, WorkerMatch),
        lambda: native.walk(q, [(v, None)] * 4097, ok_layout, ["GPU"], [1.0], PrefixMatch, WorkerMatch),
        lambda: native.set_bits_each(v, [1, 2**64], 0, 1, None),
        lambda: native.set_bits_each(v, [1, 1.5], 0, 1, None),
        lambda: native.set_bits_each(v, (i for i in range(3)), 0, 1, None),
        lambda: native.set_bits_each(v, [1], -1, 1, None),
        lambda: native.set_bits_each(v, [1], 2**31, 1, None),
        lambda: native.set_bits_each(v, [1], 0, 0, None),
        lambda: native.set_bits_each(v, [1], 0, 2**32, None),
        lambda: native.set_bits_each(v, [1], 0, 2**64, None),
        lambda: native.set_bits_each(v, [1], 0, 1, 2**63),
        lambda: native.remove_each([v], [0], {}, 0, -5, 0, [1], None, False),
        lambda: native.remove_each([v], [0], {}, 0, 0, -1, [1], None, False),
        lambda: native.remove_each([], [], {}, 0, 0, 0, [1], None, False),
        lambda: native.remove_each([v], [], {}, 0, 0, 0, [1], None, False),
        lambda: native.remove_each([v], ["0"], {}, 0, 0, 0, [1], None, False),
        lambda: native.remove_each([v], [0], {}, 0, 0, 0, [2**63], None, False),
        lambda: native.holds_bit([v], 2**64, [0], 1),
        lambda: native.holds_bit([v], 1, [-1], 1),
        lambda: native.holds_bit([v], 1, list(range(300)), 1),
        lambda: native.clear_worker(v, [0], 0),
        lambda: native.clear_worker(v, [2**31], 1),
        lambda: native.bind_walk([(v, None)], ok_layout, ["GPU"], [1.0], PrefixMatch, WorkerMatch)(np.array([1.0])),
        lambda: native.bind_walk([(v,)], ok_layout, ["GPU"], [1.0], PrefixMatch, WorkerMatch)(q),
        lambda: native.bind_walk([(v, None)], ok_layout, ["GPU"], [1.0, 2.0], PrefixMatch, WorkerMatch)(q),
    ]
    bound = native.bind_walk([(v, None)], ok_layout, ["GPU"], [1.0], PrefixMatch, WorkerMatch)
    assert bound(q) == native.walk(q, [(v, None)], ok_layout, ["GPU"], [1.0], PrefixMatch, WorkerMatch)
    bound_walk = type(bound)  # the prepared walk's type itself, given what a binding is not
    bad_calls += [
        lambda: bound(),
        lambda: bound(q, q),
        lambda: bound_walk(()),
        lambda: bound_walk(bound.args[:8]),
        lambda: bound_walk(bound.args, bound.args),
    ]
    for i, call in enumerate(bad_calls):
        with pytest.raises(ValueError):
            call()
            pytest.fail(f"call {i} did not raise")


def test_a_full_table_raises_instead_of_looping():
    t = HashTable()
    view = t.cview()
    with pytest.raises(ValueError, match="reserve"):
        native.set_bits_each(view, list(range(1, 200)), 0, 1, None)


def test_huge_and_read_only_inputs():
    v = _view()
    ro = tuple(memoryview(bytes(a)).cast(a.format) if isinstance(a, memoryview) else a for a in v)
    with pytest.raises(ValueError):
        native.set_bits_each(ro, [1], 0, 1, None)
    huge = np.zeros(1_000_000, np.int64)
    got = native.walk(
        huge,
        [(v, None)],
        [__import__("kvevents.consumers.lookup", fromlist=["x"]).WordLayout(0, [(0, 0)], 1)],
        ["GPU"],
        [1.0],
        PrefixMatch,
        WorkerMatch,
    )
    assert got == PrefixMatch(1_000_000)
    assert Counter() == Counter()


def test_results_of_a_class_with_its_own_init_are_built_by_calling_it():
    """The C walk fills a plain slotted WorkerMatch directly; any other class is called."""
    from dataclasses import dataclass, field

    from kvevents.consumers.lookup import WordLayout

    @dataclass(slots=True)
    class Checked:
        pages: int
        score: float
        pages_by_medium: dict = field(default_factory=dict)

        def __post_init__(self) -> None:
            self.score = -self.score

    assert native._slots_of(Checked) is None and native._slots_of(WorkerMatch) is not None
    t = HashTable()
    t.reserve(3)
    t.set_bits_each([5, 6], 0, 0b11, None)
    got = native.walk(
        np.array([5, 6], np.int64),
        [(t.cview(), None)],
        [WordLayout(0, [(0, 0)], 0b11)],
        ["GPU"],
        [2.0],
        PrefixMatch,
        Checked,
    )
    assert got.workers == {0: Checked(2, 4.0, {"GPU": 2}), 1: Checked(2, 4.0, {"GPU": 2})}
    assert got.workers[0].score == -4.0


def test_int64_check_matches_the_python_one():
    from kvevents.consumers import indexer

    cases = [
        ([1, 2], None),
        ([1, 2**63], None),
        ([True], None),
        ([np.int64(3)], None),
        ([1.0], None),
        ([-(2**63)], 2**63 - 1),
        ([1], 2**63),
        ([1], True),
        ([], None),
        ([], 5),
    ]
    for hashes, prev in cases:
        fast = indexer._all_int64(hashes, prev)
        with native.python_only():
            assert fast == indexer._all_int64(hashes, prev), (hashes, prev)


def test_walk_results_add_few_objects_to_the_cyclic_gc():
    """WorkerMatch results hold only an int, a float and a str -> int dict: untracked (lookup p99)."""
    import gc

    idx = BlockIndex()
    idx.apply("a", KVEventBatch(0.0, [BlockStored([1, 2], None, [], 16, None, "GPU", None)], 0))
    got = idx.prefix_match(np.array([1, 2], np.int64))
    assert got == PrefixMatch(2, {0: WorkerMatch(2, 2.0, {"GPU": 2})})
    assert not gc.is_tracked(got.workers[0]) and not gc.is_tracked(got.workers[0].pages_by_medium)


@settings(max_examples=15, derandomize=True, deadline=None)
@given(st.integers(6, 130), st.randoms(use_true_random=False))
def test_many_workers_on_one_chain_equal_the_python_walk(workers, rnd):
    """Dozens of workers ending at the same and at different pages, on one medium or two, in one
    word or two: the C walk sizes the result dict once and shares equal ints and floats between
    workers; the results (and their order) must still be the Python walk's."""
    chain = [rnd.randrange(-(2**63), 2**63) for _ in range(64)]
    ops, two_media = [], rnd.random() < 0.5
    for w in range(workers):
        upto = rnd.choice([64, 64, 64, rnd.randrange(1, 65)])  # many end at the same page
        main = "GPU" if w < 64 else "STORAGE"  # the second word's single column is another medium
        ops.append((f"w{w}", BlockStored(chain[:upto], None, [], 16, None, main, None)))
        if two_media and rnd.random() < 0.3:  # a second medium: that worker's word has two columns
            ops.append(
                (f"w{w}", BlockStored(chain[: rnd.randrange(1, upto + 1)], None, [], 16, None, "CPU_PINNED", None))
            )
    built = []
    for path in ("c", "python"):
        idx = BlockIndex()
        with native.python_only() if path == "python" else nullcontext():
            for src, ev in ops:
                idx.apply(src, KVEventBatch(0.0, [ev], 0))
        built.append(idx)
    fast, slow = built
    for q in (chain, chain[:17], chain[:1]):
        for weight in (lambda m: 1.0, lambda m: WEIGHTS.get(m, 0.3)):
            got = fast.prefix_match(np.array(q, np.int64), medium_weight=weight)
            with native.python_only():
                want = slow.prefix_match(np.array(q, np.int64), medium_weight=weight)
            assert got == want and list(got.workers) == list(want.workers)
            assert len(got.workers) == workers
            _columns_equal(fast.prefix_columns(np.array(q, np.int64), medium_weight=weight), want)


@settings(max_examples=12, derandomize=True, deadline=None)
@given(st.integers(40, 420), st.randoms(use_true_random=False))
def test_records_changing_from_page_to_page_equal_the_python_walk(workers, rnd):
    """A page's holder record against the page before's (the walk steps only the pairs that changed
    place, else every pair): hundreds of workers in up to 14 columns ending together or apart,
    pages removed and stored again (a removed pair's place is taken by the record's last one, a
    stored one goes last), workers cleared, a second medium and an adapter's view; every lookup
    must still be the Python walk's."""
    chain = [rnd.randrange(-(2**63), 2**63) for _ in range(40)]
    groups = [range(g, min(g + 32, workers)) for g in range(0, workers, 32)]  # a column per group of 32
    ops: list[tuple[str, object]] = []
    two_media = rnd.random() < 0.25  # then words of two columns: the walk credits media page by page instead
    for g in groups:
        together = rnd.random() < 0.4  # the whole column ends at one page: its pair leaves the record
        end = rnd.randrange(1, 41)
        for w in g:
            upto = end if together else rnd.choice([40, end, rnd.randrange(1, 41)])
            lora = "a" if rnd.random() < 0.1 else None
            ops.append((f"w{w}", BlockStored(chain[:upto], None, [], 16, None, "GPU", lora)))
            if two_media and rnd.random() < 0.1:
                ops.append(
                    (f"w{w}", BlockStored(chain[: rnd.randrange(1, upto + 1)], None, [], 16, None, "DISK", None))
                )
    for _ in range(rnd.randrange(0, 8)):
        # pages a..b of most of a column removed (its pair's place taken by the record's last pair),
        # then stored again by some of them (the pair goes last, often with other bits)
        g, a = rnd.choice(groups), rnd.randrange(40)
        b = rnd.randrange(a + 1, 41)
        gone = [w for w in g if rnd.random() < 0.9]
        ops += [(f"w{w}", BlockRemoved(chain[a:b], "GPU", None)) for w in gone]
        back = chain[a - 1] if a else None
        ops += [(f"w{w}", BlockStored(chain[a:b], back, [], 16, None, "GPU", None)) for w in gone if rnd.random() < 0.5]
    for _ in range(rnd.randrange(0, 3)):
        ops.append((f"w{rnd.randrange(workers)}", AllBlocksCleared()))
    built = []
    for path in ("c", "python"):
        idx = BlockIndex()
        with native.python_only() if path == "python" else nullcontext():
            for src, ev in ops:
                idx.apply(src, KVEventBatch(0.0, [ev], 0))
        built.append(idx)
    fast, slow = built
    for q in (chain, chain[:23], [*chain[:30], 12345, *chain[31:]]):
        hs = np.array(q, np.int64)
        for lora, strict, weight in ((None, True, _ONE), (None, True, _TIERED), ("a", False, _ONE), ("a", True, _ONE)):
            got = fast.prefix_match(hs, lora, strict=strict, medium_weight=weight)
            with native.python_only():
                want = slow.prefix_match(hs, lora, strict=strict, medium_weight=weight)
            assert got == want and list(got.workers) == list(want.workers)
            _columns_equal(fast.prefix_columns(hs, lora, strict=strict, medium_weight=weight), want)


def test_a_column_moved_past_the_end_of_the_record_before_is_still_stepped():
    """Page 0's record is [A, B], page 1's [A, C, B'] (B stored there after C, by fewer workers):
    B' sits past the end of the shorter record before it, and b2, absent from it, ends at page 1."""
    h0, h1 = 1001, 1002
    stores = [("a1", [h0, h1], None), ("b2", [h0], None), ("c1", [h1], h0), ("b1", [h0, h1], None)]
    built = []
    for path in ("c", "python"):
        idx = BlockIndex()
        with native.python_only() if path == "python" else nullcontext():
            # columns are groups of 32 workers: a1 in the first, b1 and b2 in the second, c1 in the third
            for src in ["a1", *(f"pad{i}" for i in range(31)), "b1", "b2", *(f"pad{i}" for i in range(31, 61)), "c1"]:
                idx.apply(src, KVEventBatch(0.0, [], 0))
            for src, hs, parent in stores:
                idx.apply(src, KVEventBatch(0.0, [BlockStored(hs, parent, [], 16, None, "GPU", None)], 0))
        built.append(idx)
    fast, slow = built
    q = np.array([h0, h1, 1003], np.int64)
    got = fast.prefix_match(q)
    with native.python_only():
        want = slow.prefix_match(q)
    assert got == want
    assert {w: m.pages for w, m in got.workers.items()} == {0: 2, 32: 2, 33: 1}
    _columns_equal(fast.prefix_columns(q), want)


@settings(max_examples=40, derandomize=True, deadline=None)
@given(OPS, st.lists(st.lists(KEYS, min_size=1, max_size=40), min_size=1, max_size=3))
def test_lookups_between_changes_equal_the_python_walk(ops, requests):
    """Lookups interleaved with stores, removes, clears, table growth, new workers, media and
    adapters: the compiled walks the index keeps bound between lookups must follow every change
    (each lookup equals a Python walk of an index built the same way)."""
    fast, slow = BlockIndex(), BlockIndex()
    stored: list[list[int]] = []
    for op in ops:
        batch = KVEventBatch(0.0, [_event(op)], 0)
        fast.apply(op[1], batch)
        with native.python_only():
            slow.apply(op[1], batch)
        if op[0] == "store":
            stored.append(list(op[2]))
        for req in [*requests, *stored[-2:]]:
            q = np.array(req, np.int64)
            for lora, weight in ((None, _ONE), ("a", _ONE), (None, _TIERED)):
                got = fast.prefix_match(q, lora, medium_weight=weight)
                with native.python_only():
                    want = slow.prefix_match(q, lora, medium_weight=weight)
                assert got == want and list(got.workers) == list(want.workers)
                _columns_equal(fast.prefix_columns(q, lora, medium_weight=weight), want)


def _columns_equal(got: MatchColumns, want: PrefixMatch) -> None:
    """The compiled columns walk lists the Python walk's workers, in its order, with its pages and scores."""
    exp = MatchColumns.of(want)
    assert got.pages == exp.pages
    assert got.worker.tolist() == exp.worker.tolist()
    assert got.matched.tolist() == exp.matched.tolist()
    assert got.score.tolist() == exp.score.tolist()


def _ONE(medium: str | None) -> float:
    return 1.0


def _TIERED(medium: str | None) -> float:
    return WEIGHTS.get(medium, 0.3)


def test_a_bound_walk_is_dropped_when_its_table_grows_or_moves_its_vacant_key():
    """The bound walk pins its tables' arrays; a rebuild (growth) or a moved vacant key between two
    lookups with nothing else changing must not leave it reading the old ones."""
    idx = BlockIndex()
    idx.apply("w0", KVEventBatch(0.0, [BlockStored([1], None, [], 16, None, "GPU", None)], 0))
    assert idx.prefix_match(np.array([1], np.int64)).workers[0].pages == 1  # binds the walk
    chain = list(range(2, 2_000))
    idx.apply("w0", KVEventBatch(0.0, [BlockStored(chain, 1, [], 16, None, "GPU", None)], 0))  # grows
    assert idx.prefix_match(np.array([1, *chain], np.int64)).workers[0].pages == len(chain) + 1
    idx.apply("w0", KVEventBatch(0.0, [BlockStored([VACANT], 1999, [], 16, None, "GPU", None)], 0))
    assert idx.prefix_match(np.array([1, *chain, VACANT], np.int64)).workers[0].pages == len(chain) + 2
