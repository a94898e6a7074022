"""What a JetStream consumer checks one (source, dp_rank) stream against, per delivered seq: the
payload's digest (a second, different message for a seq it delivered is a conflict) and the
state digest after it (a stored snapshot of seq S must rebuild the same digest: anti-entropy).

The state digest is an order-free sum, mod 2**64, of a hash of (medium, block hash) per copy:
BlockStored adds its pages, BlockRemoved subtracts them, AllBlocksCleared zeroes it, so a
snapshot's batches give the digest of the state they rebuild. Python's `hash` of str and bytes is
keyed per process (SipHash): digests are compared only inside one process and cannot be steered
from outside. An engine that removes a block it never stored makes the sums differ from its
snapshot (its view ignores such a remove): that costs a counted repair, never a wrong index.
"""

from __future__ import annotations

from array import array
from typing import Iterable

from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

__all__ = ["SeqLedger", "payload_digest", "state_digest"]

_MASK = (1 << 64) - 1


def payload_digest(payload: bytes) -> int:
    """A 64-bit digest of a batch's bytes (never 0: 0 marks "no payload" in the ledger)."""
    return (hash(payload) & _MASK) or 1


def state_digest(state: int, batches: Iterable[KVEventBatch]) -> int:
    """`state` after applying `batches`' events (stores add, removes subtract, a clear zeroes)."""
    for batch in batches:
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                md = ev.medium
                state += sum([hash((md, h)) for h in ev.block_hashes])
            elif isinstance(ev, BlockRemoved):
                md = ev.medium
                state -= sum([hash((md, h)) for h in ev.block_hashes])
            elif isinstance(ev, AllBlocksCleared):
                state = 0
    return state & _MASK


class SeqLedger:
    """The last `window` delivered seqs of one stream, contiguous: payload digest and state digest after each.

    `restart(seq, state)` begins it at a snapshot of `seq` (or at -1, the empty state before seq 0);
    `record(seq, ...)` must follow on with the next seq, else the ledger restarts there unknown.
    `known` is False while the state it started from is not known (a resumed or mid-stream start).
    """

    __slots__ = ("window", "known", "_base", "_first", "_next", "_pay", "_state")

    def __init__(self, window: int = 4096) -> None:
        if window < 1:
            raise ValueError(f"SeqLedger window must be >= 1, got {window}")
        self.window = window
        self.known = False
        self._base = self._first = self._next = 0
        self._pay = array("Q")
        self._state = array("Q")

    @property
    def state(self) -> int | None:
        """The state digest after the last recorded seq (None: not known)."""
        if not self.known or self._next == self._first:
            return None
        return self._state[(self._next - 1 - self._base) % self.window]

    def restart(self, seq: int, state: int | None) -> None:
        """Start over at `seq` with `state` (None: unknown, nothing will be compared until a snapshot)."""
        self._base = self._first = seq
        self._next = seq
        self._pay = array("Q")
        self._state = array("Q")
        self.known = state is not None
        self._put(seq, 0, state or 0)

    def record(self, seq: int, payload: int, state_after: int) -> None:
        if seq != self._next:
            self.restart(seq - 1, None)
        self._put(seq, payload, state_after)

    def _put(self, seq: int, payload: int, state: int) -> None:
        i = (seq - self._base) % self.window
        if i == len(self._pay):
            self._pay.append(payload)
            self._state.append(state)
        else:
            self._pay[i] = payload
            self._state[i] = state
        self._next = seq + 1
        self._first = max(self._first, self._next - self.window)

    def holds(self, seq: int) -> bool:
        return self._first <= seq < self._next

    def payload(self, seq: int) -> int | None:
        """The digest of the payload delivered at `seq` (None: not held, or the snapshot's seq)."""
        if not self.holds(seq):
            return None
        return self._pay[(seq - self._base) % self.window] or None

    def state_at(self, seq: int) -> int | None:
        """The state digest right after `seq` was applied (None: not held or not known)."""
        if not self.known or not self.holds(seq):
            return None
        return self._state[(seq - self._base) % self.window]
