"""The POST /score answer: a request's pages -> matched prefixes (index + predictions) -> loads ->
ranking by cost (kvevents.consumers.cost) -> the JSON object, and the routing decision's credit.

The request's pages are hashed outside the index lock; the lookup, the predictions, the load
vectors and the ranking run inside it (a few tens of microseconds), so the worker indices they
share stay valid. A /score call is a routing decision (README, "How /score routes"): unless the
body says `"route": false`, the pick (`workers[0]`) is credited the request's whole pages as
predicted copies (kvevents.consumers.predictions).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from kvevents.consumers.cost import Candidate, CostSettings, Ranked, WorkerSlots, rank_workers
from kvevents.consumers.loads import LoadBoard, LoadVectors, WorkerLoad
from kvevents.consumers.predictions import PredictedBlocks
from kvevents.consumers.table import as_hashes
from kvevents.consumers.worker_key import WorkerKey

if TYPE_CHECKING:  # pragma: no cover
    from kvevents.consumers.service.core import RouterService

__all__ = ["Scorer", "InflightSource", "RoutingOptions"]

#: The router's own in-flight count per worker (prefill blocks, decode blocks), e.g. from its proxy.
InflightSource = Callable[[], Mapping[WorkerKey, tuple[int, int]]]
_EWMA = 0.05  # weight of each request in the mean request size


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

    def __init__(self, service: RouterService, settings: CostSettings, loads: LoadBoard, predictions: PredictedBlocks, seed: int | None) -> None:  # fmt: skip
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

    def answer(self, req: Any, hashes: np.ndarray, pages: int, extra: dict[str, Any]) -> dict[str, Any]:
        """The 200 answer for a request whose page hashes are `hashes` (ValueError: a 400)."""
        hashes = as_hashes(hashes)
        settings = self.settings_for(req)
        given = _request_loads(req.loads, self.loads.clock()) if req.loads else ()
        source = self.inflight  # read outside the lock: the proxy's counts need not wait for the index
        inflight = source() if source is not None else None
        svc = self.service
        lora = req.lora_name
        with svc.lock:
            now = self.loads.clock()
            found = svc.router.match(hashes, lora)
            keys = svc.index.keys_by_index()
            slots = self.slots.of(keys)
            matched = self._candidates(found.workers, keys, hashes, lora, now)
            vec = self._vectors(keys, inflight, given, now)
            ranked = rank_workers(keys, slots, matched, vec, pages, settings, self._rng, svc.router.loads)
            if ranked and req.route:
                self.predictions.credit(ranked[0].key, hashes, lora, now)
            workers = [self._entry(r, vec, now, req.explain) for r in ranked]
        self._mean_pages = pages if self._mean_pages is None else (1 - _EWMA) * self._mean_pages + _EWMA * pages
        stale, any_stale = svc.freshness.read()
        for w in workers:
            w["stale"] = w["worker"] in stale
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

    def _candidates(
        self, found: Mapping[int, Any], keys: Mapping[int, WorkerKey], hashes: np.ndarray, lora: str | None, now: float
    ) -> dict[int, Candidate]:
        """Matched workers by index: the index's prefix, lengthened by predicted pages."""
        out = {wi: Candidate(m.pages, m.score, 0, m.score, m.pages_by_medium) for wi, m in found.items()}
        preds = self.predictions
        if not len(preds):
            return out
        preds.expire(now)
        held = {keys[wi]: c.pages for wi, c in out.items()}
        longer = preds.extend(hashes, lora, held, now)
        if longer:
            gpu = float(self.service.router.medium_weights.get("GPU", 1.0))
            by_key = self.slots.by_key
            for key, run in longer.items():
                wi = by_key.get(key)
                if wi is None:
                    continue
                c = out.get(wi)
                if c is None:
                    c = out[wi] = Candidate(0, 0.0, 0, 0.0, {})
                c.predicted = run - c.pages
                c.credit = c.score + gpu * c.predicted
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

    def _entry(self, r: Ranked, vec: LoadVectors, now: float, explain: bool) -> dict[str, Any]:
        m = r.match
        wi = r.wi
        has = wi < len(vec.prefill)
        page_size = self.service.router.page_size
        entry: dict[str, Any] = {
            "worker": r.key.source,
            "dp_rank": r.key.dp_rank,
            "cost": round(r.cost, 6),
            "score": round(m.score, 6) if m else 0.0,
            "matched_pages": m.pages if m else 0,
            "matched_tokens": m.pages * page_size if m else 0,
            "overlap_blocks": m.pages + m.predicted if m else 0,
            "predicted_blocks": m.predicted if m else 0,
            "active_prefill_blocks": round(float(vec.prefill[wi]), 3) if has else 0.0,
            "active_decode_blocks": round(float(vec.decode[wi]), 3) if has else 0.0,
            "queue": vec.queue_of(wi) if has else None,
            "load": r.hint,
            "load_source": vec.source_name(wi) if has else None,
            "load_stale": self.loads.stale(vec, wi, r.key, now) if has else False,
        }
        if explain:
            entry["pages_by_medium"] = {str(k): v for k, v in m.pages_by_medium.items()} if m else {}
        return entry


def _request_loads(entries: Any, now: float) -> list[tuple[WorkerKey, WorkerLoad]]:
    """The body's `loads` (already validated by its decoder) as request-sourced loads."""
    return [
        (
            WorkerKey(e.worker, e.dp_rank),
            WorkerLoad(float(e.active_prefill_blocks), float(e.active_decode_blocks), e.queue, now, "request"),
        )
        for e in entries
    ]
