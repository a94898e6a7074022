"""PrefixRouter: rank workers by the longest cached prefix of a request, weighted by medium.

It recomputes the request's published (event) hashes with kvevents.hashing, the same contract the
engines use (int64 fast path, pages hashed lazily in chunks), then walks the pages through the
BlockIndex: per page only C-level iterators (dict gets, `groupby`); Python runs per run of equal masks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache, reduce
from itertools import accumulate, chain, compress, count, groupby, islice, repeat, takewhile, tee
from operator import and_, itemgetter, ne, or_, truth
from typing import Any, Iterable, Iterator, Mapping, Sequence

from kvevents.hashing import (
    Namespace,
    digest_chain,
    digests_to_int64,
    event_hashes_int64,
    event_seed,
    pack_tokens,
    split_pages,
)

from consumers.indexer import BlockIndex, _bits

__all__ = ["PrefixRouter", "WorkerScore", "DEFAULT_MEDIUM_WEIGHTS"]

DEFAULT_MEDIUM_WEIGHTS: dict[str, float] = {"GPU": 1.0, "CPU_PINNED": 0.8, "STORAGE": 0.5}
_MIX = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1
_FIRST_CHUNK = 16  # pages hashed before the first lookup; chunks double after that ...
_MAX_CHUNK = 64  # ... up to this many pages, so at most this many are hashed past the last match
_MAX_RUNS = 32  # runs of equal masks walked in Python before the per-page C-level intersection


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
        self.medium_weights = weights
        self.default_weight = float(default_weight)
        self.lora_strict = lora_strict
        self.loads: dict[str, float] = {}
        self._rng = random.Random(seed)

    # ---------------------------------------------------------------- hashing

    def request_hashes(self, token_ids: Sequence[int], cache_salt: str | None = None) -> list[int]:
        """The int64 event hashes of the request's whole pages (a partial tail is never cached)."""
        usable = len(token_ids) - len(token_ids) % self.page_size
        return event_hashes_int64(token_ids[:usable], self.page_size, Namespace(cache_salt=cache_salt))

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

        Pages are hashed lazily in chunks, so the pages past the longest cached prefix cost little.
        """
        seed = _event_seed(Namespace(cache_salt=cache_salt).cache_salt)
        packed = pack_tokens(token_ids)  # every id validated up front
        step = 4 * self.page_size
        pages = split_pages(packed[: len(packed) - len(packed) % step], self.page_size)
        return self._rank(*self._walk(_lazy_hashes(pages, seed), lora_name, want_detail=False), loads)

    def score_hashes(
        self, hashes: Sequence[int], lora_name: str | None = None, *, loads: Mapping[str, float] | None = None
    ) -> list[WorkerScore]:
        """`score` for a request whose int64 event hashes are already known (the lookup part alone)."""
        return self._rank(*self._walk((hashes,), lora_name, want_detail=False), loads)

    def explain(
        self, token_ids: Sequence[int], cache_salt: str | None = None, lora_name: str | None = None
    ) -> dict[str, Any]:
        """Per-worker matched pages and media, plus the request's hashes (for humans and tests)."""
        hashes = self.request_hashes(token_ids, cache_salt)
        ranked = self._rank(*self._walk((hashes,), lora_name, want_detail=True), None)
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
        self, chunks: Iterable[Sequence[int]], lora_name: str | None, *, want_detail: bool
    ) -> tuple[dict[int, int], dict[int, float], dict[int, dict[int, int]], float]:
        """Walk the request's pages; per worker index: matched pages, weight deficit, media; top weight."""
        idx = self.index
        weights = [self._weight(m) for m in idx._media]
        used = [mi for mi, n in enumerate(idx._medium_copies) if n]
        top = max((weights[mi] for mi in used), default=1.0)
        plan = idx._lookup_plan(lora_name, self.lora_strict)
        active = idx._all_workers
        matched: dict[int, int] = {}
        if not plan or not active:
            return matched, {}, {}, top
        masks = _plan_masks(plan, chain.from_iterable(chunks))
        if len(used) == 1 and not want_detail:
            _prefix_lengths(masks, active, used[0] * idx._stride, matched)  # one medium: one bit group
            return matched, {}, {}, top
        best = self._best_media(masks, active, used, weights, matched)
        deficit: dict[int, float] = {}
        for wi, by_mi in best.items():
            lost = sum(n * (top - weights[mi]) for mi, n in by_mi.items() if weights[mi] < top)
            if lost:
                deficit[wi] = lost
        return matched, deficit, best if want_detail else {}, top

    def _best_media(
        self, masks: Iterable[int], active: int, used: list[int], weights: list[float], matched: dict[int, int]
    ) -> dict[int, dict[int, int]]:
        """Several media: walk runs of equal masks; per worker, prefix pages by their best medium."""
        stride = self.index._stride
        low = (1 << stride) - 1
        order = sorted(used, key=lambda mi: (-weights[mi], mi))  # best weight first, ties: lowest index
        best: dict[int, dict[int, int]] = {}
        page = 0
        for m, run in groupby(masks):
            w = 0
            mm = m
            while mm:
                w |= mm & low
                mm >>= stride
            w &= active
            if w != active:
                if page:
                    for wi in _bits(active & ~w):
                        matched[wi] = page
                active = w
                if not active:
                    break
            n = len(list(run))
            for wi in _bits(active):
                for mi in order:
                    if (m >> (mi * stride + wi)) & 1:
                        d = best.setdefault(wi, {})
                        d[mi] = d.get(mi, 0) + n
                        break
            page += n
        for wi in _bits(active):
            matched[wi] = page
        return best

    def _rank(
        self,
        matched: dict[int, int],
        deficit: dict[int, float],
        detail: dict[int, dict[int, int]],
        top: float,
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
            score = pages * top - deficit.get(wi, 0.0) if pages else 0.0
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


def _lazy_hashes(pages: list[bytes], seed: bytes | None) -> Iterator[list[int]]:
    """The pages' int64 event hashes in growing chunks (the walk stops pulling when done)."""
    prior = seed
    start, size = 0, _FIRST_CHUNK
    while start < len(pages):
        digests = digest_chain(pages[start : start + size], prior)
        prior = digests[-1]
        start, size = start + size, min(size * 2, _MAX_CHUNK)
        yield digests_to_int64(digests)


def _plan_masks(plan: list[tuple[dict[int, int], int]], hashes: Iterator[int]) -> Iterator[int]:
    """Lazy per-page masks: OR over the plan's views of `view.get(h, 0) & filter` (C-level maps)."""
    parts = []
    for (view, filt), hs in zip(plan, tee(hashes, len(plan)) if len(plan) > 1 else (hashes,)):
        got = map(view.get, hs, repeat(0))
        parts.append(got if filt == -1 else map(and_, got, repeat(filt)))
    return parts[0] if len(parts) == 1 else reduce(lambda a, b: map(or_, a, b), parts)


def _prefix_lengths(masks: Iterable[int], active: int, shift: int, matched: dict[int, int]) -> None:
    """Longest consecutive prefix per worker from per-page masks (one medium, its group at `shift`).

    Python runs once per run of equal masks (`groupby`, C-level per page: a few runs per request
    in practice), and stops pulling masks (and hashes) at the first page nobody left holds.
    Masks that keep changing (holdings that are not prefixes) switch to `_intersect_rest`.
    """
    active <<= shift
    page = 0
    groups = groupby(masks)
    for runs, (m, run) in enumerate(groups):
        if m & active != active:
            if page:
                _credit(active & ~m, page, shift, matched)
            active &= m
            if not active:
                return
        page += len(list(run))
        if runs == _MAX_RUNS:
            active, page = _intersect_rest(chain.from_iterable(map(itemgetter(1), groups)), active, page, shift, matched)
            break
    _credit(active, page, shift, matched)


def _intersect_rest(masks: Iterable[int], active: int, page: int, shift: int, matched: dict[int, int]) -> tuple[int, int]:
    """Running intersection, C-level per page; Python only where it loses bits (<= one per worker)."""
    acc = list(takewhile(truth, accumulate(masks, and_, initial=active)))  # acc[i]: holders of pages < page + i
    for i in compress(count(), map(ne, acc, islice(acc, 1, None))):
        _credit(acc[i] & ~acc[i + 1], page + i, shift, matched)
    return acc[-1], page + len(acc) - 1


def _credit(bits: int, pages: int, shift: int, matched: dict[int, int]) -> None:
    """matched[worker] = pages for each set bit (worker index + shift) of `bits`."""
    while bits:
        low = bits & -bits
        matched[low.bit_length() - 1 - shift] = pages
        bits ^= low
