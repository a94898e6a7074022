"""Predicted block copies: a routed request's whole pages, credited to the worker it was sent to
until that engine's own events say so (or `ttl_s` passes).

Between a routing decision and the engine's BlockStored lie the request's queueing and prefill:
without a prediction, sibling requests arriving meanwhile (the same new system prompt) find no
cached prefix anywhere and spread over the fleet by ties. Predictions are kept apart from the
BlockIndex (they never show in /workers block counts, the copies metrics or `log index`): the
router adds them to a worker's matched prefix, at the GPU weight.

A prediction is the request's page chain (its int64 hashes, page 0 first), filed under its first
page, one per worker (a newer request routed there with the same first page replaces it: siblings
share their prefix, so the newest says as much): crediting one is O(1) whatever its length, and a
request finds the chains it shares page 0 with and measures each common prefix in one numpy compare. A chain goes when its engine stores
its last page (`confirm`, from the service's feed: the engine's copies have replaced it; pages
stored before that already count as the index's and the chain adds nothing for them), when its
worker resets, at expiry, or, past `max_pages` predicted in all, oldest first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kvevents.consumers.worker_key import WorkerKey

__all__ = ["PredictedBlocks"]

_PER_HEAD = 32  # workers with a chain under one (first page, lora_name): a hot prompt on many workers


class _Chain:
    __slots__ = ("key", "lora", "hashes", "until", "dead")

    def __init__(self, key: WorkerKey, lora: str | None, hashes: np.ndarray, until: float) -> None:
        self.key, self.lora, self.hashes, self.until, self.dead = key, lora, hashes, until, False


class PredictedBlocks:
    """Predicted page chains per worker; not thread-safe (the service holds its index lock)."""

    def __init__(self, ttl_s: float, clock: Callable[[], float], *, max_pages: int = 4_000_000) -> None:
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not 0 <= ttl_s <= 3600:
            raise ValueError(f"predicted ttl must be 0..3600 seconds, got {ttl_s!r}")
        if max_pages < 1:
            raise ValueError(f"max_pages must be >= 1, got {max_pages!r}")
        self.ttl_s = float(ttl_s)
        self.clock = clock
        self.max_pages = max_pages
        self._heads: dict[tuple[int, str | None], dict[WorkerKey, _Chain]] = {}
        self._tails: dict[tuple[int, str | None, WorkerKey], _Chain] = {}
        self._queue: deque[_Chain] = deque()  # oldest credit first (one ttl: also soonest to expire)
        self._per_worker: dict[WorkerKey, int] = {}
        self.pages = 0  # predicted copies held
        self.counters = {"credited": 0, "confirmed": 0, "expired": 0, "evicted": 0, "replaced": 0}

    def __len__(self) -> int:
        return self.pages

    def per_worker(self) -> dict[WorkerKey, int]:
        """Predicted copies held per worker (for /metrics)."""
        return dict(self._per_worker)

    def credit(self, key: WorkerKey, hashes: np.ndarray, lora_name: str | None, now: float | None = None) -> None:
        """Predict that `key` will hold these pages (a routed request's whole pages, page 0 first)."""
        n = len(hashes)
        if not self.ttl_s or not n:
            return
        now = self.clock() if now is None else now
        self.expire(now)
        tail = (int(hashes[n - 1]), lora_name, key)
        old = self._tails.get(tail)
        if old is not None:  # the same request routed to the same worker again
            self._remove(old, "replaced")
        head_key = (int(hashes[0]), lora_name)
        head = self._heads.get(head_key)
        if head is not None:
            old = head.get(key)
            if old is not None:  # a sibling routed there before: the newest chain stands for both
                self._remove(old, "replaced")
            elif len(head) >= _PER_HEAD:
                self._remove(next(iter(head.values())), "evicted")
        chain = _Chain(key, lora_name, hashes, now + self.ttl_s)
        self._heads.setdefault(head_key, {})[key] = chain
        self._tails[tail] = chain
        self._queue.append(chain)
        self._per_worker[key] = self._per_worker.get(key, 0) + n
        self.pages += n
        self.counters["credited"] += n
        while self.pages > self.max_pages and self._queue:
            oldest = self._queue.popleft()
            if not oldest.dead:
                self._remove(oldest, "evicted")

    def confirm(self, key: WorkerKey, hashes: Sequence[Any], lora_name: str | None) -> int:
        """The engine stored these pages for `key`: a chain whose last page is among them is
        replaced by the engine's own copies. Returns the predicted pages dropped."""
        if key not in self._per_worker:
            return 0
        gone = 0
        tails = self._tails
        for h in hashes:
            chain = tails.get((h, lora_name, key)) if type(h) is int else None
            if chain is not None:
                gone += len(chain.hashes)
                self._remove(chain, "confirmed")
        return gone

    def drop_worker(self, source: str, dp_rank: int | None = None) -> int:
        """Forget a worker's predictions (its source reset: only its engine's word counts now)."""
        doomed = [c for c in self._tails.values() if c.key.source == source and dp_rank in (None, c.key.dp_rank)]
        for c in doomed:
            self._remove(c, "expired")
        return sum(len(c.hashes) for c in doomed)

    def expire(self, now: float | None = None) -> None:
        """Drop every prediction past its expiry (O(expired))."""
        now = self.clock() if now is None else now
        q = self._queue
        while q and (q[0].dead or q[0].until <= now):
            c = q.popleft()
            if not c.dead:
                self._remove(c, "expired")

    def extend(
        self, hashes: np.ndarray, lora_name: str | None, matched: Mapping[WorkerKey, int], now: float
    ) -> dict[WorkerKey, int]:
        """Per worker whose prefix predictions lengthen: its prefix pages counting predicted ones.

        `matched`: the pages each worker holds by the index (a consecutive prefix of `hashes`); a
        predicted chain sharing the request's first pages runs the prefix on past them."""
        if not self._heads or not len(hashes):
            return {}
        chains = self._heads.get((int(hashes[0]), lora_name))
        if not chains:
            return {}
        out: dict[WorkerKey, int] = {}
        for key, c in chains.items():
            if c.until <= now:
                continue
            run = _common_prefix(hashes, c.hashes)
            if run > matched.get(key, 0):
                out[key] = run
        return out

    def _remove(self, chain: _Chain, why: str) -> None:
        if chain.dead:
            return
        chain.dead = True
        n = len(chain.hashes)
        head_key = (int(chain.hashes[0]), chain.lora)
        head = self._heads.get(head_key)
        if head is not None and head.get(chain.key) is chain:
            del head[chain.key]
            if not head:
                del self._heads[head_key]
        tail = (int(chain.hashes[n - 1]), chain.lora, chain.key)
        if self._tails.get(tail) is chain:
            del self._tails[tail]
        left = self._per_worker[chain.key] - n
        if left > 0:
            self._per_worker[chain.key] = left
        else:
            del self._per_worker[chain.key]
        self.pages -= n
        self.counters[why] += n

    def stats(self) -> dict[str, Any]:
        return {"pages": self.pages, "chains": len(self._tails), **self.counters}


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading pages two hash chains share."""
    m = min(len(a), len(b))
    if not m:
        return 0
    differ = np.flatnonzero(a[:m] != b[:m])
    return int(differ[0]) if len(differ) else m
