"""The prepared walk (kvevents.native.bind_walk: the C BoundWalk) against a fresh walk per call.

A binding parses its arguments, opens its views and flattens its layout once, then resets its running
state per call: every call must equal `native.walk` of the same request, whatever came before it (other
requests, a call that failed half-way, a call made from inside one of its own calls). Skipped where the
extension is not built.
"""

from __future__ import annotations

import gc
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvevents import native
from kvevents._chain import packed_chain_int64
from kvevents.consumers.lookup import PrefixMatch, WordLayout, WorkerMatch
from kvevents.consumers.table import HashTable
from kvevents.hashing import pack_tokens
from kvevents.native.layout import CVIEW, ROW_REF

pytestmark = pytest.mark.skipif(
    not native.active(), reason="kvevents.native._speedups not built, or KVEVENTS_PURE_PYTHON set"
)

MEDIA = ["GPU", "CPU_PINNED"]
WEIGHTS = [1.0, 0.5]
# word 0: workers 0..3 with a GPU column (0) and a CPU_PINNED one (1), credited per medium; word 1: column 2
LAYOUT = [WordLayout(0, [(0, 0), (1, 1)], 0b1111), WordLayout(1, [(2, 0)], 0b11)]


def _table(chain: list[int], holders: list[tuple[int, int, int]]) -> HashTable:
    """`chain` stored for each (column, bits, pages) holder: its first `pages` pages."""
    t = HashTable()
    t.reserve(len(chain) + 1)
    for col, bits, pages in holders:
        t.set_bits_each(chain[:pages], col, bits, None)
    return t


def _plan(t: HashTable) -> list:
    return [(t.cview(), None)]


CHAIN = list(range(101, 141))
HOLDERS = [(0, 0b0001, 40), (1, 0b0001, 12), (0, 0b0010, 25), (1, 0b0100, 33), (2, 0b01, 7), (2, 0b10, 40)]


@settings(max_examples=40, derandomize=True, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40), st.booleans()), min_size=1, max_size=12))
def test_every_call_of_one_binding_equals_a_fresh_walk(requests):
    t = _table(CHAIN, HOLDERS)
    plan = _plan(t)
    bound = native.bind_walk(plan, LAYOUT, MEDIA, WEIGHTS, PrefixMatch, WorkerMatch)
    columns = native.bind_walk_columns(plan, LAYOUT, MEDIA, WEIGHTS)
    for start, stop, foreign in requests:
        q = np.array(CHAIN[start:stop] + ([999_999] if foreign else []), np.int64)
        want = native.walk(q, plan, LAYOUT, MEDIA, WEIGHTS, PrefixMatch, WorkerMatch)
        got = bound(q)
        assert got == want and list(got.workers) == list(want.workers)
        raw = columns(q)
        n = len(want.workers)
        assert len(raw) == 24 * n
        ints = np.frombuffer(raw, np.int64, 2 * n) if n else np.zeros(0, np.int64)
        assert ints[:n].tolist() == list(want.workers)
        assert ints[n:].tolist() == [m.pages for m in want.workers.values()]
        assert np.frombuffer(raw, np.float64, n, 16 * n).tolist() == [m.score for m in want.workers.values()]


def test_a_call_that_failed_half_way_leaves_the_next_one_right():
    t = _table(CHAIN, HOLDERS)
    plan = _plan(t)
    bound = native.bind_walk(plan, LAYOUT, MEDIA, WEIGHTS, PrefixMatch, WorkerMatch)
    q = np.array(CHAIN, np.int64)
    want = bound(q)
    rows = t.cview()[CVIEW.index("rows")]
    slot = t.find1(CHAIN[20])
    kept = int(rows[slot])
    rows[slot] = ROW_REF | (1 << 40)  # a record past the pool's end, met on page 20
    with pytest.raises(ValueError):
        bound(q)
    with pytest.raises(ValueError):
        bound(np.array([1.0, 2.0]))  # not int64 hashes
    rows[slot] = kept
    assert bound(q) == want and bound(q[:5]) == native.walk(
        q[:5], plan, LAYOUT, MEDIA, WEIGHTS, PrefixMatch, WorkerMatch
    )


def _reentrant(inner: list, call: Callable[[], Any]) -> type:
    """A PrefixMatch stand-in whose first construction makes `call()` (a call of the same binding, from
    inside the walk building it) and keeps its answer in `inner[0]`."""

    class Reentrant:
        def __init__(self, pages: int) -> None:
            self.pages, self.workers = pages, {}
            if not inner:
                inner.append(None)
                inner[0] = call()

        def __eq__(self, other: object) -> bool:
            return (self.pages, self.workers) == (getattr(other, "pages", None), getattr(other, "workers", None))

    return Reentrant


def test_a_call_from_inside_a_call_walks_on_its_own():
    """A result class whose __init__ calls the same binding: the inner call cannot share the outer
    one's running state, so it takes the unbound path; both answers are right."""
    t = _table(CHAIN, HOLDERS)
    plan = _plan(t)
    inner_q = np.array(CHAIN[:9], np.int64)
    inner: list = []
    bound = native.bind_walk(plan, LAYOUT, MEDIA, WEIGHTS, _reentrant(inner, lambda: bound(inner_q)), WorkerMatch)
    q = np.array(CHAIN, np.int64)
    got = bound(q)
    assert got == native.walk(q, plan, LAYOUT, MEDIA, WEIGHTS, PrefixMatch, WorkerMatch)
    assert inner[0] == native.walk(inner_q, plan, LAYOUT, MEDIA, WEIGHTS, PrefixMatch, WorkerMatch)
    assert bound(inner_q) == inner[0]  # and the binding is free again afterwards


def test_a_binding_keeps_its_tables_arrays_alive():
    t = _table(CHAIN, HOLDERS)
    bound = native.bind_walk(_plan(t), LAYOUT, MEDIA, WEIGHTS, PrefixMatch, WorkerMatch)
    q = np.array(CHAIN, np.int64)
    want = bound(q)
    del t
    gc.collect()
    assert bound(q) == want


def test_weights_that_are_not_floats_answer_not_implemented_every_call():
    t = _table(CHAIN, HOLDERS)
    bound = native.bind_walk(_plan(t), LAYOUT, MEDIA, [1, 0.5], PrefixMatch, WorkerMatch)
    for _ in range(2):
        assert bound(np.array(CHAIN, np.int64)) is NotImplemented
    assert bound(np.zeros(0, np.int64)) == PrefixMatch(0)  # no pages: the empty result, as `walk` gives


# ---------------------------------------------------------------- packed ids, hashed as the walk reads them


def _event_hashes(ids: list[int], page_size: int, prior: bytes | None) -> np.ndarray:
    """The int64 event hashes of the whole pages of `ids` (the reference: hashing, then the walk)."""
    packed = pack_tokens(ids)
    whole = packed[: len(packed) - len(packed) % (4 * page_size)]
    return np.frombuffer(packed_chain_int64(whole, page_size, prior), np.int64)


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    st.sampled_from([1, 3, 16]),
    st.integers(0, 70),
    st.integers(0, 15),
    st.sampled_from([None, bytes(range(32))]),
    st.lists(st.tuples(st.integers(0, 2), st.integers(1, 15), st.integers(0, 70)), max_size=6),
    st.booleans(),
)
def test_packed_equals_hashing_then_walking(page_size, pages, tail, prior, holders, columns_mode):
    rnd = np.random.default_rng(pages * 131 + tail)
    ids = rnd.integers(0, 2**32, pages * page_size + tail % page_size, dtype=np.uint64).tolist()
    hashes = _event_hashes(ids, page_size, prior)
    t = _table(hashes.tolist(), [(col, bits if col < 2 else bits & 0b11 or 1, n) for col, bits, n in holders])
    plan = _plan(t)
    if columns_mode:
        bound = native.bind_walk_columns(plan, LAYOUT, MEDIA, WEIGHTS)
    else:
        bound = native.bind_walk(plan, LAYOUT, MEDIA, WEIGHTS, PrefixMatch, WorkerMatch)
    for _ in range(2):  # the binding is free again after a call
        got_hashes, got = bound.packed(pack_tokens(ids), page_size, prior)
        assert np.frombuffer(got_hashes, np.int64).tolist() == hashes.tolist()
        assert got == bound(hashes)


def test_packed_answers_the_hashes_even_where_the_walk_declines():
    ids = list(range(64))
    hashes = _event_hashes(ids, 16, None)
    t = _table(hashes.tolist(), [(0, 0b1, 4)])
    bound = native.bind_walk(_plan(t), LAYOUT, MEDIA, [1, 0.5], PrefixMatch, WorkerMatch)
    got_hashes, got = bound.packed(pack_tokens(ids), 16, None)
    assert got is NotImplemented and np.frombuffer(got_hashes, np.int64).tolist() == hashes.tolist()


def test_packed_from_inside_a_call_hashes_then_walks_on_its_own():
    ids = list(range(40 * 4))
    hashes = _event_hashes(ids, 4, None)
    t = _table(hashes.tolist(), HOLDERS)
    plan = _plan(t)
    inner: list = []
    again = _reentrant(inner, lambda: bound.packed(pack_tokens(ids[:36]), 4, None))
    bound = native.bind_walk(plan, LAYOUT, MEDIA, WEIGHTS, again, WorkerMatch)
    got_hashes, got = bound.packed(pack_tokens(ids), 4, None)
    assert got == native.walk(hashes, plan, LAYOUT, MEDIA, WEIGHTS, PrefixMatch, WorkerMatch)
    inner_hashes, inner_got = inner[0]
    assert np.frombuffer(inner_hashes, np.int64).tolist() == hashes[:9].tolist()
    assert inner_got == native.walk(hashes[:9], plan, LAYOUT, MEDIA, WEIGHTS, PrefixMatch, WorkerMatch)


def test_packed_refuses_bad_arguments_with_value_error():
    bound = native.bind_walk_columns(_plan(_table(CHAIN, HOLDERS)), LAYOUT, MEDIA, WEIGHTS)
    with pytest.raises(ValueError, match="packed tokens must be bytes"):
        bound.packed("not bytes", 16, None)
    with pytest.raises(ValueError, match="page_size"):
        bound.packed(b"\0" * 64, 0, None)
    with pytest.raises(ValueError, match="prior"):
        bound.packed(b"\0" * 64, 16, b"short")
    hashes, got = bound.packed(b"", 16, None)
    assert hashes == b"" and got == bound(np.zeros(0, np.int64))
