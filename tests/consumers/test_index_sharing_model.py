"""Stateful model test of BlockIndex with shared holder records (copy on write), both twins.

A dict of per-(worker, medium, lora, hash) copy counts is the model; the index is driven only through
`apply` and `drop_source` (stores of overlapping chains, removes, AllBlocksCleared, a source reset
followed by a snapshot-like re-store, forgetting a source). Few workers, spread over three worker
words and two media (so most pages hold records of several pairs), chains from a small tree (so
consecutive pages share holders and records), a 64-word starting pool (so copies on write, clears and
pool growth interleave). After every step: copies, block counts, `holds` and `prefix_match` equal
the model, and the compiled index and the pure-Python one hold identical arrays, with every record's
share count equal to the slots naming it. Bounded for CI; KVEVENTS_MODEL_EXAMPLES=N runs N examples.
"""

from __future__ import annotations

import os
from collections import Counter
from contextlib import nullcontext

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvevents import native
from kvevents.consumers.holders import OFFSET
from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.table import HashTable
from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from kvevents.native.layout import PMETA_IN_USE, POOL_MIN_WORDS, REC_SHARES_SHIFT, ROW_REF

# active workers (source, dp rank) -> the bit index they get: words 0, 1 and 2 (three columns a medium)
ACTIVE = {("a", 0): 0, ("a", 1): 1, ("b", 0): 33, ("c", 0): 66, ("c", 1): 67}
WORKERS = list(ACTIVE)
MEDIA = ["GPU", "CPU_PINNED"]
LORAS = [None, "L1"]
FILLERS = [f"f{i}" for i in range(68) if i not in ACTIVE.values()]
Key = tuple[tuple[str, int], str, str | None, int]  # (worker, medium, lora, hash)

# a chain is a path in a tree of branching 3: page j's hash names the path up to j (shared prefixes);
# mostly prefixes of three long paths (so several workers hold the same runs of pages), some any path
BASES = [[0] * 16, [0] * 8 + [1] * 8, [0] * 4 + [2] * 12]
paths = st.one_of(
    st.builds(lambda b, n: b[:n], st.sampled_from(BASES), st.integers(1, 16)),
    st.lists(st.integers(0, 2), min_size=1, max_size=8),
)


def page_hashes(path: list[int]) -> list[int]:
    out, h = [], 1
    for step in path:
        h = h * 4 + 1 + step
        out.append(h)
    return out


def _batch(rank: int, *events: object) -> KVEventBatch:
    return KVEventBatch(0.0, list(events), rank)


def _tables(idx: BlockIndex) -> list[HashTable | None]:
    return idx._views  # the test reads the arrays to compare the twins write for write


def _check_shares(t: HashTable) -> None:
    """Every record's header counts the slots naming it (less one); in-use words add up."""
    live = t.live_slots()
    rows = t.rows[live]
    refs = Counter(int(r) & OFFSET for r in rows[rows >= np.uint64(ROW_REF)].tolist())
    words = t.pool.words
    for o, n in refs.items():
        head = int(words[o])
        assert head >> REC_SHARES_SHIFT == n - 1, (o, head >> REC_SHARES_SHIFT, n)
        assert 2 <= head >> 8 & 0xFFFFFFFF < POOL_MIN_WORDS << (head & 0xFF), (o, head)  # 2+ pairs that fit
    in_use = sum(POOL_MIN_WORDS << (int(words[o]) & 0xFF) for o in refs)
    assert in_use == int(t.pool.meta[PMETA_IN_USE]), (in_use, int(t.pool.meta[PMETA_IN_USE]))


class IndexModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.twins = [(BlockIndex(), True)]  # (index, pure Python)
        if native.active():
            self.twins.insert(0, (BlockIndex(), False))
        for idx, pure in self.twins:  # bit indices as ACTIVE says: fillers hold the others
            names = {i: w for w, i in ACTIVE.items()}
            filler = iter(FILLERS)
            for i in range(68):
                src, rank = names.get(i) or (next(filler), 0)
                self._on(idx, pure, lambda: idx.apply(src, _batch(rank)))
        self.known = set(WORKERS) | {(f, 0) for f in FILLERS}
        self.copies: Counter[Key] = Counter()
        self.lora_sources: set[tuple[str, int]] = set()  # workers that stored under a lora_name
        self.queries: list[list[int]] = []

    @staticmethod
    def _on(idx: BlockIndex, pure: bool, call):
        with native.python_only() if pure else nullcontext():
            return call()

    def _apply(self, w: tuple[str, int], *events: object) -> None:
        for idx, pure in self.twins:
            self._on(idx, pure, lambda: idx.apply(w[0], _batch(w[1], *events)))
        self.known.add(w)

    # ------------------------------------------------------------------ rules

    @rule(
        w=st.sampled_from(WORKERS),
        medium=st.sampled_from(MEDIA),
        lora=st.sampled_from(LORAS),
        path=paths,
        start=st.integers(0, 15),
        split=st.integers(1, 10),
    )
    def store(self, w, medium, lora, path, start, split) -> None:
        """Pages path[start:] chained from page start-1, in events of `split` pages."""
        self._store(w, medium, lora, page_hashes(path), start, split)

    @rule(
        w=st.sampled_from(WORKERS),
        medium=st.sampled_from(MEDIA),
        lora=st.sampled_from(LORAS),
        which=st.integers(0, 5),
        start=st.integers(0, 15),
        split=st.integers(1, 10),
    )
    def store_again(self, w, medium, lora, which, start, split) -> None:
        """A chain stored lately, stored (again) by this worker: runs of pages with equal holders."""
        if self.queries:
            self._store(w, medium, lora, self.queries[which % len(self.queries)], start, split)

    def _store(self, w: tuple[str, int], medium: str, lora: str | None, hs: list[int], start: int, split: int) -> None:
        start = min(start, len(hs) - 1)
        events = []
        for i in range(start, len(hs), split):
            part = hs[i : i + split]
            events.append(BlockStored(part, hs[i - 1] if i else None, [], 16, None, medium, lora))
        self._apply(w, *events)
        for h in hs[start:]:
            self.copies[(w, medium, lora, h)] += 1
        if lora is not None:
            self.lora_sources.add(w)
        self.queries = ([hs] + [q for q in self.queries if q != hs])[:6]

    @rule(w=st.sampled_from(WORKERS), data=st.data())
    def remove(self, w, data) -> None:
        """Remove some of the worker's copies (a chain's tail, like an eviction, or any), repeats and
        unknown hashes too; a hash whose copy could go from another adapter's view is left out (which
        view the index picks then depends on view numbers the model does not keep)."""
        mine = sorted({(k[1], k[2] or "") for k in self.copies if k[0] == w})
        if mine and data.draw(st.integers(0, 3)):
            medium, name = data.draw(st.sampled_from(mine))  # (medium, lora) it holds copies under
            lora = name or None
        else:
            medium, lora = data.draw(st.sampled_from(MEDIA)), data.draw(st.sampled_from(LORAS))
        held = sorted({k[3] for k in self.copies if k[0] == w and k[1] == medium and self.copies[k]})
        pool = held + [h + 10**9 for h in held[:2]] + [7]
        cuts = [(len(q), q) for q in self.queries]
        runs = [[h for h in q[a:b] if h in held] for n, q in cuts for a, b in ((n // 2, n), (1, 3), (n - 1, n))]
        picked = data.draw(st.one_of(st.lists(st.sampled_from(pool), max_size=12), st.sampled_from(runs or [[]])))
        hashes = []
        for h in picked:
            mine = (w, medium, lora, h)
            if self.copies[mine]:
                self.copies[mine] -= 1
                if not self.copies[mine]:
                    del self.copies[mine]
            elif any(k[0] == w and k[1] == medium and k[3] == h for k in self.copies):
                continue  # held under another lora only: ambiguous for the model
            hashes.append(h)
        if hashes:
            self._apply(w, BlockRemoved(hashes, medium, lora))

    @rule(
        kind=st.sampled_from(["clear", "reset", "forget", "snapshot"]),
        w=st.sampled_from(WORKERS),
        whole=st.booleans(),
        medium=st.sampled_from(MEDIA),
        paths_=st.lists(paths, min_size=1, max_size=3),
    )
    def lifecycle(self, kind, w, whole, medium, paths_) -> None:
        """AllBlocksCleared; a source reset (drop_source, as the service does on a Reset) of one rank
        or all (`whole`), forgetting it or not; or a snapshot heal (a reset, then pages re-stored)."""
        if kind == "clear":
            self._apply(w, AllBlocksCleared())
            self._drop(lambda k: k[0] == w)
            return
        rank = None if whole and kind != "snapshot" else w[1]
        for idx, pure in self.twins:
            self._on(idx, pure, lambda: idx.drop_source(w[0], rank, forget=kind == "forget"))
        gone = {k for k in self.known if k[0] == w[0] and (rank is None or k[1] == rank)}
        self._drop(lambda k: k[0] in gone)
        if kind == "forget":
            self.known -= gone
            self.lora_sources -= gone
        if kind == "snapshot":
            events = []
            for p in paths_:
                hs = page_hashes(p)
                events.append(BlockStored(hs, None, [], 16, None, medium, None))
                for h in hs:
                    self.copies[(w, medium, None, h)] += 1
            self._apply(w, *events)

    def _drop(self, which) -> None:
        for k in [k for k in self.copies if which(k)]:
            del self.copies[k]

    # ------------------------------------------------------------------ checks

    def _pages(self, held: dict, hashes: list[int], lora: str | None) -> dict:
        """Per worker: its consecutive prefix of `hashes` under `lora` (strict), and pages by medium
        (each at the first medium of MEDIA holding it); `held`: (worker, lora, hash) -> media."""
        out = {}
        for w in {k[0] for k in held}:
            views = (lora,) if lora is None or w in self.lora_sources else (lora, None)
            n, by = 0, Counter[str]()
            for h in hashes:
                on = set().union(*(held.get((w, v, h), ()) for v in views))
                if not on:
                    break
                n += 1
                by[next(m for m in MEDIA if m in on)] += 1
            if n:
                out[w] = (n, dict(by))
        return out

    @invariant()
    def index_equals_model(self) -> None:
        want = Counter[int]()
        per_worker: dict[tuple[str, int], Counter[str]] = {w: Counter() for w in self.known}
        held: dict[tuple[tuple[str, int], str | None, int], set[str]] = {}
        for (w, m, lora, h), n in self.copies.items():
            want[h] += n
            per_worker[w][m] += n
            held.setdefault((w, lora, h), set()).add(m)
        counts = {w: {m: n for m, n in c.items() if n} for w, c in per_worker.items()}
        queries = self.queries + [q[: len(q) // 2] for q in self.queries if len(q) > 1]
        expect = {(lora, i): self._pages(held, q, lora) for lora in LORAS for i, q in enumerate(queries)}
        for idx, pure in self.twins:
            with native.python_only() if pure else nullcontext():
                assert idx.copies() == want
                assert {(k.source, k.dp_rank): v for k, v in idx.worker_block_counts().items()} == counts
                keys = idx.keys_by_index()
                for (lora, i), pages in expect.items():
                    q = queries[i]
                    got = idx.prefix_match(np.array(q, np.int64), lora)
                    seen = {
                        (keys[wi].source, keys[wi].dp_rank): (
                            m.pages,
                            {k: v for k, v in m.pages_by_medium.items() if v},
                        )
                        for wi, m in got.workers.items()
                    }
                    assert seen == pages, (pure, lora, q)
                    assert idx.holds(q[0], lora) == bool(pages)
        self._twins_alike()

    def _twins_alike(self) -> None:
        tables = [_tables(idx) for idx, _ in self.twins]
        for ts in zip(*tables, strict=True):
            for t in ts:
                if t is not None:
                    _check_shares(t)
            if len(ts) == 2 and ts[0] is not None and ts[1] is not None:
                a, b = ts
                for name in ("keys", "state", "parent", "rows"):
                    assert np.array_equal(getattr(a, name), getattr(b, name)), name
                assert np.array_equal(a.pool.words, b.pool.words) and np.array_equal(a.pool.meta, b.pool.meta)


IndexModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("KVEVENTS_MODEL_EXAMPLES", "200")),
    stateful_step_count=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestIndexModel = IndexModel.TestCase
