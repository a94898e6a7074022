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
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvevents.consumers.loads import LoadVectors
from kvevents.consumers.worker_key import WorkerKey

__all__ = ["POLICIES", "CostSettings", "WorkerSlots", "rank_workers"]

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


class WorkerSlots:
    """Per worker-index mapping (BlockIndex.keys_by_index, the same object until workers change):
    the live slots as a mask and a list, and key -> index, rebuilt only when the mapping changes."""

    def __init__(self) -> None:
        self._keys: Mapping[int, WorkerKey] | None = None
        self.alive = np.zeros(0, bool)
        self.dead = np.zeros(0, np.intp)  # slots of no worker (freed indices)
        self.live: list[int] = []
        self.by_key: dict[WorkerKey, int] = {}

    def of(self, keys: Mapping[int, WorkerKey]) -> WorkerSlots:
        if keys is not self._keys:
            self._keys = keys
            n = max(keys, default=-1) + 1
            self.alive = np.zeros(n, bool)
            self.live = sorted(keys)
            self.alive[self.live] = True
            self.dead = np.nonzero(~self.alive)[0]
            self.by_key = {k: wi for wi, k in keys.items()}
        return self


def rank_workers(
    keys: Mapping[int, WorkerKey],
    slots: WorkerSlots,
    credit: Mapping[int, float],
    loads: LoadVectors,
    request_pages: int,
    settings: CostSettings,
    rng: random.Random,
    hints: Mapping[Any, float] | None = None,
) -> list[tuple[float, int, int]]:
    """The answer's workers as (cost, tie order, worker index), best first: every worker with credit (it
    matched) plus those of the `top_k` lowest-cost ones that did not (with temperature, the drawn
    pick first). `credit`: worker index -> overlap credit (weighted matched + predicted pages)."""
    if not keys:
        return []
    salt = rng.getrandbits(64)
    scale = float(settings.prefill_load_scale)
    vector = _cost_vector(loads, credit, request_pages, scale, slots) if loads.any or settings.temperature else None
    listed = [*credit, *_others(keys, slots, credit, vector, settings.top_k, salt, rng)]
    if vector is not None:
        costs = vector.take(listed).tolist()
        rows = [(c, (((wi + 1) ^ salt) * _MIX) & _M64, wi) for c, wi in zip(costs, listed)]
    else:  # the tie order: the request's random order of equals
        full = float(request_pages)
        rows = [(scale * max(full - credit.get(wi, 0.0), 0.0), (((wi + 1) ^ salt) * _MIX) & _M64, wi) for wi in listed]
    if settings.policy == "cost":
        rows.sort()
    else:
        load_of = _load_term(loads, scale)
        rows.sort(key=lambda r: (-credit.get(r[2], 0.0), load_of(r[2]), _hint(hints, keys[r[2]]), r[1]))
    if settings.temperature and vector is not None:
        _draw_first(rows, vector, slots, settings.temperature, rng)
    return rows


def _cost_vector(
    loads: LoadVectors, credit: Mapping[int, float], request_pages: int, scale: float, slots: WorkerSlots
) -> np.ndarray:
    """Every worker slot's cost (dead slots: infinite)."""
    n = len(slots.alive)
    have = np.zeros(n)
    if credit:
        have[list(credit)] = list(credit.values())
    if len(loads.prefill) == n:
        cost = loads.prefill + float(request_pages)
        cost -= have
        np.maximum(cost, 0.0, out=cost)
        cost *= scale
        cost += loads.decode
    else:  # no load vectors for these slots yet
        cost = np.maximum(request_pages - have, 0.0) * scale
    if len(slots.dead):
        cost[slots.dead] = np.inf
    return cost


def _others(
    keys: Mapping[int, WorkerKey],
    slots: WorkerSlots,
    matched: Mapping[int, float],
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
        return _spread(slots.live, want, matched, salt)
    part = np.argpartition(cost, k - 1)[:k]
    thr = cost[part].max()
    if np.count_nonzero(cost <= thr) > k:  # equals at the cut: take them in the request's random order
        below = np.nonzero(cost < thr)[0]
        ties = np.nonzero(cost == thr)[0]
        need = k - len(below)
        tb = ((ties.astype(np.uint64) + np.uint64(1)) ^ np.uint64(salt)) * _MIX_U
        ties = ties[np.argpartition(tb, need - 1)[:need]] if need > 0 else ties[:0]
        part = np.concatenate((below, ties))
    return [wi for wi in part.tolist() if wi not in matched]


def _spread(live: list[int], want: int, skip: Mapping[int, float], salt: int) -> list[int]:
    """`want` distinct workers of `live` not in `skip`, in an order drawn from `salt`: a random start
    and a random step coprime with the fleet size visit every slot once, so this is O(want + skipped)."""
    n = len(live)
    start, step = salt % n, (salt >> 32) % n or 1
    while math.gcd(step, n) != 1:
        step += 1
    out: list[int] = []
    i = start
    for _ in range(n):
        wi = live[i]
        if wi not in skip:
            out.append(wi)
            if len(out) == want:
                break
        i = (i + step) % n
    return out


def _draw_first(
    out: list[tuple[float, int, int]], cost: np.ndarray, slots: WorkerSlots, temperature: float, rng: random.Random
) -> None:
    """Move a pick drawn by softmax(-normalised cost / temperature) to the front (added if absent)."""
    live = slots.live
    c = cost[live]
    lo, hi = float(c.min()), float(c.max())
    norm = (c - lo) / (hi - lo) if hi > lo and math.isfinite(hi) else np.zeros(len(c))
    pick = live[_draw(np.exp(-norm / temperature), rng)]
    for i, row in enumerate(out):
        if row[2] == pick:
            out.insert(0, out.pop(i))
            return
    out.insert(0, (float(cost[pick]), 0, pick))


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
