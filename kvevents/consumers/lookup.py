"""The index walk: per-worker consecutive prefix lengths of a request, by medium.

Pure functions over the holders a `BlockIndex` reads for a request's pages (each page's pairs of
(column, bits of WORD workers), spread here into a (pages, columns) matrix), so the walk has no
access to the index's internals and another implementation (a compiled one, which reads the pairs
page by page and follows only the words still matching) can replace it behind
`BlockIndex.prefix_match`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from kvevents import native
from kvevents.consumers.holders import LOW, expand_rows
from kvevents.consumers.table import HashTable
from kvevents.native.layout import WORD

__all__ = [
    "WORD",
    "WorkerMatch",
    "PrefixMatch",
    "MatchColumns",
    "ColumnsWalk",
    "WordLayout",
    "walk",
    "walk_plan",
    "bind_walk",
    "bind_walk_columns",
    "page_masks",
]


@dataclass(slots=True)
class WorkerMatch:
    """One worker's match: consecutive prefix pages, their weighted score, and the pages credited
    to each medium (each page once, at the best-weighted medium holding it)."""

    pages: int
    score: float
    pages_by_medium: dict[str | None, int] = field(default_factory=dict)


@dataclass(slots=True)
class PrefixMatch:
    """A lookup's result: worker index -> its match (workers that match no page are left out)."""

    pages: int  # pages looked up
    workers: dict[int, WorkerMatch] = field(default_factory=dict)


@dataclass(slots=True)
class MatchColumns:
    """A lookup's result as columns, for a caller that ranks every matched worker (the /score answer):
    three arrays of equal length, in PrefixMatch.workers' order, and no object per worker."""

    pages: int  # pages looked up
    worker: np.ndarray  # int64 worker index
    matched: np.ndarray  # int64 consecutive prefix pages
    score: np.ndarray  # float64 weighted score

    @classmethod
    def of(cls, found: PrefixMatch) -> MatchColumns:
        """The columns of a PrefixMatch (the Python twin of the compiled columns walk)."""
        ws = found.workers
        return cls(
            found.pages,
            np.fromiter(ws, np.int64, len(ws)),
            np.fromiter((m.pages for m in ws.values()), np.int64, len(ws)),
            np.fromiter((m.score for m in ws.values()), np.float64, len(ws)),
        )

    @classmethod
    def from_bytes(cls, pages: int, raw: bytes) -> MatchColumns:
        """The compiled walk's columns (bytes of int64 workers, int64 pages, float64 scores)."""
        n = len(raw) // 24
        ints = np.frombuffer(raw, np.int64, 2 * n)
        return cls(pages, ints[:n], ints[n:], np.frombuffer(raw, np.float64, n, 16 * n))


@dataclass(slots=True)
class WordLayout:
    """One word of WORD workers: its columns as (column, medium index) best weight first, and
    the bits of the workers that exist."""

    word: int
    cols: list[tuple[int, int]]
    alive: int


def walk_plan(
    hashes: np.ndarray,
    plan: list[tuple[HashTable, np.ndarray | None]],
    layout: list[WordLayout],
    media: list[str | None],
    weights: list[float],
    ncols: int,
) -> PrefixMatch:
    """`walk` over the holders of `hashes` OR-ed across the plan's views (each AND its filter).

    The compiled path probes, ORs and walks page by page and stops at the first page no worker
    holds; the Python path spreads every page's pairs into a matrix (`page_masks`). Same result."""
    if native.active():
        got = native.walk(hashes, [(t.cview(), f) for t, f in plan], layout, media, weights, PrefixMatch, WorkerMatch)
        if got is not NotImplemented:
            return got  # type: ignore[no-any-return]
    masks = np.zeros((len(hashes), ncols), np.uint64)
    for t, filt in plan:  # (pages, columns) masks: OR over the plan's filtered views
        m = page_masks(t, hashes, ncols)
        if filt is not None:
            m &= filt
        masks |= m
    return walk(masks, layout, media, weights)


def page_masks(t: HashTable, hashes: np.ndarray, ncols: int) -> np.ndarray:
    """(pages, columns) uint64: per page of `hashes`, the bits of each column holding it in `t`."""
    m = np.zeros((len(hashes), ncols), np.uint64)
    page, pairs = expand_rows(t.row_words(hashes), t.pool)
    cols = (pairs >> np.uint64(32)).astype(np.intp)
    ok = cols < ncols
    m[page[ok], cols[ok]] = pairs[ok] & np.uint64(LOW)  # a page's pairs have distinct columns
    return m


def bind_walk(
    plan: list[tuple[HashTable, np.ndarray | None]],
    layout: list[WordLayout],
    media: list[str | None],
    weights: list[float],
) -> Callable[[np.ndarray], PrefixMatch] | None:
    """`walk_plan` with all but the hashes bound, on the compiled path (None where it would decline:
    no extension, or weights that are not all floats). Valid while the plan's tables keep their
    `cview()` and the layout stands."""
    if not native.active() or not all(type(w) is float for w in weights):
        return None
    bound: Callable[[np.ndarray], PrefixMatch] = native.bind_walk(
        [(t.cview(), f) for t, f in plan], layout, media, weights, PrefixMatch, WorkerMatch
    )
    return bound


class ColumnsWalk:
    """A compiled walk bound to a plan and layout, answering MatchColumns: of a request's hashes, or of
    its packed ids (`packed`: each page hashed as the walk first needs it, so the SHA-256 chain, which
    is latency-bound, and the table reads, which are memory-bound, overlap)."""

    __slots__ = ("_raw",)

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def __call__(self, hashes: np.ndarray) -> MatchColumns:
        return MatchColumns.from_bytes(len(hashes), self._raw(hashes))

    def packed(self, ids: bytes, page_size: int, prior: bytes | None) -> tuple[np.ndarray, MatchColumns]:
        """The whole pages of packed ids (little-endian uint32) hashed after `prior` (the event chain's
        int64 hashes, as `packed_chain_int64` gives them) and their walk, in one pass."""
        hashes, raw = self._raw.packed(ids, page_size, prior)
        return np.frombuffer(hashes, np.int64), MatchColumns.from_bytes(len(hashes) // 8, raw)


def bind_walk_columns(
    plan: list[tuple[HashTable, np.ndarray | None]],
    layout: list[WordLayout],
    media: list[str | None],
    weights: list[float],
) -> ColumnsWalk | None:
    """`bind_walk` returning MatchColumns (the same walk; no object per matched worker)."""
    if not native.active() or not all(type(w) is float for w in weights):
        return None
    return ColumnsWalk(native.bind_walk_columns([(t.cview(), f) for t, f in plan], layout, media, weights))


def walk(m: np.ndarray, layout: list[WordLayout], media: list[str | None], weights: list[float]) -> PrefixMatch:
    """Per worker: the longest run of pages 0..k-1 it holds (on any medium), scored by medium weight.

    Per word: OR the word's medium columns, then a running AND down the pages. The AND only
    loses bits, so Python runs once per change (a worker's prefix ending), not once per page.
    """
    n = m.shape[0]
    out = PrefixMatch(n)
    if not n:
        return out
    for lay in layout:
        cols = lay.cols
        if len(cols) == 1:
            held = m[:, cols[0][0]]
        else:
            held = np.bitwise_or.reduce(m[:, [c for c, _ in cols]], axis=1)
        acc = np.bitwise_and.accumulate(held) & np.uint64(lay.alive)  # acc[i]: held pages 0..i
        matched = _prefix_ends(acc, lay.word * WORD)
        if not matched:
            continue
        if len(cols) == 1:
            mi = cols[0][1]
            for wi, pages in matched.items():
                out.workers[wi] = WorkerMatch(pages, pages * weights[mi], {media[mi]: pages})
            continue
        per = _credit_media(m, acc, cols)
        for wi, pages in matched.items():
            b = wi % WORD
            by_mi = {mi: int(counts[b]) for mi, counts in per.items() if counts[b]}
            out.workers[wi] = WorkerMatch(
                pages, sum(weights[mi] * k for mi, k in by_mi.items()), {media[mi]: k for mi, k in by_mi.items()}
            )
    return out


def _prefix_ends(acc: np.ndarray, base: int) -> dict[int, int]:
    """Worker index -> prefix pages, from a word's running AND (0 pages: left out)."""
    n = len(acc)
    out: dict[int, int] = {}
    going = acc.item(0)
    after = acc[1:]
    starts = (after != acc[:-1]).nonzero()[0]  # the running AND lost bits after page i
    for i, now in zip(starts.tolist(), after.take(starts).tolist()):
        ended = going & ~now  # these workers' prefixes are pages 0..i
        going &= now
        while ended:
            low = ended & -ended
            out[base + low.bit_length() - 1] = i + 1
            ended ^= low
    while going:  # still matching at the last page
        low = going & -going
        out[base + low.bit_length() - 1] = n
        going ^= low
    return out


def _credit_media(m: np.ndarray, acc: np.ndarray, cols: list[tuple[int, int]]) -> dict[int, np.ndarray]:
    """Medium index -> per worker bit, the prefix pages whose best medium is that column's."""
    per: dict[int, np.ndarray] = {}
    rest = acc.copy()
    for col, mi in cols:
        got = m[:, col] & rest
        rest &= ~got
        counts = _bit_counts(got)
        per[mi] = per[mi] + counts if mi in per else counts
    return per


def _bit_counts(words: np.ndarray) -> np.ndarray:
    """For each of the 64 bit positions, how many of the uint64 `words` have it set."""
    if not len(words):
        return np.zeros(WORD, np.int64)
    octets = words.astype("<u8", copy=False).view(np.uint8).reshape(-1, 8)
    return np.unpackbits(octets, axis=1, bitorder="little").sum(0, dtype=np.int64)


def make_plan(
    views: list[HashTable | None],
    vid: int | None,
    named: bool,
    blind: list[int],
    cols: dict[tuple[int, int], int],
    strict: bool,
) -> list[tuple[HashTable, np.ndarray | None]]:
    """(view, per-column worker filter or None) pairs whose OR gives a page's masks for a request.

    Not strict: every view. Strict: the view of the request's lora name (`vid`), plus, for a named
    request, the no-adapter view filtered to `blind` workers (those that never published a
    lora_name: their events cannot tell adapters apart). Freed views (None) are skipped.
    """
    if not strict:
        return [(t, None) for t in views if t is not None]
    plan: list[tuple[HashTable, np.ndarray | None]] = []
    if vid is not None and views[vid] is not None:
        plan.append((views[vid], None))  # type: ignore[arg-type]
    if named and blind and views[0] is not None:
        filt = np.zeros(len(cols), np.uint64)
        for (_, word), col in cols.items():
            filt[col] = sum(1 << (wi % WORD) for wi in blind if wi // WORD == word)
        plan.append((views[0], filt))  # type: ignore[arg-type]
    return plan
