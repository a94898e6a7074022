"""What the bridge's replayed batches were for: a stream's history, replayed at first contact or
after a reset (a healthy start), or the batches of a gap after live ones (a repair)."""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["ReplayTally"]


class ReplayTally:
    """Feed it every Delivery's (source, dp_rank, kind) and every Reset; `counts` holds
    `history_batches_replayed` and `gap_batches_replayed`."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._live: set[tuple[str, Any]] = set()  # streams with a live batch since their last reset

    def delivery(self, source: str, rank: Any, kind: str) -> None:
        key = (source, rank)
        if kind == "live":
            self._live.add(key)
        elif kind == "replay":
            self.counts["gap_batches_replayed" if key in self._live else "history_batches_replayed"] += 1

    def reset(self, source: str, rank: Any) -> None:
        """The stream (every rank of `source` for rank None) starts over: its next replay is history."""
        self._live = {(s, r) for s, r in self._live if s != source or (rank is not None and r != rank)}
