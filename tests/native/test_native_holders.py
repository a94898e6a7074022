"""Holder records (kvevents/consumers/holders.py and kvevents/native/_holders.h) at fleet widths.

Entries held by hundreds of workers move from an inline pair to records that grow class by class,
the pool grows under the compiled store loop (which stops, lets Python grow it, and goes on), and
removes and clears shrink records back inline: both twins must leave the same arrays and answer the
same lookups. A rows word naming no valid record is a ValueError in every C entry point.
"""

from __future__ import annotations

import random
from contextlib import nullcontext

import numpy as np
import pytest

from kvevents import native
from kvevents.consumers.holders import POOL_START, row_pairs
from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.lookup import PrefixMatch, WordLayout, WorkerMatch
from kvevents.consumers.table import HashTable
from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from kvevents.native.layout import CVIEW, ROW_REF

needs_c = pytest.mark.skipif(not native.active(), reason="kvevents.native._speedups not built, or switched off")


def _fleet_ops(workers: int, rnd: random.Random) -> list[tuple[str, object]]:
    chain = [rnd.randrange(-(2**63), 2**63) for _ in range(48)]
    ops: list[tuple[str, object]] = []
    for w in rnd.sample(range(workers), workers):
        medium = "GPU" if w % 3 else "CPU_PINNED"
        ops.append((f"w{w}", BlockStored(chain[: rnd.randrange(1, 49)], None, [], 16, None, medium, None)))
        if rnd.random() < 0.2:
            ops.append((f"w{w}", BlockRemoved(chain[: rnd.randrange(1, 20)], medium, None)))
        if rnd.random() < 0.05:
            ops.append((f"w{w}", AllBlocksCleared()))
    ops.append(("late", BlockStored(chain, None, [], 16, None, "GPU", None)))
    return ops + [("chain", chain)]


def _build(ops, pure: bool) -> BlockIndex:
    idx = BlockIndex()
    with native.python_only() if pure else nullcontext():
        for src, ev in ops[:-1]:
            idx.apply(src, KVEventBatch(0.0, [ev], 0))
    return idx


@needs_c
@pytest.mark.parametrize("workers,seed", [(300, 1), (1100, 2)])
def test_wide_fleets_leave_the_same_tables_and_answers(workers, seed):
    ops = _fleet_ops(workers, random.Random(seed))
    chain = ops[-1][1]
    fast, slow = _build(ops, False), _build(ops, True)
    ft, st = fast._views[0], slow._views[0]
    assert ft is not None and st is not None
    for name in ("keys", "state", "parent", "rows"):
        assert np.array_equal(getattr(ft, name), getattr(st, name)), name
    assert np.array_equal(ft.pool.words, st.pool.words) and np.array_equal(ft.pool.meta, st.pool.meta)
    assert len(ft.pool.words) > POOL_START  # the pool grew under the compiled loop
    assert max(len(row_pairs(int(r), ft.pool)) for r in ft.rows) >= 16  # records of class 3 and up
    q = np.array(chain, np.int64)
    for weight in (lambda m: 1.0, lambda m: 0.5 if m == "CPU_PINNED" else 1.0):
        got = fast.prefix_match(q, medium_weight=weight)
        with native.python_only():
            want = slow.prefix_match(q, medium_weight=weight)
        assert got == want and list(got.workers) == list(want.workers)
        assert len(got.workers) > workers // 2
    assert fast.copies() == slow.copies() and fast.block_counts() == slow.block_counts()
    for src, _ in ops[:-1]:  # everything cleared: every record freed, every row inline or gone
        fast.drop_source(src)
    assert len(fast) == 0 and fast.distinct_hashes == 0 and ft.pool.meta[1] == 0


@needs_c
def test_a_rows_word_naming_no_record_is_a_value_error():
    t = HashTable()
    t.reserve(4)
    t.set_bits_each([1, 2], 0, 1, None)
    t.set_bits_each([1], 3, 1, None)  # key 1: a record
    s = t.find1(1)
    assert t.rows[s] >= ROW_REF
    layout = [WordLayout(0, [(0, 0)], 1), WordLayout(1, [(3, 0)], 1)]
    q = np.array([1, 2], np.int64)
    good = native.walk(q, [(t.cview(), None)], layout, ["GPU"], [1.0], PrefixMatch, WorkerMatch)
    assert good.workers[0].pages == 2 and good.workers[32].pages == 1
    for bad in (
        ROW_REF | 0,
        ROW_REF | 10**9,
        ROW_REF | (len(t.pool.words) - 1),
        ROW_REF | 3 << 56 | (int(t.rows[s]) & 0xFFFF),
    ):  # the last: a class its header does not have
        t.rows[s] = bad
        with pytest.raises(ValueError, match="pool record"):
            native.walk(q, [(t.cview(), None)], layout, ["GPU"], [1.0], PrefixMatch, WorkerMatch)
        with pytest.raises(ValueError, match="pool record"):
            native.holds_bit([t.cview()], 1, [3], 1)
        with pytest.raises(ValueError, match="pool record"):
            native.set_bits_each(t.cview(), [1], 5, 1, None)
        with pytest.raises(ValueError, match="pool record"):
            native.remove_each([t.cview()], [0], {}, 0, 3, 0, [1], None, False)
        with pytest.raises(ValueError, match="pool record"):
            native.clear_worker(t.cview(), [3], 1)
    view = list(t.cview())
    t.rows[s] = ROW_REF | 1
    t.pool.words[1] = 7 << 8 | 0  # a length past its class
    with pytest.raises(ValueError, match="pool record"):
        native.walk(q, [(tuple(view), None)], layout, ["GPU"], [1.0], PrefixMatch, WorkerMatch)
    assert CVIEW.index("pool") == 8


def test_records_free_back_inline_and_are_reused():
    """Python twin alone: the same rules, visible in the arrays."""
    with native.python_only():
        t = HashTable()
        t.reserve(2)
        for col in range(5):  # 5 columns: class 1 (room for 7 pairs)
            t.set_bits_each([9], col, 1, None)
        s = t.find1(9)
        assert len(row_pairs(int(t.rows[s]), t.pool)) == 5 and t.pool.meta[1] == 8
        for col in range(4):
            assert t.clear_bit(s, col, 1)
        assert t.rows[s] == (4 << 32 | 1) and t.pool.meta[1] == 0  # inline again, the record freed
        t.set_bits_each([9], 0, 1, None)
        assert t.rows[s] == ROW_REF | 1 and t.pool.meta[2 + 1] == 5  # the freed class-0 block again; class 1's kept
        assert t.clear_bit(s, 4, 1) and t.clear_bit(s, 0, 1) and t.find1(9) == -1  # the slot goes with its last holder


@needs_c
def test_store_event_refuses_what_the_general_path_must_judge():
    """None (nothing written) for a bool, a float, an int past int64, a non-int parent or the vacant
    key; ValueError for malformed arguments; else set_bits_each's answer and the parent probe."""
    t = HashTable()
    t.reserve(8)
    before = (t.keys.copy(), t.rows.copy())
    for hashes, prev in (([1, True], None), ([1, 2.0], None), ([1, 2**63], None), ([1], 1.5), ([t.vacant], None)):
        assert native.store_event(t.cview(), hashes, 0, 1, prev, [], [0]) is None
    assert np.array_equal(t.keys, before[0]) and np.array_equal(t.rows, before[1])
    got = native.store_event(t.cview(), [1, 2], 0, 1, None, [], [0])
    assert got is not None and got[:4] == ([], 2, 2, -1) and got[5] is False
    t.live, t.used = 2, 2
    got = native.store_event(t.cview(), [3], 0, 2, 2, [t.cview()], [0])  # parent 2: held by bit 1, not bit 2
    assert got is not None and got[5] is False
    got = native.store_event(t.cview(), [4], 0, 1, 2, [t.cview()], [0])
    assert got is not None and got[5] is True
    for bad in (
        lambda: native.store_event(t.cview(), [1], -1, 1, None, [], [0]),
        lambda: native.store_event(t.cview(), [1], 0, 0, None, [], [0]),
        lambda: native.store_event(t.cview(), [1], 0, 2**32, None, [], [0]),
        lambda: native.store_event(t.cview(), [1], 0, 1, None, [], [-1]),
        lambda: native.store_event(
            t.cview(), [1], 0, 1, 2, [(1, 2)], [0]
        ),  # parent views are read when there is a parent
        lambda: native.store_event((1, 2), [1], 0, 1, None, [], [0]),
    ):
        with pytest.raises(ValueError):
            bad()
