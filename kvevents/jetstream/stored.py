"""What the JetStream feed reads from the stream, typed: one live batch (`LiveMsg`), a complete
snapshot (`Snapshot`) and the assembly of a snapshot from its parts (`SnapshotAssembler`), and the
re-read a repair asks for (`Refill`). Pure data, no NATS; `order.StreamOrder` consumes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvevents.errors import KVEventsError
from kvevents.jetstream.signing import parts_digest

__all__ = ["LiveMsg", "Refill", "Snapshot", "SnapshotAssembler", "SnapshotRefused"]


@dataclass(slots=True)
class LiveMsg:
    """One stored live batch: who sent it, the engine seq and epoch, the bytes, where it sits."""

    source: str
    rank: int
    seq: int
    epoch: int | None
    payload: bytes
    stream_seq: int = 0
    received_at: float = 0.0
    subject: str = ""


@dataclass(slots=True)
class Snapshot:
    """A complete stored snapshot: the batches rebuilding (source, rank) as of engine seq `seq`."""

    source: str
    rank: int
    seq: int  # S: the last engine seq it covers (-1: nothing was published yet)
    epoch: int | None
    payloads: list[bytes]
    start: int  # stream seq from which the batches after S are stored
    stream_seq: int = 0  # where its end marker sits
    snap_id: str = ""


@dataclass(frozen=True, slots=True)
class Refill:
    """Read the live batches of (source, rank) again, from stream seq `start` (after a repair)."""

    source: str
    rank: int
    start: int


class SnapshotRefused(KVEventsError, ValueError):
    """A snapshot's end marker does not match the parts stored under its id; the text says how."""


class SnapshotAssembler:
    """Collects snapshot parts by id; `add_end` returns the Snapshot once all its parts are in.

    A part is kept with the (seq, epoch) it claims; the end marker must match every part's and,
    when it carries one, the digest of the parts (`signing.parts_digest`), else SnapshotRefused.
    A second part with the same index and other bytes spoils the snapshot the same way.
    """

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._parts: dict[str, dict[int, tuple[bytes, tuple[int, int | None] | None]]] = {}
        self._spoiled: set[str] = set()

    def add_part(self, snap_id: str, index: int, payload: bytes, claims: tuple[int, int | None] | None = None) -> None:
        parts = self._parts.setdefault(snap_id, {})
        old = parts.get(index)
        if old is not None and old != (payload, claims):
            self._spoiled.add(snap_id)
        parts[index] = (payload, claims)
        while len(self._parts) > self.keep:  # abandoned snapshots (a bridge died mid-way)
            gone = next(iter(self._parts))
            self._parts.pop(gone)
            self._spoiled.discard(gone)

    def forget(self, snap_id: str) -> None:
        """Drop the parts kept for `snap_id` (its end marker was refused)."""
        self._parts.pop(snap_id, None)
        self._spoiled.discard(snap_id)

    def add_end(self, snap_id: str, count: int, meta: dict, digest: str = "") -> Snapshot | None:
        """The Snapshot (None: parts purged or lost); SnapshotRefused when they do not match the end."""
        parts = self._parts.pop(snap_id, {})
        spoiled = snap_id in self._spoiled
        self._spoiled.discard(snap_id)
        if spoiled:
            raise SnapshotRefused(f"snapshot {snap_id}: two different parts with one index")
        if len(parts) != count or any(i not in parts for i in range(count)):
            return None  # parts purged or lost: not usable
        claims = (meta.get("seq"), meta.get("epoch"))
        if any(c is not None and c != claims for _, c in parts.values()):
            raise SnapshotRefused(f"snapshot {snap_id}: a part claims another seq or epoch than its end marker")
        payloads = [parts[i][0] for i in range(count)]
        if digest and parts_digest(payloads) != digest:
            raise SnapshotRefused(f"snapshot {snap_id}: its parts do not match the end marker's digest")
        return Snapshot(payloads=payloads, snap_id=snap_id, **meta)
