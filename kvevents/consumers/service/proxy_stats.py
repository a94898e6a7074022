"""What the proxy counts per worker: its in-flight blocks (the router's own load figure) and its
requests, errors and times to first byte (for /metrics and the status page).

In flight: a proxied request adds its prefill blocks (its pages the worker does not hold yet) and
its decode blocks (all its pages: what it holds in KV while it decodes) to its worker when it is
sent; the prefill blocks leave at the answer's first byte (prefill is over once a token comes), the
decode blocks when the answer ends. Requests are counted one by one, not by shared prefix.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvevents.consumers.worker_key import WorkerKey

__all__ = ["InflightBook", "ProxyStats", "Ticket", "RATE_WINDOW_S", "TTFB_SAMPLES"]

RATE_WINDOW_S = 60  # requests per second are counted over the last minute
TTFB_SAMPLES = 1024  # the status page's p50/p99 of the last this many answers per worker


class Ticket:
    """One request's blocks on one worker: `first_byte()` then `end()` (each once; end implies both)."""

    __slots__ = ("key", "prefill", "decode", "_book", "_prefilling", "_open")

    def __init__(self, book: InflightBook, key: WorkerKey, prefill: int, decode: int) -> None:
        self.key, self.prefill, self.decode = key, prefill, decode
        self._book = book
        self._prefilling = self._open = True

    def first_byte(self) -> None:
        if self._prefilling:
            self._prefilling = False
            self._book.take(self.key, self.prefill, 0, 0)

    def end(self) -> None:
        if self._open:
            self._open = False
            self._book.take(self.key, self.prefill if self._prefilling else 0, self.decode, 1)
            self._prefilling = False


class InflightBook:
    """Per worker: (prefill_blocks, decode_blocks, requests) in flight. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._load: dict[WorkerKey, list[int]] = {}

    def begin(self, key: WorkerKey, prefill: int, decode: int) -> Ticket:
        with self._lock:
            cur = self._load.setdefault(key, [0, 0, 0])
            cur[0] += prefill
            cur[1] += decode
            cur[2] += 1
        return Ticket(self, key, prefill, decode)

    def take(self, key: WorkerKey, prefill: int, decode: int, requests: int) -> None:
        with self._lock:
            cur = self._load[key]
            cur[0] -= prefill
            cur[1] -= decode
            cur[2] -= requests

    def blocks(self) -> dict[WorkerKey, tuple[int, int]]:
        """(prefill_blocks, decode_blocks) of every worker the proxy has sent to (zeros included)."""
        with self._lock:
            return {k: (v[0], v[1]) for k, v in self._load.items()}

    def requests(self) -> dict[WorkerKey, int]:
        with self._lock:
            return {k: v[2] for k, v in self._load.items()}

    def total(self, key: WorkerKey) -> int:
        """prefill + decode blocks in flight on `key` (0 if none)."""
        with self._lock:
            cur = self._load.get(key)
            return 0 if cur is None else cur[0] + cur[1]


@dataclass
class _Worker:
    url: str
    answers: Counter[str] = field(default_factory=Counter)  # status class (2xx, 4xx, 5xx) -> answers
    errors: Counter[str] = field(default_factory=Counter)  # connect, timeout, stream, ... -> count
    seconds: deque[list[int]] = field(default_factory=deque)  # [unix second, requests sent]
    ttfb: deque[float] = field(default_factory=lambda: deque(maxlen=TTFB_SAMPLES))
    sent: int = 0


class ProxyStats:
    """Requests sent, answers by status class, errors by kind, times to first byte, per worker."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._workers: dict[WorkerKey, _Worker] = {}
        self.retries = 0  # attempts after a first one failed to connect
        self.unscored: Counter[str] = Counter()  # requests routed by load only, by why
        self.started_at = clock()

    def _get(self, key: WorkerKey, url: str) -> _Worker:
        w = self._workers.get(key)
        if w is None:
            w = self._workers[key] = _Worker(url)
        return w

    def sent(self, key: WorkerKey, url: str, retry: bool) -> None:
        now = int(self.clock())
        with self._lock:
            w = self._get(key, url)
            w.sent += 1
            if w.seconds and w.seconds[-1][0] == now:
                w.seconds[-1][1] += 1
            else:
                w.seconds.append([now, 1])
                while w.seconds and w.seconds[0][0] <= now - RATE_WINDOW_S:
                    w.seconds.popleft()
            self.retries += 1 if retry else 0

    def answered(self, key: WorkerKey, url: str, status: int, ttfb_s: float) -> None:
        with self._lock:
            w = self._get(key, url)
            w.answers[f"{status // 100}xx"] += 1
            w.ttfb.append(ttfb_s)

    def failed(self, key: WorkerKey, url: str, kind: str) -> None:
        with self._lock:
            self._get(key, url).errors[kind] += 1

    def routed_by_load(self, why: str) -> None:
        with self._lock:
            self.unscored[why] += 1

    def counters(self) -> dict[WorkerKey, dict[str, Any]]:
        """Per worker: sent, answers by status class, errors by kind (cumulative, for /metrics)."""
        with self._lock:
            return {
                k: {"sent": w.sent, "answers": dict(w.answers), "errors": dict(w.errors)}
                for k, w in self._workers.items()
            }

    def view(self, inflight: dict[WorkerKey, tuple[int, int]], requests: dict[WorkerKey, int]) -> list[dict[str, Any]]:
        """The status page's rows: rates over the last minute and TTFB p50/p99 of the last answers."""
        now = int(self.clock())
        span = max(1, min(RATE_WINDOW_S, now - int(self.started_at)))
        out = []
        with self._lock:
            for key in sorted(self._workers):
                w = self._workers[key]
                recent = sum(n for sec, n in w.seconds if sec > now - RATE_WINDOW_S)
                samples = sorted(w.ttfb)
                prefill, decode = inflight.get(key, (0, 0))
                out.append(
                    {
                        "worker": key.source,
                        "dp_rank": key.dp_rank,
                        "url": w.url,
                        "requests_total": w.sent,
                        "rate_per_s": round(recent / span, 3),
                        "answers": dict(w.answers),
                        "errors": dict(w.errors),
                        "errors_total": sum(w.errors.values()),
                        "ttfb_p50_s": _quantile(samples, 0.50),
                        "ttfb_p99_s": _quantile(samples, 0.99),
                        "inflight_requests": requests.get(key, 0),
                        "prefill_blocks": prefill,
                        "decode_blocks": decode,
                    }
                )
        return out


def _quantile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 6)
