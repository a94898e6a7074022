"""Samples of the demo over time, for `kvevents demo --html`: hit rates per policy, the router's
backlog and lag, the transport's repair counters, and the faults as marks on the same clock."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Timeline"]


class Timeline:
    """`tick(t)` in the demo's loop records a sample every `interval_s` of demo time (t: seconds
    since the traffic started); `mark(t, kind, worker)` records a fault. Plain dicts, JSON-ready.

    Per sample: `t`; `hits` {policy: [device hit tokens, prompt tokens]} (cumulative); `behind`
    (batches published that the router has not applied yet, all publishers); `lag_ms` (largest
    receive-minus-batch-time over sources); `repairs` (the router's subscriber counters: gaps,
    replayed, restarts, snapshots_applied, resets; cumulative).
    """

    REPAIRS = ("gaps", "replayed", "restarts", "snapshots_applied", "resets")

    def __init__(
        self,
        service: Any,
        names: Sequence[str],
        pubs: Sequence[Any],
        policies: Mapping[str, Any],
        interval_s: float = 0.25,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"Timeline: interval_s must be > 0, got {interval_s!r}")
        self.service = service
        self.names = list(names)
        self.pubs = pubs  # the demo's list: a restarted publisher replaces its slot
        self.policies = policies  # name -> PolicyStats (read at each sample)
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self.marks: list[dict[str, Any]] = []
        self._next = 0.0

    def tick(self, t: float, *, force: bool = False) -> None:
        """Record a sample if one is due at demo time `t` (or `force`)."""
        if not force and t < self._next:
            return
        self._next = t + self.interval_s
        behind = 0
        for name, pub in zip(self.names, self.pubs):
            target = pub.stats()["next_seq"] - 1
            applied = self.service.applied_seq(name)
            behind += max(0, target - (applied if applied is not None else -1))
        sources = self.service.metrics_snapshot()["sources"]
        lags = [s["lag_s"] for s in sources.values() if s.get("lag_s") is not None]
        counters = self.service.feed.counters()
        self.samples.append(
            {
                "t": round(t, 3),
                "hits": {k: [st.device_hit_tokens, st.tokens] for k, st in self.policies.items()},
                "behind": behind,
                "lag_ms": round(1000 * max(lags), 3) if lags else None,
                "repairs": {k: int(counters.get(k, 0)) for k in self.REPAIRS},
            }
        )

    def mark(self, t: float, kind: str, worker: str | None, detail: str = "") -> None:
        """A fault at demo time `t`: kind "drop" or "restart"."""
        self.marks.append({"t": round(t, 3), "kind": kind, "worker": worker, "detail": detail})

    def as_dict(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "samples": self.samples, "marks": self.marks}
