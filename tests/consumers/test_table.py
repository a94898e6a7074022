"""HashTable (the BlockIndex store): every operation checked against a plain dict model."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvevents.consumers.table import HAS_PARENT, LIVE, SLOTS, VACANT, HashTable, as_hashes, zeros_paged


def upsert(t: HashTable, keys: list[int]) -> np.ndarray:
    q = np.unique(as_hashes(keys))
    t.reserve(len(q))
    slots = t.find(q)
    missing = slots < 0
    if missing.any():
        slots[missing] = t.insert(q[missing])
    return slots


def check(t: HashTable, model: dict[int, int]) -> None:
    """Every model key is found with its value; the table holds nothing else."""
    keys = np.array(sorted(model), np.int64)
    slots = t.find(keys)
    assert (slots >= 0).all()
    assert (t.keys[slots] == keys).all()
    assert t.rows[slots].tolist() == [model[k] for k in keys.tolist()]
    assert t.row_words(keys).tolist() == [model[k] for k in keys.tolist()]  # the router's path
    assert t.live == len(model) == len(t.live_slots())
    assert sorted(t.keys[t.live_slots()].tolist()) == keys.tolist()
    for k, s in t.spill.items():  # the spill dict names exactly the keys living off their home bucket
        assert t.keys[s] == k and s // SLOTS != int(t._home(np.array([k], np.int64))[0])


I64 = st.integers(-(2**63), 2**63 - 1)
KEYS = st.lists(st.one_of(I64, st.integers(-40, 40), st.just(VACANT)), max_size=40)
OPS = st.lists(st.tuples(st.sampled_from(["put", "put", "del", "put1", "del1"]), KEYS), max_size=40)


@settings(max_examples=120)
@given(OPS)
def test_table_matches_a_dict_under_random_puts_and_deletes(ops):
    t = HashTable()
    model: dict[int, int] = {}
    for step, (op, keys) in enumerate(ops, 1):
        if op == "put":
            slots = upsert(t, keys)
            t.rows[slots] = np.uint64(step)
            model.update(dict.fromkeys(keys, step))
        elif op == "put1":  # the scalar paths
            for k in keys:
                s = t.find1(k)
                if s < 0:
                    s = t.insert1(k)
                t.rows[s] = np.uint64(step)
                model[k] = step
        elif op == "del1":
            for k in keys:
                s = t.find1(k)
                assert (s >= 0) == (k in model)
                if s >= 0:
                    t.delete1(s)
                    del model[k]
        else:
            gone = sorted({k for k in keys if k in model})
            slots = t.find(np.array(gone, np.int64))
            t.delete(slots)
            for k in gone:
                del model[k]
        check(t, model)
    absent = np.array([k for k in [*range(-60, 60), t.vacant] if k not in model], np.int64)
    assert (t.find(absent) == -1).all() and all(t.find1(k) == -1 for k in absent.tolist())
    assert (t.rows.take(t.find(absent)) == 0).all()  # slot -1 reads the zero word past the end
    assert (t.row_words(absent) == 0).all()


def test_crowded_buckets_spill_and_stay_findable():
    """Keys chosen to share one home bucket overflow it; lookups still find every one."""
    t = HashTable(buckets=1 << 12)
    cand = np.arange(200_000, dtype=np.int64)
    homes = t._home(cand)
    crowd = cand[homes == homes[0]][: 3 * SLOTS]  # three buckets' worth for one home bucket
    assert len(crowd) == 3 * SLOTS
    slots = upsert(t, crowd.tolist())
    assert len(t.spill) == 2 * SLOTS and t.overflow[int(homes[0])]
    assert (t.find(crowd) == slots).all()
    t.rows[slots] = np.arange(1, len(crowd) + 1, dtype=np.uint64)
    mixed = np.concatenate([crowd, cand[homes == homes[0]][3 * SLOTS : 3 * SLOTS + 3]])  # + absent, same home
    assert t.row_words(mixed).tolist() == list(range(1, len(crowd) + 1)) + [0, 0, 0]
    t.delete(t.find(crowd[:4]))  # deleting spilled and home keys keeps the rest findable
    assert (t.find(crowd[:4]) == -1).all() and (t.find(crowd[4:]) >= 0).all()
    assert all(k not in t.spill for k in crowd[:4].tolist())


def test_growth_rebuild_keeps_rows_and_drops_tombstones():
    t = HashTable()
    keys = np.arange(1, 5001, dtype=np.int64) * 7919
    slots = upsert(t, keys.tolist())
    t.rows[slots] = keys.view(np.uint64)
    t.parent[slots] = keys - 1
    t.state[slots] |= HAS_PARENT
    t.delete(t.find(keys[::2]))
    used_before = t.used
    t.reserve(int(t.capacity * 0.7))  # forces a rebuild
    assert t.used == t.live == 2500 < used_before
    s = t.find(keys[1::2])
    assert (t.rows[s] == keys[1::2].view(np.uint64)).all()
    assert (t.parent[s] == keys[1::2] - 1).all() and (t.state[s] & (LIVE | HAS_PARENT) == LIVE | HAS_PARENT).all()
    assert (t.find(keys[::2]) == -1).all()


def test_a_real_key_equal_to_the_vacant_key_moves_it():
    t = HashTable()
    upsert(t, [1, 2, 3])
    assert t.find1(VACANT) == -1 and t.find(np.array([VACANT]))[0] == -1
    s = t.insert1(VACANT)
    assert t.vacant != VACANT and t.find1(VACANT) == s and t.find(np.array([VACANT]))[0] == s
    assert t.find(np.array([t.vacant]))[0] == -1 and t.find1(t.vacant) == -1
    assert (t.keys[t.state & LIVE == 0] == t.vacant).all()
    t.delete1(s)
    assert t.find1(VACANT) == -1 and (t.find(np.array([1, 2, 3])) >= 0).all()


def test_bad_hashes():
    for bad in ([2**63], [-(2**63) - 1], ["x"], [1.5], [True], [1, 2.0], [None]):
        with pytest.raises(ValueError, match="int64"):
            as_hashes(bad)
    with pytest.raises(ValueError, match="flat"):
        as_hashes([[1, 2]])


def test_zeros_paged_is_zeros_and_huge_page_aligned_when_big() -> None:
    """Big table arrays start on a 2 MiB boundary (where the kernel can back them with huge pages)
    and behave as np.zeros: zero, writable, the shape and dtype asked; small ones are plain."""
    for shape, dtype in ((1 << 19, np.int64), ((1 << 18, 3), np.uint64), (100, np.int64), ((10, 2), np.uint64)):
        a = zeros_paged(shape, dtype)
        assert a.shape == (shape if isinstance(shape, tuple) else (shape,)) and a.dtype == dtype
        assert a.flags.c_contiguous and a.flags.writeable and not a.any()
        big = a.nbytes >= 1 << 21
        if big and hasattr(mmap, "MADV_HUGEPAGE"):
            assert a.ctypes.data % (1 << 21) == 0
        a[-1] = 7
        assert a[-1].all() and a.sum() == 7 * (a.shape[1] if a.ndim == 2 else 1)


def test_a_grown_table_keeps_every_row_in_paged_arrays() -> None:
    """Rebuilds and a grown pool allocate through zeros_paged and keep keys, parents, rows and records."""
    t = HashTable()
    keys = list(range(1, 300_001))
    slots = upsert(t, keys)
    t.rows[slots] = np.arange(1, len(keys) + 1, dtype=np.uint64)
    t.pool.grow(300_000)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert t.rows.ctypes.data % (1 << 21) == 0 and t.pool.words.ctypes.data % (1 << 21) == 0
        # what tracemalloc cannot see is still counted: keys, parents, rows and the pool, not the small arrays
        paged = t.keys.nbytes + t.parent.nbytes + t.rows.nbytes + t.pool.words.nbytes
        assert t.paged_bytes() == paged < t.nbytes()
    again = t.find(as_hashes(keys))
    assert (t.rows[again] == np.arange(1, len(keys) + 1, dtype=np.uint64)).all() and not t.rows[-1]


def test_cview_follows_every_change_of_its_parts() -> None:
    """The compiled paths read the table through `cview()`, which is cached: moving the vacant key,
    a rebuild (new arrays, new spill dict) and an added column must each give a fresh one."""
    t = HashTable()
    first = t.cview()
    assert t.cview() is first
    upsert(t, [VACANT])  # a real key equal to the vacant one moves the vacant key
    moved = t.cview()
    assert moved[6] == t.vacant != VACANT and moved is not first
    upsert(t, list(range(1, 5_000)))  # grows: rebuilt arrays and a new spill dict
    grown = t.cview()
    buckets = len(t.keys) // SLOTS
    assert grown[0].obj is t.keys and grown[7] is t.spill and grown[5] == 64 - (buckets.bit_length() - 1)
    t.pool.grow(1_000)
    assert t.cview()[8].obj is t.pool.words and t.cview() is not grown
