"""The POST /score answer: a request's pages -> matched prefixes (index + predictions) -> loads ->
ranking by cost (kvevents.consumers.cost) -> the JSON object, and the routing decision's credit.

A token list's pages, and packed ids past FUSED_MAX_BYTES, are hashed outside the index lock; the
lookup, the predictions, the load vectors and the ranking run inside it (a few tens of microseconds),
so the worker indices they share stay valid. Packed ids up to FUSED_MAX_BYTES (a /score body's, as
the HTTP front decodes it) are hashed inside it, page by page as the compiled walk reads them
(PrefixRouter.match_packed): the SHA-256 chain and the table reads then overlap, and the lock is held
for that request's hashing too (~85 ns a page: 90 us at the cap). The GIL is held throughout either
way, so another Python thread waits as long. A /score call is a routing decision (README, "How /score routes"): unless the
body says `"route": false`, the pick (`workers[0]`) is credited the request's whole pages as
predicted copies (kvevents.consumers.predictions).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from kvevents.consumers.cost import CostSettings, Ranking, WorkerSlots, rank_columns
from kvevents.consumers.loads import LOAD_SOURCES, LoadBoard, LoadVectors, WorkerLoad
from kvevents.consumers.lookup import MatchColumns, WorkerMatch
from kvevents.consumers.predictions import PredictedBlocks
from kvevents.consumers.service.answer_rows import answer_rows
from kvevents.consumers.service.seams import InflightSource, ScoringService
from kvevents.consumers.table import as_hashes
from kvevents.consumers.worker_key import WorkerKey

__all__ = ["FUSED_MAX_BYTES", "Scorer", "InflightSource", "RoutingOptions"]

#: The router's own in-flight count per worker (prefill blocks, decode blocks), e.g. from its proxy.
_EWMA = 0.05  # weight of each request in the mean request size
#: Packed ids up to this many bytes (16,384 tokens) are hashed inside the lock, as the walk reads them.
FUSED_MAX_BYTES = 1 << 16
_NEVER = -float("inf")  # LoadVectors.at of a worker with no load


@dataclass(frozen=True)
class RoutingOptions:
    """How `kvevents route` ranks and where its loads come from (README, "Cost and load")."""

    cost: CostSettings = field(default_factory=CostSettings)
    predicted_ttl_s: float = 2.0  # route --predicted-ttl (0: no predictions)
    load_stale_after_s: float = 5.0  # route --load-stale-after
    metrics_urls: Mapping[str, str] = field(default_factory=dict)  # route --metrics-url NAME=URL
    scrape_interval_s: float = 1.0
    scrape_timeout_s: float = 2.0


class Scorer:
    """Builds /score answers for one RouterService (its index, router, loads and predictions)."""

    def __init__(self, service: ScoringService, settings: CostSettings, loads: LoadBoard, predictions: PredictedBlocks, seed: int | None) -> None:  # fmt: skip
        self.service = service
        self.settings = settings
        self.loads = loads
        self.predictions = predictions
        self.inflight: InflightSource | None = None
        self.slots = WorkerSlots()
        self._rng = random.Random(seed)
        self._mean_pages: float | None = None

    def mean_request_pages(self) -> float:
        """The running mean of the whole pages of the requests scored (0 before the first)."""
        return self._mean_pages or 0.0

    def settings_for(self, req: Any) -> CostSettings:
        """The server's settings with the request's overrides (policy, scale, temperature, top_k)."""
        s = self.settings
        policy, scale, temp, top_k = req.policy, req.prefill_load_scale, req.temperature, req.top_k
        if policy is None and scale is None and temp is None and (top_k is None or top_k == s.top_k):
            return s
        return CostSettings(
            policy=s.policy if policy is None else policy,
            prefill_load_scale=s.prefill_load_scale if scale is None else float(scale),
            temperature=s.temperature if temp is None else float(temp),
            top_k=s.top_k if top_k is None else top_k,
        )

    def answer(
        self, req: Any, hashes: np.ndarray | None, pages: int, extra: dict[str, Any], packed: bytes | None = None
    ) -> dict[str, Any]:
        """The 200 answer for a request whose page hashes are `hashes` (ValueError: a 400), or with
        `hashes` None, whose packed ids are `packed` (hashed inside the lock: module docstring)."""
        if packed is None:
            hashes = as_hashes(hashes)
        settings = self.settings_for(req)
        given = _request_loads(req.loads, self.loads.clock()) if req.loads else ()
        source = self.inflight  # read outside the lock: the proxy's counts need not wait for the index
        inflight = source() if source is not None else None
        svc = self.service
        lora = req.lora_name
        with svc.lock:
            now = self.loads.clock()
            if packed is not None:
                hashes, found = svc.router.match_packed(packed, req.cache_salt, lora)
            else:
                found = svc.router.match_columns(cast(np.ndarray, hashes), lora)
            hashes = cast(np.ndarray, hashes)
            keys = svc.index.keys_by_index()
            slots = self.slots.of(keys)
            predicted = self._predicted(found, keys, hashes, lora, now)
            credited, credit = found.worker, found.score
            if predicted:
                gpu = float(svc.router.medium_weights.get("GPU", 1.0))
                credited, credit = _with_predicted(found, predicted, gpu)
            vec = self._vectors(keys, inflight, given, now)
            ranking = rank_columns(keys, slots, credited, credit, vec, pages, settings, self._rng, svc.router.loads)
            if len(ranking.worker) and req.route:
                self.predictions.credit(keys[int(ranking.worker[0])], hashes, lora, now)
            stale, any_stale = svc.freshness.read()
            explained = svc.router.match(hashes, lora).workers if req.explain else None
            workers = self._entries(ranking, keys, found, predicted, vec, now, stale, explained)
        self._mean_pages = pages if self._mean_pages is None else (1 - _EWMA) * self._mean_pages + _EWMA * pages
        first = workers[0] if workers else None
        best = first if first is not None and first["overlap_blocks"] else None
        return {
            "pages": pages,
            "page_size": svc.router.page_size,
            "policy": settings.policy,
            "best": best["worker"] if best else None,
            "best_dp_rank": best["dp_rank"] if best else None,
            "pick": first["worker"] if first else None,
            "pick_dp_rank": first["dp_rank"] if first else None,
            "routed": bool(first) and req.route,
            "stale": any_stale,
            "workers": workers,
            "workers_total": len(keys),
            **extra,
        }

    def _predicted(
        self, found: MatchColumns, keys: Mapping[int, WorkerKey], hashes: np.ndarray, lora: str | None, now: float
    ) -> dict[int, int]:
        """Worker index -> predicted pages continuing its prefix (beyond what the index holds)."""
        preds = self.predictions
        if not len(preds):
            return {}
        preds.expire(now)
        held = {keys[wi]: n for wi, n in zip(found.worker.tolist(), found.matched.tolist())}
        by_key = self.slots.by_key
        out: dict[int, int] = {}
        for key, run in preds.extend(hashes, lora, held, now).items():
            wi = by_key.get(key)
            if wi is not None:
                out[wi] = run - held.get(key, 0)
        return out

    def _vectors(
        self,
        keys: Mapping[int, WorkerKey],
        inflight: Mapping[WorkerKey, tuple[int, int]] | None,
        given: tuple[tuple[WorkerKey, WorkerLoad], ...] | list[tuple[WorkerKey, WorkerLoad]],
        now: float,
    ) -> LoadVectors:
        """Scraped loads, then the in-flight counts, then the request's own (newest wins: the last two are now)."""
        vec = self.loads.vectors(keys)
        by_key = self.slots.by_key
        over: list[tuple[int, WorkerLoad]] = []
        if inflight:
            for key, (prefill, decode) in inflight.items():
                wi = by_key.get(key)
                if wi is not None:
                    old = self.loads.get(key)
                    over.append(
                        (wi, WorkerLoad(float(prefill), float(decode), old.queue if old else None, now, "inflight"))
                    )
        for key, load in given:
            wi = by_key.get(key)
            if wi is not None:
                over.append((wi, load))
        return vec.with_loads(over)

    def _entries(
        self,
        ranking: Ranking,
        keys: Mapping[int, WorkerKey],
        found: MatchColumns,
        predicted: Mapping[int, int],
        vec: LoadVectors,
        now: float,
        publisher_stale: frozenset[str],
        explained: Mapping[int, WorkerMatch] | None,
    ) -> list[dict[str, Any]]:
        """The answer's worker objects (kvevents.consumers.service.answer_rows): the fields that vary
        only with loads, hints, publisher staleness or `explain` are gathered for the listed workers."""
        expected, hints = self.loads.expected, self.service.router.loads
        needed = vec.any or expected or hints or publisher_stale or explained is not None or predicted
        wis = ranking.worker.tolist() if needed else []
        sources = self.slots.sources
        extra: dict[str, list[Any]] = {}
        if vec.any and len(vec.prefill) > 0:
            extra.update(self._load_columns(vec, wis, now))
        elif expected:
            extra["load_stale"] = [sources[wi] in expected for wi in wis]
        if hints:
            extra["load"] = [_hint(hints, keys[wi]) for wi in wis]
        if publisher_stale:
            extra["stale"] = [sources[wi] in publisher_stale for wi in wis]
        if explained is not None:
            extra["pages_by_medium"] = [
                {str(k): v for k, v in explained[wi].pages_by_medium.items()} if wi in explained else {} for wi in wis
            ]
        more = np.array([predicted.get(wi, 0) for wi in wis], np.int64) if predicted else None
        return answer_rows(ranking, found, self.slots, more, self.service.router.page_size, extra)

    def _load_columns(self, vec: LoadVectors, wis: list[int], now: float) -> dict[str, list[Any]]:
        """The listed workers' load fields, read in one gather (a load older than the bound is stale;
        a worker never measured is stale when its source is expected to report)."""
        expected, bound, sources = self.loads.expected, self.loads.stale_after_s, self.slots.sources
        pre, dec, queue, source, stale = [], [], [], [], []
        for wi, (p, d, q, at, code) in zip(wis, vec.rows(wis)):
            pre.append(p)
            dec.append(d)
            queue.append(None if q != q else int(q))
            source.append(LOAD_SOURCES[int(code) - 1] if code else None)
            stale.append(now - at > bound if at != _NEVER else sources[wi] in expected)
        return {
            "active_prefill_blocks": pre,
            "active_decode_blocks": dec,
            "queue": queue,
            "load_source": source,
            "load_stale": stale,
        }


def _with_predicted(found: MatchColumns, predicted: Mapping[int, int], gpu: float) -> tuple[np.ndarray, np.ndarray]:
    """The credited workers and their credit: the matched ones' scores plus predicted pages at the GPU
    weight, then the workers credited by predictions alone."""
    at = {wi: i for i, wi in enumerate(found.worker.tolist())}
    credit = found.score.copy()
    new_wi, new_credit = [], []
    for wi, pages in predicted.items():
        i = at.get(wi)
        if i is None:
            new_wi.append(wi)
            new_credit.append(0.0 + gpu * pages)
        else:
            credit[i] = float(credit[i]) + gpu * pages
    if not new_wi:
        return found.worker, credit
    return np.concatenate((found.worker, np.array(new_wi, np.int64))), np.concatenate((credit, new_credit))


def _request_loads(entries: Any, now: float) -> list[tuple[WorkerKey, WorkerLoad]]:
    """The body's `loads` (already validated by its decoder) as request-sourced loads."""
    return [
        (
            WorkerKey(e.worker, e.dp_rank),
            WorkerLoad(float(e.active_prefill_blocks), float(e.active_decode_blocks), e.queue, now, "request"),
        )
        for e in entries
    ]


def _hint(hints: Mapping[Any, float], key: WorkerKey) -> float:
    """The caller's load hint (PrefixRouter.set_load) by key, else by display label, else 0."""
    got = hints.get(key)
    return float(got if got is not None else hints.get(key.label, 0.0))
