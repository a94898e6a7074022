"""The cold start's snapshots handed to the ordering a few at a time, not all in one poll.

A fleet's cold start picks one snapshot per (source, dp_rank): at 1,024 sources and 10M block copies
that is ~200 MB of payloads. Applying them all inside one `poll()` decodes every one of them before the
caller has applied the first, so the decoded batches of the whole fleet (several times the payloads'
size) are alive at once. `SnapshotPacer` keeps the picked snapshots as their payloads and gives the
ordering snapshots only until `per_poll` batches have been handed out; the feed takes no stored
message while any remain (the batches after a snapshot must follow it), so the read-ahead stays at its
bound and waits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from kvevents.jetstream.stored import Snapshot

__all__ = ["SnapshotPacer", "SNAPSHOT_BATCHES_PER_POLL"]

SNAPSHOT_BATCHES_PER_POLL = 1024  # snapshot batches one poll() hands out at most (past one snapshot's)


class SnapshotPacer:
    """A FIFO of picked snapshots, given out by batch budget: whole snapshots, in the order added."""

    def __init__(self, per_poll: int = SNAPSHOT_BATCHES_PER_POLL) -> None:
        if per_poll < 1:
            raise ValueError(f"snapshot batches per poll must be >= 1 (got {per_poll})")
        self.per_poll = per_poll
        self._waiting: deque[Snapshot] = deque()

    def add(self, snaps: Iterable[Snapshot]) -> None:
        self._waiting.extend(snaps)

    @property
    def pending(self) -> int:
        """Snapshots not handed out yet."""
        return len(self._waiting)

    def hand_out(self, apply: Callable[[Snapshot], object]) -> bool:
        """`apply` the next snapshots until `per_poll` of their batches went (at least one snapshot, and
        never part of one); each leaves the queue before it is applied. True when none are left."""
        handed = 0
        while self._waiting and handed < self.per_poll:
            snap = self._waiting.popleft()
            handed += max(1, len(snap.payloads))
            apply(snap)
        return not self._waiting
