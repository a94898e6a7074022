"""A RouterService fed by the test itself (the EventFeed protocol, kvevents.feed), so the order of
events and routing decisions is the test's: what an engine has stored when a request is routed.
Helpers for the cost, load and prediction tests (tests/consumers/test_{cost,loads,predictions}.py)."""

from __future__ import annotations

import json
from typing import Any

from kvevents.consumers.service.core import RouterService, RoutingOptions
from kvevents.events import BlockStored, KVEventBatch
from kvevents.feed import Delivery, Output, Reset, SourceStatus
from kvevents.hashing import Namespace, event_hashes_int64

PAGE = 4


class Clock:
    """An injectable monotonic clock: the test moves it."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class PushFeed:
    """Deliveries the test pushes, handed out by the next poll; every source always fresh."""

    def __init__(self, sources: list[str]) -> None:
        self.sources = sources
        self.items: list[Output] = []
        self.seq: dict[str, int] = {}
        self.stale: set[str] = set()

    def start(self) -> PushFeed:
        return self

    def stop(self) -> None:
        self.items = []

    def poll(self, timeout_s: float = 0.0) -> list[Output]:
        out, self.items = self.items, []
        return out

    def status(self) -> dict[str, SourceStatus]:
        return {s: SourceStatus(s, "push", None, None, None, s in self.stale) for s in self.sources}

    def counters(self) -> dict[str, int]:
        return {}

    def store(
        self, source: str, tokens: list[int], *, medium: str = "GPU", rank: int = 0, lora: str | None = None
    ) -> None:
        """`source` (rank `rank`) stored the whole pages of `tokens` (one chain from the root)."""
        whole = tokens[: len(tokens) // PAGE * PAGE]
        hashes = event_hashes_int64(whole, PAGE, Namespace())
        ev = BlockStored(hashes, None, whole, PAGE, None, medium, lora)
        seq = self.seq[source] = self.seq.get(source, -1) + 1
        self.items.append(Delivery(source, seq, KVEventBatch(0.0, [ev], rank), dp_rank=rank))

    def reset(self, source: str, rank: int = 0) -> None:
        self.items.append(Reset(source, rank, "restart"))


def service(
    sources: list[str], routing: RoutingOptions | None = None, clock: Clock | None = None, seed: int = 0
) -> tuple[RouterService, PushFeed]:
    feed = PushFeed(sources)
    svc = RouterService(feed=feed, page_size=PAGE, seed=seed, routing=routing, clock=clock or Clock())  # type: ignore[arg-type]
    return svc, feed


def score(svc: RouterService, tokens: list[int], **fields: Any) -> dict[str, Any]:
    status, out = svc.handle_score(json.dumps({"tokens": tokens, **fields}).encode())
    assert status == 200, out
    return out


def by_name(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {w["worker"]: w for w in out["workers"]}
