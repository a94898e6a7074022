"""Shared holder records (copy on write) in both twins: consecutive pages of a chain with the same
holders name one record; removes copy a shared record first (the compiled loop stops for pool room
and goes on), clears change it once for every sharer. Both twins leave the same arrays and answers.
"""

from __future__ import annotations

import random
from contextlib import nullcontext

import numpy as np
import pytest

from kvevents import native
from kvevents.consumers.holders import POOL_START, row_pairs
from kvevents.consumers.indexer import BlockIndex
from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from kvevents.native.layout import REC_SHARES_SHIFT, ROW_REF

needs_c = pytest.mark.skipif(not native.active(), reason="kvevents.native._speedups not built, or switched off")


def _store(chain: list[int], n: int) -> list[BlockStored]:
    """A worker's prefix of `n` pages of `chain`, in events of 16 pages, each naming its parent."""
    out = []
    for i in range(0, n, 16):
        out.append(BlockStored(chain[i : min(n, i + 16)], chain[i - 1] if i else None, [], 16, None, "GPU", None))
    return out


def _apply(idx: BlockIndex, pure: bool, src: str, *events) -> None:
    with native.python_only() if pure else nullcontext():
        idx.apply(src, KVEventBatch(0.0, list(events), 0))


def _same(fast: BlockIndex, slow: BlockIndex, chain: list[int]) -> None:
    ft, st = fast._views[0], slow._views[0]
    assert ft is not None and st is not None
    for name in ("keys", "state", "parent", "rows"):
        assert np.array_equal(getattr(ft, name), getattr(st, name)), name
    assert np.array_equal(ft.pool.words, st.pool.words) and np.array_equal(ft.pool.meta, st.pool.meta)
    q = np.array(chain, np.int64)
    got = fast.prefix_match(q)
    with native.python_only():
        want = slow.prefix_match(q)
    assert got == want and list(got.workers) == list(want.workers)
    assert fast.copies() == slow.copies() and fast.block_counts() == slow.block_counts()


def _fleet(pure: bool) -> BlockIndex:
    """An index that has seen workers w0..w129 in order (worker w: index w, column group w // 32),
    each holding a page of its own."""
    idx = BlockIndex()
    for w in range(130):
        _apply(idx, pure, f"w{w}", BlockStored([10**6 + w], None, [], 16, None, "GPU", None))
    return idx


def _records(idx: BlockIndex, chain: list[int]) -> list[int]:
    t = idx._views[0]
    assert t is not None
    return [int(t.rows[t.find1(h)]) for h in chain]


@needs_c
def test_a_chain_with_the_same_holders_names_one_record():
    chain = list(range(1, 41))
    fast, slow = _fleet(False), _fleet(True)
    for idx, pure in ((fast, False), (slow, True)):
        for w in (0, 40, 80):  # three columns: every page is a record of three pairs
            _apply(idx, pure, f"w{w}", *_store(chain, 40))
    rows = _records(fast, chain)
    t = fast._views[0]
    assert t is not None and rows[0] >= ROW_REF and set(rows) == {rows[0]}  # one record for the 40 pages
    o = rows[0] & ((1 << 56) - 1)
    assert int(t.pool.words[o]) >> REC_SHARES_SHIFT == 39 and len(row_pairs(rows[0], t.pool)) == 3
    _same(fast, slow, chain)
    # a worker's holders change at page 25: the pages from there on name a second record
    for idx, pure in ((fast, False), (slow, True)):
        _apply(idx, pure, "w120", *_store(chain, 25))
    rows = _records(fast, chain)
    assert len(set(rows[:25])) == 1 and len(set(rows[25:])) == 1 and rows[0] != rows[25]
    _same(fast, slow, chain)


@needs_c
def test_removes_copy_shared_records_and_the_compiled_loop_grows_the_pool():
    rnd = random.Random(3)
    chains = [[rnd.randrange(-(2**62), 2**62) for _ in range(32)] for _ in range(12)]
    fast, slow = _fleet(False), _fleet(True)
    for idx, pure in ((fast, False), (slow, True)):
        for c in chains:
            for w in (0, 40, 80):
                _apply(idx, pure, f"w{w}", *_store(c, 32))
    t = fast._views[0]
    assert t is not None
    before = len(t.pool.words)
    assert before == POOL_START  # 12 shared records fit the first pool
    for idx, pure in ((fast, False), (slow, True)):
        for c in chains:  # every other page: each one's own copy (two pairs) of its chain's record
            _apply(idx, pure, "w80", BlockRemoved(c[1::2], "GPU", None))
    assert len(t.pool.words) > before  # grown in the middle of the compiled remove loop
    for c in chains:
        rows = _records(fast, c)
        assert len(set(rows[1::2])) == 16 and len(set(rows[0::2])) == 1
        assert all(len(row_pairs(r, t.pool)) == 2 for r in rows[1::2])
        _same(fast, slow, c)
    for idx, pure in ((fast, False), (slow, True)):
        _apply(idx, pure, "w40", BlockRemoved(chains[0][:2], "GPU", None))  # 2 pairs left: inline, no copy
    _same(fast, slow, chains[0])


@needs_c
def test_a_clear_changes_a_shared_record_once_for_every_sharer():
    chain = list(range(100, 148))
    fast, slow = _fleet(False), _fleet(True)
    for idx, pure in ((fast, False), (slow, True)):
        for w, n in ((0, 48), (40, 48), (80, 30), (1, 48)):
            _apply(idx, pure, f"w{w}", *_store(chain, n))
    _same(fast, slow, chain)
    t = fast._views[0]
    assert t is not None
    copies = sum(fast.copies().values())
    for idx, pure in ((fast, False), (slow, True)):
        _apply(idx, pure, "w80", AllBlocksCleared())
    assert sum(fast.copies().values()) == copies - 31  # its 30 pages of the chain and its own page
    _same(fast, slow, chain)
    rows = _records(fast, chain)
    assert len(set(rows)) == 2 and {tuple(row_pairs(r, t.pool)) for r in rows} == {(0b11, 1 << 32 | 1 << 8)}
    for idx, pure in ((fast, False), (slow, True)):
        _apply(idx, pure, "w40", AllBlocksCleared())  # one pair left: every sharer inline, the record freed
    assert set(_records(fast, chain)) == {0 << 32 | 0b11} and t.pool.meta[1] == 0
    _same(fast, slow, chain)
