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
that did not (the rest are counted, not built): `rank_columns` works on arrays (the lookup's
columns), a few numpy calls plus one compiled sort of O(matched + top_k), and a few numpy passes over
the fleet when loads are known (none when no load is). Ties fall in a random order drawn per request.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvevents import native
from kvevents.consumers.loads import LoadVectors
from kvevents.consumers.worker_key import WorkerKey

__all__ = ["POLICIES", "CostSettings", "WorkerSlots", "Ranking", "rank_workers", "rank_columns", "tie_orders"]

POLICIES: tuple[str, ...] = ("cost", "prefix")
_MIX = 0x9E3779B97F4A7C15
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
        self.sources: list[str | None] = []  # per slot: its worker's source (None: no worker)
        self.dp_ranks: list[int] = []  # per slot: its worker's dp rank

    def of(self, keys: Mapping[int, WorkerKey]) -> WorkerSlots:
        if keys is not self._keys:
            self._keys = keys
            n = max(keys, default=-1) + 1
            self.alive = np.zeros(n, bool)
            self.live = sorted(keys)
            self.alive[self.live] = True
            self.dead = np.nonzero(~self.alive)[0]
            self.by_key = {k: wi for wi, k in keys.items()}
            self.sources = [None] * n
            self.dp_ranks = [0] * n
            for wi, k in keys.items():
                self.sources[wi], self.dp_ranks[wi] = k.source, k.dp_rank
        return self


@dataclass(slots=True)
class Ranking:
    """The answer's workers best first, as columns: worker index, cost, and each row's position among
    the ranked inputs (the credited workers, then the others; -1: a drawn pick that was neither)."""

    worker: np.ndarray  # int64
    cost: np.ndarray  # float64
    at: np.ndarray  # intp
    salt: int = 0  # the request's tie salt

    @classmethod
    def empty(cls) -> Ranking:
        return cls(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.intp))

    def ties(self) -> np.ndarray:
        """Each row's tie order (the request's random order of equals; 0 for a drawn pick added)."""
        return np.where(self.at >= 0, tie_orders(self.worker, self.salt), np.uint64(0))

    def rows(self) -> list[tuple[float, int, int]]:
        """(cost, tie order, worker index) per row, best first."""
        return list(zip(self.cost.tolist(), self.ties().tolist(), self.worker.tolist()))


def tie_orders(workers: np.ndarray, salt: int) -> np.ndarray:
    """Per worker index its tie order under `salt`: ((wi + 1) ^ salt) * _MIX mod 2**64, distinct per worker."""
    return ((workers.astype(np.uint64) + np.uint64(1)) ^ np.uint64(salt)) * _MIX_U


def _cost_order(costs: np.ndarray, listed: np.ndarray, salt: int) -> np.ndarray:
    """The rows' order by (cost, tie order): one compiled sort, else numpy's lexsort of the two."""
    if native.active():
        return np.frombuffer(native.cost_order(costs, listed, salt), np.intp)
    return np.lexsort((tie_orders(listed, salt), costs))


def _prefix_rank(listed: np.ndarray, have: np.ndarray, request_pages: int, scale: float, salt: int) -> Ranking:
    """rank_columns without loads or temperature, compiled: the costs, their order and the gather in one call."""
    raw = native.prefix_rank(have, listed, float(request_pages), scale, salt)
    n = len(raw) // 24
    return Ranking(
        np.frombuffer(raw, np.int64, n),
        np.frombuffer(raw, np.float64, n, 8 * n),
        np.frombuffer(raw, np.intp, n, 16 * n),
        salt,
    )


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
    """`rank_columns` of a credit mapping, as (cost, tie order, worker index) rows, best first."""
    wi = np.fromiter(credit, np.int64, len(credit))
    have = np.fromiter(credit.values(), np.float64, len(credit))
    return rank_columns(keys, slots, wi, have, loads, request_pages, settings, rng, hints).rows()


def rank_columns(
    keys: Mapping[int, WorkerKey],
    slots: WorkerSlots,
    credited: np.ndarray,
    credit: np.ndarray,
    loads: LoadVectors,
    request_pages: int,
    settings: CostSettings,
    rng: random.Random,
    hints: Mapping[Any, float] | None = None,
) -> Ranking:
    """The answer's workers best first: every worker with credit (it matched; `credited` int64 worker
    indices, distinct, `credit` their overlap credit: weighted matched + predicted pages) plus those
    of the `top_k` lowest-cost ones that did not (with temperature, the drawn pick first)."""
    if not keys:
        return Ranking.empty()
    salt = rng.getrandbits(64)
    scale = float(settings.prefill_load_scale)
    need_vector = loads.any or settings.temperature
    vector = _cost_vector(loads, credited, credit, request_pages, scale, slots) if need_vector else None
    others = _others(keys, slots, credited, vector, settings.top_k, salt, rng)
    listed = np.concatenate((credited, np.array(others, np.int64))) if others else credited
    have = np.concatenate((credit, np.zeros(len(others)))) if others else credit
    if vector is None and settings.policy == "cost" and native.active():
        return _prefix_rank(listed, have, request_pages, scale, salt)  # no loads: one compiled call
    if vector is not None:
        costs = vector.take(listed)
    else:  # the tie order: the request's random order of equals
        costs = np.maximum(float(request_pages) - have, 0.0) * scale
    if settings.policy == "cost":
        order = _cost_order(costs, listed, salt)
    else:
        hint = np.array([_hint(hints, keys[wi]) for wi in listed.tolist()]) if hints else np.zeros(len(listed))
        order = np.lexsort((tie_orders(listed, salt), hint, _load_terms(loads, scale, listed), -have))
    out = Ranking(listed[order], costs[order], order, salt)
    if settings.temperature and vector is not None:
        out = _draw_first(out, vector, slots, settings.temperature, rng)
    return out


def _cost_vector(
    loads: LoadVectors, credited: np.ndarray, credit: np.ndarray, request_pages: int, scale: float, slots: WorkerSlots
) -> np.ndarray:
    """Every worker slot's cost (dead slots: infinite)."""
    n = len(slots.alive)
    have = np.zeros(n)
    if len(credited):
        have[credited] = credit
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
    credited: np.ndarray,
    cost: np.ndarray | None,
    k: int,
    salt: int,
    rng: random.Random,
) -> list[int]:
    """The workers among the k lowest-cost ones that did not match (ties in the request's random order)."""
    k = min(k, len(keys))
    if cost is None:  # no loads: a match costs less than any other worker, and those all cost the same
        want = min(k - len(credited), len(keys) - len(credited))
        if want <= 0:
            return []
        return _spread(slots.live, want, set(credited.tolist()), salt)
    part = np.argpartition(cost, k - 1)[:k]
    thr = cost[part].max()
    if np.count_nonzero(cost <= thr) > k:  # equals at the cut: take them in the request's random order
        below = np.nonzero(cost < thr)[0]
        ties = np.nonzero(cost == thr)[0]
        need = k - len(below)
        tb = ((ties.astype(np.uint64) + np.uint64(1)) ^ np.uint64(salt)) * _MIX_U
        ties = ties[np.argpartition(tb, need - 1)[:need]] if need > 0 else ties[:0]
        part = np.concatenate((below, ties))
    matched = set(credited.tolist())
    return [wi for wi in part.tolist() if wi not in matched]


def _spread(live: list[int], want: int, skip: set[int], salt: int) -> list[int]:
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


def _draw_first(out: Ranking, cost: np.ndarray, slots: WorkerSlots, temperature: float, rng: random.Random) -> Ranking:
    """The ranking with a pick drawn by softmax(-normalised cost / temperature) first (added if absent)."""
    live = slots.live
    c = cost[live]
    lo, hi = float(c.min()), float(c.max())
    norm = (c - lo) / (hi - lo) if hi > lo and math.isfinite(hi) else np.zeros(len(c))
    pick = live[_draw(np.exp(-norm / temperature), rng)]
    found = np.flatnonzero(out.worker == pick)
    if len(found):
        i = int(found[0])
        order = np.concatenate(([i], np.arange(i), np.arange(i + 1, len(out.worker))))
        return Ranking(out.worker[order], out.cost[order], out.at[order], out.salt)
    return Ranking(
        np.concatenate(([pick], out.worker)).astype(np.int64),
        np.concatenate(([float(cost[pick])], out.cost)),
        np.concatenate((np.array([-1], np.intp), out.at)),
        out.salt,
    )


def _draw(weights: np.ndarray, rng: random.Random) -> int:
    cum = np.cumsum(weights)
    return int(min(np.searchsorted(cum, rng.random() * cum[-1], side="right"), len(cum) - 1))


def _load_terms(loads: LoadVectors, scale: float, listed: np.ndarray) -> np.ndarray:
    """Per listed worker `scale * prefill + decode` (0 for a worker beyond the load vectors)."""
    n = len(loads.prefill)
    out = np.zeros(len(listed))
    inside = listed < n
    at = listed[inside]
    out[inside] = scale * loads.prefill[at] + loads.decode[at]
    return out


def _hint(hints: Mapping[Any, float] | None, key: WorkerKey) -> float:
    if not hints:
        return 0.0
    got = hints.get(key)
    return float(got if got is not None else hints.get(key.label, 0.0))
