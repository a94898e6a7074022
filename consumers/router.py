"""PrefixRouter: rank workers by the longest cached prefix of a request, weighted by medium.

It recomputes the request's published (event) hashes with kvevents.hashing, the same contract the
engines use (pages hashed lazily in growing chunks), then looks the hashed pages up in the
BlockIndex at once: numpy gathers of the pages' mask rows, a running AND per worker word for the longest
consecutive prefix, and per-bit counts for pages and medium weights. No Python runs per page.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from kvevents.hashing import (
    Namespace,
    digest_chain,
    event_hashes_int64,
    event_seed,
    pack_tokens,
    split_pages,
)

from consumers.indexer import WORD, BlockIndex
from consumers.table import as_hashes

__all__ = ["PrefixRouter", "WorkerScore", "DEFAULT_MEDIUM_WEIGHTS"]

DEFAULT_MEDIUM_WEIGHTS: dict[str, float] = {"GPU": 1.0, "CPU_PINNED": 0.8, "STORAGE": 0.5}
_MIX = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1
_FIRST_CHUNK = 32  # pages hashed before score() first asks the index whether to go on; the
# pages hashed so far then double per chunk (see PrefixRouter.prefix_hashes)


@dataclass(slots=True)
class WorkerScore:
    """One worker's credit for a request: `score` = matched pages weighted by their best medium."""

    worker: str
    score: float
    matched_pages: int
    matched_tokens: int
    load: float = 0.0
    pages_by_medium: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "score": round(self.score, 6),
            "matched_pages": self.matched_pages,
            "matched_tokens": self.matched_tokens,
            "load": self.load,
            "pages_by_medium": dict(self.pages_by_medium),
        }


class PrefixRouter:
    """Scores workers for a request from a BlockIndex (ties: lower load hint first, then random).

    lora_strict: only copies stored under the request's lora_name are credited (event hashes
    ignore extra_key, so a same-token copy may belong to another adapter); lora-less copies of a
    worker that never published a lora_name are credited to everyone, as nothing tells them apart.
    Media: medium None (SGLang omits it for the device) weighs as "GPU"; unlisted media weigh
    `default_weight`. A worker's score is the sum, over its prefix pages, of each page's best weight.
    """

    def __init__(
        self,
        index: BlockIndex,
        page_size: int,
        *,
        medium_weights: Mapping[str, float] | None = None,
        lora_strict: bool = True,
        default_weight: float = 0.5,
        seed: int | None = None,
    ) -> None:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be an integer >= 1, got {page_size!r}")
        weights = dict(DEFAULT_MEDIUM_WEIGHTS if medium_weights is None else medium_weights)
        for name, w in weights.items():
            if not isinstance(w, (int, float)) or w < 0:
                raise ValueError(f"medium weight for {name!r} must be a number >= 0, got {w!r}")
        self.index = index
        self.page_size = page_size
        self.medium_weights: Mapping[str, float] = MappingProxyType(weights)  # fixed: layouts are cached
        self.default_weight = float(default_weight)
        self.lora_strict = lora_strict
        self.loads: dict[str, float] = {}
        self._layout_cache: tuple[Any, list[float], list[tuple[int, list[tuple[int, int]], int]]] | None = None
        self._rng = random.Random(seed)

    # ---------------------------------------------------------------- hashing

    def request_hashes(self, token_ids: Sequence[int], cache_salt: str | None = None) -> list[int]:
        """The int64 event hashes of the request's whole pages (a partial tail is never cached)."""
        usable = len(token_ids) - len(token_ids) % self.page_size
        return event_hashes_int64(token_ids[:usable], self.page_size, Namespace(cache_salt=cache_salt))

    def hash_array(self, token_ids: Sequence[int], cache_salt: str | None = None) -> np.ndarray:
        """`request_hashes` as an int64 numpy array (what the lookup consumes)."""
        pages, seed = self._pages(token_ids, cache_salt)
        return digests_as_int64(digest_chain(pages, seed)) if pages else np.empty(0, np.int64)

    def _pages(self, token_ids: Sequence[int], cache_salt: str | None) -> tuple[list[bytes], bytes | None]:
        """The request's whole pages as packed bytes (every id validated up front), and the event seed."""
        seed = _event_seed(Namespace(cache_salt=cache_salt).cache_salt)
        packed = pack_tokens(token_ids)
        step = 4 * self.page_size  # bytes per page
        return split_pages(packed[: len(packed) - len(packed) % step], self.page_size), seed

    def _layout(self, idx: BlockIndex) -> tuple[list[float], list[tuple[int, list[tuple[int, int]], int]]]:
        """Medium weights, and per worker word (columns best weight first, known workers); cached
        until the index's layout (workers, media, columns, media holding copies) changes."""
        key = idx._layout_version
        if self._layout_cache is None or self._layout_cache[0] != key:
            weights = [self._weight(m) for m in idx._media]
            layout = []
            for word, cols in idx._word_columns().items():
                alive = idx._word_bits.get(word, 0)
                if alive:
                    cols.sort(key=lambda c: (-weights[c[1]], c[1]))
                    layout.append((word, cols, alive))
            self._layout_cache = (key, weights, layout)
        return self._layout_cache[1], self._layout_cache[2]

    def _weight(self, medium: str | None) -> float:
        if medium is None:  # SGLang omits medium for the device tier
            return float(self.medium_weights.get("GPU", 1.0))
        return float(self.medium_weights.get(medium, self.default_weight))

    def set_load(self, worker: str, load: float) -> None:
        """Load hint used to break ties (lower first): queue depth, running requests, ..."""
        self.loads[worker] = float(load)

    # ---------------------------------------------------------------- scoring

    def score(
        self,
        token_ids: Sequence[int],
        cache_salt: str | None = None,
        lora_name: str | None = None,
        *,
        loads: Mapping[str, float] | None = None,
    ) -> list[WorkerScore]:
        """Every known worker, best first: longest consecutive prefix weighted by medium.

        Pages are hashed lazily (`prefix_hashes`), then looked up in one vectorised walk.
        """
        hs = self.prefix_hashes(token_ids, cache_salt, lora_name)
        return self._rank(*self._walk(hs, lora_name, want_detail=False), loads)

    def prefix_hashes(
        self, token_ids: Sequence[int], cache_salt: str | None = None, lora_name: str | None = None
    ) -> np.ndarray:
        """The int64 hashes `score` looks up: the request's pages in chunks (32 pages, then the
        total doubling), stopping after a chunk whose last page no worker holds (for this
        lora_name), as no consecutive prefix can run past it. Hashing costs ~0.5 us a page, so
        a request that matches little is cheap; one one-key probe per chunk decides.
        """
        pages, seed = self._pages(token_ids, cache_salt)
        idx = self.index
        plan = idx._lookup_plan(lora_name, self.lora_strict)
        digests: list[bytes] = []
        prior = seed
        for start, stop in _chunk_bounds(len(pages)):
            digests += digest_chain(pages[start:stop], prior)
            prior = digests[-1]
            last = int.from_bytes(prior[:8], "big", signed=True)  # the chunk's last page, as published
            if stop < len(pages) and not (plan and idx._held(plan, last)):
                break
        return digests_as_int64(digests) if digests else np.empty(0, np.int64)

    def score_hashes(
        self, hashes: Sequence[int], lora_name: str | None = None, *, loads: Mapping[str, float] | None = None
    ) -> list[WorkerScore]:
        """`score` for a request whose int64 event hashes are already known (the lookup part alone)."""
        return self._rank(*self._walk(as_hashes(hashes), lora_name, want_detail=False), loads)

    def explain(
        self, token_ids: Sequence[int], cache_salt: str | None = None, lora_name: str | None = None
    ) -> dict[str, Any]:
        """Per-worker matched pages and media, plus the request's hashes (for humans and tests)."""
        hashes = self.request_hashes(token_ids, cache_salt)
        ranked = self._rank(*self._walk(as_hashes(hashes), lora_name, want_detail=True), None)
        return {
            "pages": len(hashes),
            "page_size": self.page_size,
            "cache_salt": cache_salt is not None,
            "lora_name": lora_name,
            "lora_strict": self.lora_strict,
            "hashes": hashes,
            "workers": [s.as_dict() for s in ranked],
        }

    def _walk(
        self, q: np.ndarray, lora_name: str | None, *, want_detail: bool, exact: bool = False
    ) -> tuple[dict[int, int], dict[int, float], dict[int, dict[int, int]], dict[int, float]]:
        """Per worker index: matched prefix pages, score, (want_detail) pages by best medium; and
        per worker word with one medium, its weight (a score there is pages x weight, see _rank).

        One vectorised lookup of the pages' masks, then per worker word (64 workers): OR the
        word's medium columns and take a running AND down the pages. It only loses bits, so
        Python runs once per change (a worker's prefix ending), not per page. Several media:
        each prefix page is credited once, at the best-weighted medium holding it.
        With one view (the usual plan) the lookup first skips the table's spill: the few keys off
        their home bucket read as absent, an all-zero row. Such a misread page drops every running
        AND to zero, so only the page where a word's AND drops to zero is checked, and the walk is
        redone exactly if it is spilled. Several views are OR'd (a misread there only loses some
        bits, anywhere), so they are read exactly from the start.
        """
        idx = self.index
        plan = idx._lookup_plan(lora_name, self.lora_strict)
        matched: dict[int, int] = {}
        scores: dict[int, float] = {}
        detail: dict[int, dict[int, int]] = {}
        unit: dict[int, float] = {}
        n = len(q)
        if not plan or not idx._by_index or not n:
            return matched, scores, detail, unit
        weights, layout = self._layout(idx)
        per_medium: dict[int, dict[int, np.ndarray]] = {}  # word -> medium -> prefix pages per bit
        exact = exact or len(plan) > 1
        m = idx._page_masks(plan, q, exact=exact)
        check: list[int] = []  # where a word's running AND drops to zero: what a misread would look like
        for word, cols, alive in layout:
            if len(cols) == 1:
                held = m[:, cols[0][0]]
            else:
                held = np.bitwise_or.reduce(m[:, [c for c, _ in cols]], axis=1)
            acc = np.bitwise_and.accumulate(held)  # acc[i]: held pages 0..i (alive is applied below)
            if len(cols) > 1 or want_detail:
                _credit_media(m, acc & np.uint64(alive), cols, per_medium.setdefault(word, {}))
            else:
                unit[word] = weights[cols[0][1]]  # one medium: every prefix page has its weight
            base = word * WORD
            going = alive & acc.item(0)  # the others match no page: not recorded
            after = acc[1:]
            starts = (after != acc[:-1]).nonzero()[0]  # the running AND lost bits after page i
            ends = starts.tolist()
            for i, now in zip(ends, after.take(starts).tolist()):
                ended = going & ~now  # these workers' prefixes are pages 0..i
                going &= now
                while ended:
                    low = ended & -ended
                    matched[base + low.bit_length() - 1] = i + 1
                    ended ^= low
            while going:  # still matching at the last page
                low = going & -going
                matched[base + low.bit_length() - 1] = n
                going ^= low
            if not exact and not acc.item(n - 1):  # zero sticks: it dropped at its last change, or page 0
                check.append(ends[-1] + 1 if ends else 0)
        if check and idx._spilled(plan, map(q.item, check)):  # rare: redo it exactly
            return self._walk(q, lora_name, want_detail=want_detail, exact=True)
        for word, media in per_medium.items():
            for b in range(WORD):
                pages = matched.get(word * WORD + b)
                if pages:
                    by_mi = {mi: int(per[b]) for mi, per in media.items() if per[b]}
                    scores[word * WORD + b] = sum(weights[mi] * k for mi, k in by_mi.items())
                    if want_detail:
                        detail[word * WORD + b] = by_mi
        return matched, scores, detail, unit

    def _rank(
        self,
        matched: dict[int, int],
        scores: dict[int, float],
        detail: dict[int, dict[int, int]],
        unit: dict[int, float],
        loads: Mapping[str, float] | None,
    ) -> list[WorkerScore]:
        idx = self.index
        media = idx._media
        hint = self.loads if loads is None else {**self.loads, **loads}
        salt = self._rng.getrandbits(64)  # one draw per call: ties fall in a random order
        page_size = self.page_size
        keyed = []
        for wi, w in idx._by_index.items():
            pages = matched.get(wi, 0)
            score = (scores[wi] if wi in scores else pages * unit[wi // WORD]) if pages else 0.0
            load = hint.get(w.label, 0.0) if hint else 0.0
            keyed.append((-score, load, (((wi + 1) ^ salt) * _MIX) & _M64, wi, w.label, score, pages))
        keyed.sort()
        out = []
        for _, load, _, wi, label, score, pages in keyed:
            d = detail.get(wi)
            by_medium = {str(media[mi]): n for mi, n in d.items()} if d else {}
            out.append(WorkerScore(label, score, pages, pages * page_size, float(load), by_medium))
        return out


@lru_cache(maxsize=1024)
def _event_seed(cache_salt: str | None) -> bytes | None:
    """Raw seed digest of the event chain for a salt (None: unseeded)."""
    hexed = event_seed(Namespace(cache_salt=cache_salt))
    return None if hexed is None else bytes.fromhex(hexed)


def _chunk_bounds(n: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of the chunks `prefix_hashes` hashes a request of n pages in."""
    start, stop = 0, min(n, _FIRST_CHUNK)
    while start < n:
        yield start, stop
        start, stop = stop, min(n, 2 * stop)


def digests_as_int64(digests: Sequence[bytes]) -> np.ndarray:
    """Published int64 of each 32-byte digest (its first 8 bytes, big-endian, signed) as an array."""
    return np.frombuffer(b"".join(digests), dtype=">i8")[::4].astype(np.int64)


def _credit_media(m: np.ndarray, acc: np.ndarray, cols: list[tuple[int, int]], per: dict[int, np.ndarray]) -> None:
    """Add, per worker bit, the prefix pages whose best medium is each column's (best first)."""
    rest = acc.copy()
    for col, mi in cols:
        got = m[:, col] & rest
        rest &= ~got
        counts = _bit_counts(got)
        if mi in per:
            per[mi] += counts
        else:
            per[mi] = counts


def _bit_counts(words: np.ndarray) -> np.ndarray:
    """For each of the 64 bit positions, how many of the uint64 `words` have it set."""
    if not len(words):
        return np.zeros(WORD, np.int64)
    octets = words.astype("<u8", copy=False).view(np.uint8).reshape(-1, 8)
    return np.unpackbits(octets, axis=1, bitorder="little").sum(0, dtype=np.int64)
