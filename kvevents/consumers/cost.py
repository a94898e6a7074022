"""The routing cost and the ranking of /score: which workers an answer lists, in which order.

Policy `cost` (the default, NVIDIA Dynamo's linear form):

    cost = prefill_load_scale * max(active_prefill_blocks + request_blocks - overlap_credit, 0)
           + active_decode_blocks

where `overlap_credit` is the worker's cached prefix in pages, each page weighted by the best
medium holding it (GPU 1.0, CPU_PINNED 0.8, STORAGE 0.5: the router's medium weights), predicted
pages at the GPU weight. Lowest cost first; with `temperature` > 0 the pick is drawn instead, with
probability softmax(-normalised cost / temperature) (costs scaled to 0..1 over the fleet), from a
seeded RNG. Policy `prefix` is the ranking before costs: most credit first, then lower load
(`prefill_load_scale * prefill + decode`), then the caller's load hint.

An answer lists every worker that matched a page plus those of the `top_k` lowest-cost workers
that did not (the rest are counted, not built): O(matched + top_k) in Python, plus a few numpy passes over the fleet
when loads are known (none when no load is). Ties fall in a random order drawn per request.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvevents.consumers.loads import LoadVectors
from kvevents.consumers.worker_key import WorkerKey

__all__ = ["POLICIES", "CostSettings", "Candidate", "Ranked", "WorkerSlots", "rank_workers"]

POLICIES: tuple[str, ...] = ("cost", "prefix")
_MIX = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1
_MIX_U = np.uint64(_MIX)
_MAX_FACTOR = 1e6


@dataclass(frozen=True)
class CostSettings:
    """How /score ranks (route --policy, --prefill-load-scale, --temperature; a request may override)."""

    policy: str = "cost"
    prefill_load_scale: float = 1.0
    temperature: float = 0.0
    top_k: int = 8

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        for name in ("prefill_load_scale", "temperature"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= _MAX_FACTOR:
                raise ValueError(f"{name} must be a number in 0..{_MAX_FACTOR:g}, got {v!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f"top_k must be an integer >= 1, got {self.top_k!r}")


@dataclass(slots=True)
class Candidate:
    """A worker that matched: pages held by the index (`pages`, weighted `score`), pages predicted
    beyond them, and its credit (score + predicted pages at the GPU weight)."""

    pages: int
    score: float
    predicted: int
    credit: float
    pages_by_medium: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Ranked:
    """One worker of an answer, in answer order."""

    wi: int
    key: WorkerKey
    cost: float
    hint: float
    match: Candidate | None


class WorkerSlots:
    """Per worker-index mapping (BlockIndex.keys_by_index, the same object until workers change):
    the live slots as a mask and a list, and key -> index, rebuilt only when the mapping changes."""

    def __init__(self) -> None:
        self._keys: Mapping[int, WorkerKey] | None = None
        self.alive = np.zeros(0, bool)
        self.live: list[int] = []
        self.by_key: dict[WorkerKey, int] = {}

    def of(self, keys: Mapping[int, WorkerKey]) -> WorkerSlots:
        if keys is not self._keys:
            self._keys = keys
            n = max(keys, default=-1) + 1
            self.alive = np.zeros(n, bool)
            self.live = sorted(keys)
            self.alive[self.live] = True
            self.by_key = {k: wi for wi, k in keys.items()}
        return self


def rank_workers(
    keys: Mapping[int, WorkerKey],
    slots: WorkerSlots,
    matched: Mapping[int, Candidate],
    loads: LoadVectors,
    request_pages: int,
    settings: CostSettings,
    rng: random.Random,
    hints: Mapping[Any, float] | None = None,
) -> list[Ranked]:
    """The answer's workers, best first: every matched one plus the `top_k` best of the others
    (with temperature, the drawn pick first)."""
    if not keys:
        return []
    salt = rng.getrandbits(64)
    scale = float(settings.prefill_load_scale)
    cost = _cost_vector(loads, matched, request_pages, scale, slots) if loads.any or settings.temperature else None
    others = _others(keys, slots, matched, cost, settings.top_k, salt, rng)
    out = []
    for wi in [*matched, *others]:
        key = keys[wi]
        got = matched.get(wi)
        c = float(cost[wi]) if cost is not None else scale * max(request_pages - (got.credit if got else 0.0), 0.0)
        out.append(Ranked(wi, key, c, _hint(hints, key), got))
    if settings.policy == "cost":
        out.sort(key=lambda r: (r.cost, _tb(r.wi, salt)))
    else:
        load_of = _load_term(loads, scale)
        out.sort(key=lambda r: (-(r.match.credit if r.match else 0.0), load_of(r.wi), r.hint, _tb(r.wi, salt)))
    if settings.temperature and cost is not None:
        _draw_first(out, keys, cost, slots, matched, settings.temperature, rng)
    return out


def _cost_vector(
    loads: LoadVectors, matched: Mapping[int, Candidate], request_pages: int, scale: float, slots: WorkerSlots
) -> np.ndarray:
    n = len(slots.alive)
    credit = np.zeros(n)
    for wi, m in matched.items():
        credit[wi] = m.credit
    if len(loads.prefill) == n:
        cost = scale * np.maximum(loads.prefill + (request_pages - credit), 0.0) + loads.decode
    else:  # no load vectors for these slots yet
        cost = scale * np.maximum(request_pages - credit, 0.0)
    cost[~slots.alive] = np.inf
    return cost


def _others(
    keys: Mapping[int, WorkerKey],
    slots: WorkerSlots,
    matched: Mapping[int, Candidate],
    cost: np.ndarray | None,
    k: int,
    salt: int,
    rng: random.Random,
) -> list[int]:
    """The workers among the k lowest-cost ones that did not match (ties in the request's random order)."""
    k = min(k, len(keys))
    if cost is None:  # no loads: a match costs less than any other worker, and those all cost the same
        want = min(k - len(matched), len(keys) - len(matched))
        if want <= 0:
            return []
        pick = rng.sample(slots.live, min(len(slots.live), want + len(matched)))  # O(k), not O(fleet)
        return [wi for wi in pick if wi not in matched][:want]
    part = np.argpartition(cost, k - 1)[:k]
    thr = cost[part].max()
    below = np.flatnonzero(cost < thr)
    ties = np.flatnonzero(cost == thr)
    need = k - len(below)
    if len(ties) > need:
        tb = ((ties.astype(np.uint64) + np.uint64(1)) ^ np.uint64(salt)) * _MIX_U
        ties = ties[np.argpartition(tb, need - 1)[:need]] if need > 0 else ties[:0]
    return [wi for wi in (*below.tolist(), *ties.tolist()) if wi not in matched]


def _draw_first(
    out: list[Ranked],
    keys: Mapping[int, WorkerKey],
    cost: np.ndarray,
    slots: WorkerSlots,
    matched: Mapping[int, Candidate],
    temperature: float,
    rng: random.Random,
) -> None:
    """Move a pick drawn by softmax(-normalised cost / temperature) to the front (added if absent)."""
    live = slots.live
    c = cost[live]
    lo, hi = float(c.min()), float(c.max())
    norm = (c - lo) / (hi - lo) if hi > lo and math.isfinite(hi) else np.zeros(len(c))
    w = np.exp(-(norm - norm.min()) / temperature)
    pick = live[_draw(w, rng)]
    for i, r in enumerate(out):
        if r.wi == pick:
            out.insert(0, out.pop(i))
            return
    out.insert(0, Ranked(pick, keys[pick], float(cost[pick]), 0.0, matched.get(pick)))


def _draw(weights: np.ndarray, rng: random.Random) -> int:
    cum = np.cumsum(weights)
    return int(min(np.searchsorted(cum, rng.random() * cum[-1], side="right"), len(cum) - 1))


def _load_term(loads: LoadVectors, scale: float) -> Callable[[int], float]:
    n = len(loads.prefill)

    def load_of(wi: int) -> float:
        return float(scale * loads.prefill[wi] + loads.decode[wi]) if wi < n else 0.0

    return load_of


def _hint(hints: Mapping[Any, float] | None, key: WorkerKey) -> float:
    if not hints:
        return 0.0
    got = hints.get(key)
    return float(got if got is not None else hints.get(key.label, 0.0))


def _tb(wi: int, salt: int) -> int:
    """The request's random tie order of worker index wi (the same formula as the vector path)."""
    return (((wi + 1) ^ salt) * _MIX) & _M64
