"""PrefixRouter: rank workers by the longest cached prefix of a request, weighted by medium.

It recomputes the request's published (event) hashes with kvevents.hashing, the same contract the
engines use (pages hashed lazily in growing chunks), then asks the BlockIndex's public lookup,
`prefix_match` (one vectorised walk, consumers/lookup.py), and ranks the workers.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Iterator, Mapping, Sequence, Union, cast

import numpy as np

from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.keys import request_keys
from kvevents.consumers.lookup import MatchColumns, PrefixMatch
from kvevents.consumers.table import as_hashes
from kvevents.consumers.worker_key import WorkerKey
from kvevents.hashing import (
    Namespace,
    check_page_size,
    digest_chain,
    event_hashes_int64,
    event_seed,
    pack_tokens,
    packed_chain_int64,
    packed_to_int64,
    packed_to_int64_array,
    split_pages,
    whole_pages_int64,
)

__all__ = ["PrefixRouter", "WorkerScore", "DEFAULT_MEDIUM_WEIGHTS", "LoadKey", "LoadHints", "parse_medium_weights"]

# Host memory: SGLang's host tier is "CPU_PINNED"; vLLM and LMCache publish host-offloaded blocks as
# "CPU" (the same tier, so the same weight). Beyond the host: SGLang's "STORAGE", and "DISK",
# "EXTERNAL", "FS" of the engines' storage tiers. Media not listed weigh PrefixRouter's default_weight.
DEFAULT_MEDIUM_WEIGHTS: dict[str, float] = {
    "GPU": 1.0,
    "CPU_PINNED": 0.8,
    "CPU": 0.8,
    "STORAGE": 0.5,
    "DISK": 0.5,
    "EXTERNAL": 0.5,
    "FS": 0.5,
}


def parse_medium_weights(specs: Sequence[str], base: Mapping[str, float] | None = None) -> dict[str, float]:
    """`NAME=W` specs (route --medium-weight) over `base` (default: DEFAULT_MEDIUM_WEIGHTS); a later
    spec for a name wins. ValueError naming the spec: no `=`, an empty name, W not a finite number >= 0."""
    weights = dict(DEFAULT_MEDIUM_WEIGHTS if base is None else base)
    for spec in specs:
        name, sep, value = spec.partition("=")
        name = name.strip()
        usage = f"--medium-weight {spec!r}: expected NAME=WEIGHT with WEIGHT a number >= 0, e.g. CPU=0.8"
        if not sep or not name:
            raise ValueError(usage)
        try:
            w = float(value)
        except ValueError:
            raise ValueError(usage) from None
        if not math.isfinite(w) or w < 0:
            raise ValueError(usage)
        weights[name] = w
    return weights


_MIX = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1
_FIRST_CHUNK = 32  # pages hashed before score() first asks the index whether to go on; the
# pages hashed so far then double per chunk (see PrefixRouter.prefix_hashes)


#: A load hint's key: the worker, or its display label (what earlier releases keyed hints by).
LoadKey = Union[WorkerKey, str]
#: Load hints by worker, by label, or both.
LoadHints = Union[Mapping[LoadKey, float], Mapping[WorkerKey, float], Mapping[str, float]]


@dataclass(slots=True)
class WorkerScore:
    """One worker's credit for a request: `score` = matched pages weighted by their best medium."""

    key: WorkerKey
    score: float
    matched_pages: int
    matched_tokens: int
    load: float = 0.0
    pages_by_medium: dict[str, int] = field(default_factory=dict)

    @property
    def worker(self) -> str:
        """The worker's display label (`key.label`); the key itself is `key`."""
        return self.key.label

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
        check_page_size(page_size)
        weights = dict(DEFAULT_MEDIUM_WEIGHTS if medium_weights is None else medium_weights)
        for name, w in weights.items():
            if not isinstance(w, (int, float)) or w < 0:
                raise ValueError(f"medium weight for {name!r} must be a number >= 0, got {w!r}")
        self.index = index
        self.page_size = page_size
        self.medium_weights: Mapping[str, float] = MappingProxyType(weights)  # fixed: layouts are cached
        self.default_weight = float(default_weight)
        self.lora_strict = lora_strict
        self.loads: dict[LoadKey, float] = {}
        self._rng = random.Random(seed)

    # ---------------------------------------------------------------- hashing

    def request_hashes(self, token_ids: Sequence[int], cache_salt: str | None = None) -> list[int]:
        """The int64 event hashes of the request's whole pages (a partial tail is never cached)."""
        usable = len(token_ids) - len(token_ids) % self.page_size
        return event_hashes_int64(token_ids[:usable], self.page_size, Namespace(cache_salt=cache_salt))

    def hash_array(self, token_ids: Sequence[int], cache_salt: str | None = None) -> np.ndarray:
        """`request_hashes` as an int64 numpy array (what the lookup consumes)."""
        seed = _request_seed(cache_salt)
        return np.frombuffer(whole_pages_int64(token_ids, self.page_size, seed), np.int64)

    def hash_packed(self, packed: bytes, cache_salt: str | None = None) -> np.ndarray:
        """`hash_array` of ids already packed (little-endian uint32, as `pack_tokens` gives them)."""
        seed = _request_seed(cache_salt)
        whole = memoryview(packed)[: len(packed) - len(packed) % (4 * self.page_size)]  # no copy of 16 MB
        return np.frombuffer(packed_chain_int64(cast(bytes, whole), self.page_size, seed), np.int64)

    def _pages(self, token_ids: Sequence[int], cache_salt: str | None) -> tuple[list[bytes], bytes | None]:
        """The request's whole pages as packed bytes (every id validated up front), and the event seed."""
        seed = _request_seed(cache_salt)
        packed = pack_tokens(token_ids)
        step = 4 * self.page_size  # bytes per page
        return split_pages(packed[: len(packed) - len(packed) % step], self.page_size), seed

    def _weight(self, medium: str | None) -> float:
        if medium is None:  # SGLang omits medium for the device tier
            return float(self.medium_weights.get("GPU", 1.0))
        return float(self.medium_weights.get(medium, self.default_weight))

    def set_load(self, worker: LoadKey, load: float) -> None:
        """Load hint used to break ties (lower first): queue depth, running requests, ... Keyed by
        WorkerKey (or by display label: a hint for a label holds for every worker shown under it)."""
        self.loads[worker] = float(load)

    # ---------------------------------------------------------------- scoring

    def score(
        self,
        token_ids: Sequence[int],
        cache_salt: str | None = None,
        lora_name: str | None = None,
        *,
        loads: LoadHints | None = None,
        page_extra_keys: Sequence[Sequence[Any] | None] | None = None,
    ) -> list[WorkerScore]:
        """Every known worker, best first: longest consecutive prefix weighted by medium.

        Pages are hashed lazily (`prefix_hashes`), then looked up in one vectorised walk.
        `page_extra_keys` (page i's multimodal / prompt-embeds keys, vLLM's untagged form) match
        blocks that tokens-mode sources keyed with them (kvevents.consumers.keys.request_keys).
        """
        if page_extra_keys:
            hashes = request_keys(token_ids, self.page_size, cache_salt, page_extra_keys)
            return self.score_hashes(hashes, lora_name, loads=loads)
        return self.score_hashes(self.prefix_hashes(token_ids, cache_salt, lora_name), lora_name, loads=loads)

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
        digests: list[bytes] = []
        prior = seed
        for start, stop in _chunk_bounds(len(pages)):
            digests += digest_chain(pages[start:stop], prior)
            prior = digests[-1]
            if stop < len(pages):
                last = packed_to_int64(prior)[0]  # the chunk's last page, as published
                if not idx.holds(last, lora_name, strict=self.lora_strict):
                    break
        return digests_as_int64(digests)

    def score_hashes(
        self,
        hashes: Sequence[int] | np.ndarray,
        lora_name: str | None = None,
        *,
        loads: LoadHints | None = None,
    ) -> list[WorkerScore]:
        """`score` for a request whose int64 event hashes are already known (the lookup part alone)."""
        return self._rank(self.match(hashes, lora_name), loads)

    def match(self, hashes: Sequence[int] | np.ndarray, lora_name: str | None = None) -> PrefixMatch:
        """The index's per-worker prefix match of these hashes, weighted by this router's media
        (unranked: kvevents.consumers.cost ranks it for /score)."""
        return self.index.prefix_match(
            as_hashes(hashes), lora_name, strict=self.lora_strict, medium_weight=self._weight
        )

    def match_columns(self, hashes: Sequence[int] | np.ndarray, lora_name: str | None = None) -> MatchColumns:
        """`match` as columns (worker index, prefix pages, score): for ranking every matched worker."""
        return self.index.prefix_columns(
            as_hashes(hashes), lora_name, strict=self.lora_strict, medium_weight=self._weight
        )

    def match_packed(
        self, packed: bytes, cache_salt: str | None = None, lora_name: str | None = None
    ) -> tuple[np.ndarray, MatchColumns]:
        """`hash_packed` then `match_columns`, in one pass where compiled (each page hashed as the walk
        first reads it: the hashing and the table reads overlap). Under the index lock, like a lookup."""
        seed = _request_seed(cache_salt)
        got = self.index.prefix_columns_packed(
            packed, self.page_size, seed, lora_name, strict=self.lora_strict, medium_weight=self._weight
        )
        if got is not None:
            return got
        hashes = self.hash_packed(packed, cache_salt)
        return hashes, self.match_columns(hashes, lora_name)

    def explain(
        self, token_ids: Sequence[int], cache_salt: str | None = None, lora_name: str | None = None
    ) -> dict[str, Any]:
        """Per-worker matched pages and media, plus the request's hashes (for humans and tests)."""
        hashes = self.request_hashes(token_ids, cache_salt)
        ranked = self.score_hashes(hashes, lora_name)
        return {
            "pages": len(hashes),
            "page_size": self.page_size,
            "cache_salt": cache_salt is not None,
            "lora_name": lora_name,
            "lora_strict": self.lora_strict,
            "hashes": hashes,
            "workers": [s.as_dict() for s in ranked],
        }

    def _rank(self, found: PrefixMatch, loads: LoadHints | None) -> list[WorkerScore]:
        """Every known worker, best score first; ties by lower load hint, then in a random order."""
        hint: Mapping[Any, float] = self.loads if loads is None else {**self.loads, **loads}
        salt = self._rng.getrandbits(64)  # one draw per call: ties fall in a random order
        page_size = self.page_size
        matches = found.workers
        keyed = []
        for wi, key in self.index.keys_by_index().items():
            got = matches.get(wi)
            score = got.score if got is not None else 0.0
            load = _load(hint, key) if hint else 0.0
            keyed.append((-score, load, (((wi + 1) ^ salt) * _MIX) & _M64, wi, key, got))
        keyed.sort(key=lambda k: k[:4])
        out = []
        for _, load, _, _, key, got in keyed:
            if got is None:
                out.append(WorkerScore(key, 0.0, 0, 0, float(load)))
            else:
                by_medium = {str(m): k for m, k in got.pages_by_medium.items()}
                out.append(WorkerScore(key, got.score, got.pages, got.pages * page_size, float(load), by_medium))
        return out


def _load(hint: Mapping[Any, float], key: WorkerKey) -> float:
    """A worker's load hint: by its key, else by its display label, else 0."""
    got = hint.get(key)
    return got if got is not None else hint.get(key.label, 0.0)


def _request_seed(cache_salt: str | None) -> bytes | None:
    """The event chain's seed for a request's cache_salt (None and "" alike: unseeded, no Namespace built)."""
    return _event_seed(Namespace(cache_salt=cache_salt).cache_salt) if cache_salt else None


def _event_seed(cache_salt: str | None) -> bytes | None:
    """Raw seed digest of the event chain for a salt (None: unseeded); salts up to 256 characters
    are cached (1,024 of them: bounded in bytes), longer ones hashed per request."""
    if cache_salt is not None and len(cache_salt) > 256:
        return _seed_of(cache_salt)
    return _cached_seed(cache_salt)


def _seed_of(cache_salt: str | None) -> bytes | None:
    hexed = event_seed(Namespace(cache_salt=cache_salt))
    return None if hexed is None else bytes.fromhex(hexed)


_cached_seed = lru_cache(maxsize=1024)(_seed_of)


def _chunk_bounds(n: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of the chunks `prefix_hashes` hashes a request of n pages in."""
    start, stop = 0, min(n, _FIRST_CHUNK)
    while start < n:
        yield start, stop
        start, stop = stop, min(n, 2 * stop)


def digests_as_int64(digests: Sequence[bytes]) -> np.ndarray:
    """Published int64 of each raw digest, as the int64 array a lookup consumes."""
    return np.frombuffer(packed_to_int64_array(b"".join(digests)), np.int64)
