"""Workers' load for the cost model: the newest of three sources per worker, as vectors by worker index.

Sources (README, "Load"): `request` (the /score body's `loads`), `metrics` (the engines'
Prometheus pages, scraped by kvevents.consumers.scraper) and `inflight` (the router's own count of
the requests it proxies, `RouterService.set_inflight_source`). The newest wins per worker; a
request's and the in-flight counts are measured at the request, so they win over a scrape (the
request's own over the in-flight count, as the more specific). `LoadBoard` keeps the scraped
loads, thread-safe, and hands a request numpy vectors by the index's worker index, updated in
O(loads changed since the last request), rebuilt only when the workers change.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from kvevents.consumers.worker_key import WorkerKey

__all__ = ["LOAD_SOURCES", "WorkerLoad", "LoadVectors", "LoadBoard"]

#: Where a worker's load came from, in the answer's `load_source` (None: no load known).
LOAD_SOURCES: tuple[str, ...] = ("request", "metrics", "inflight")
_CODE = {name: i + 1 for i, name in enumerate(LOAD_SOURCES)}


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One worker's load: blocks still to prefill, blocks held by running requests, requests queued."""

    prefill_blocks: float
    decode_blocks: float
    queue: int | None
    at: float  # clock seconds when it was measured
    source: str  # one of LOAD_SOURCES


class LoadVectors:
    """Loads by worker index (`n` columns of `table`): prefill and decode blocks, queue (NaN:
    unknown), when measured (-inf: never) and the source code (0: none, else 1 + LOAD_SOURCES
    index), each row also a (contiguous) view by name; listed workers read back in one gather (`rows`)."""

    __slots__ = ("table", "prefill", "decode", "queue", "at", "source", "any")

    def __init__(self, n: int) -> None:
        table = np.zeros((5, n))
        table[2] = np.nan
        table[3] = -np.inf
        self.rebind(table, False)

    def rebind(self, table: np.ndarray, any_: bool) -> None:
        """Take `table` (rows: prefill, decode, queue, at, source) as these vectors."""
        self.table = table
        self.prefill, self.decode, self.queue, self.at, self.source = table
        self.any = any_  # a load is set for some worker (else every load term is 0)

    def set(self, wi: int, load: WorkerLoad) -> None:
        q = np.nan if load.queue is None else load.queue
        self.table[:, wi] = (load.prefill_blocks, load.decode_blocks, q, load.at, _CODE[load.source])
        self.any = True

    def copy(self) -> LoadVectors:
        out = LoadVectors.__new__(LoadVectors)
        out.rebind(self.table.copy(), self.any)
        return out

    def with_loads(self, loads: Iterable[tuple[int, WorkerLoad]]) -> LoadVectors:
        """These vectors with some workers' loads replaced (a copy; self when there are none)."""
        out: LoadVectors | None = None
        for wi, load in loads:
            if out is None:
                out = self.copy()
            out.set(wi, load)
        return self if out is None else out

    def rows(self, wis: list[int]) -> list[list[float]]:
        """[prefill, decode, queue, at, source code] of each listed worker, in one gather."""
        return self.table.take(wis, axis=1).T.tolist()  # type: ignore[no-any-return]

    def source_name(self, wi: int) -> str | None:
        code = int(self.source[wi])
        return LOAD_SOURCES[code - 1] if code else None

    def queue_of(self, wi: int) -> int | None:
        q = float(self.queue[wi])
        return None if math.isnan(q) else int(q)


class LoadBoard:
    """The scraped (pushed) loads, newest per worker; `vectors()` serves a request's ranking.

    `put` may be called from any thread; `vectors` from one at a time (the service calls it under
    its index lock, so the worker indices it is given stay valid while the request uses them).
    """

    def __init__(self, clock: Callable[[], float], stale_after_s: float = 5.0) -> None:
        if not stale_after_s > 0:
            raise ValueError(f"load stale_after_s must be > 0, got {stale_after_s!r}")
        self.clock = clock
        self.stale_after_s = float(stale_after_s)
        self._lock = threading.Lock()
        self._loads: dict[WorkerKey, WorkerLoad] = {}
        self._pending: dict[WorkerKey, WorkerLoad] = {}
        self.expected: frozenset[str] = frozenset()  # sources whose load is scraped: none yet means stale
        self._keys: Mapping[int, WorkerKey] | None = None
        self._by_key: dict[WorkerKey, int] = {}
        self._vec = LoadVectors(0)

    def expect(self, source: str) -> None:
        """`source`'s load is scraped: until one arrives (and once it is old) its workers' loads are stale."""
        with self._lock:
            self.expected = self.expected | {source}

    def put(self, key: WorkerKey, load: WorkerLoad) -> bool:
        """Record a load unless a newer one is held for that worker; True if recorded."""
        with self._lock:
            held = self._loads.get(key)
            if held is not None and held.at > load.at:
                return False
            self._loads[key] = load
            self._pending[key] = load
            return True

    def get(self, key: WorkerKey) -> WorkerLoad | None:
        with self._lock:
            return self._loads.get(key)

    def snapshot(self) -> dict[WorkerKey, WorkerLoad]:
        with self._lock:
            return dict(self._loads)

    def index_of(self, key: WorkerKey) -> int | None:
        """The worker index of `key` in the mapping the last `vectors` call was given."""
        return self._by_key.get(key)

    def vectors(self, keys: Mapping[int, WorkerKey]) -> LoadVectors:
        """The loads by worker index of `keys` (BlockIndex.keys_by_index: the same object until the
        workers change, which rebuilds; otherwise only the loads put since the last call are written)."""
        with self._lock:
            if keys is not self._keys:
                self._keys = keys
                self._by_key = {k: wi for wi, k in keys.items()}
                self._vec = LoadVectors(max(keys, default=-1) + 1)
                pending: Iterable[tuple[WorkerKey, WorkerLoad]] = self._loads.items()
            else:
                pending = self._pending.items()
            for key, load in pending:
                wi = self._by_key.get(key)
                if wi is not None:
                    self._vec.set(wi, load)
            self._pending = {}
            return self._vec

    def stale(self, vec: LoadVectors, wi: int, key: WorkerKey, now: float) -> bool:
        """Is this worker's load older than the bound (or missing while its source is scraped)? O(1)."""
        at = float(vec.at[wi])
        if at == -math.inf:
            return key.source in self.expected
        return now - at > self.stale_after_s

    def age(self, vec: LoadVectors, wi: int, now: float) -> float | None:
        at = float(vec.at[wi])
        return None if at == -math.inf else max(0.0, now - at)
