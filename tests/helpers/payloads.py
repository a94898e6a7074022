"""Batch payloads as engines publish them (the contract, "Wire format"), for tests that feed bytes."""

from __future__ import annotations

from collections.abc import Sequence

from kvevents.events import BatchEncoder, BlockStored, Event

_ENCODERS = {"map": BatchEncoder("map"), "array": BatchEncoder("array")}


def batch(
    events: Sequence[Event], ts: float = 1.0, rank: int | None = 0, epoch: int | None = None, events_as: str = "map"
) -> bytes:
    """One batch on the default wire: `[ts, events, rank]`, plus the epoch when one is given;
    events as maps (the default, SGLang's) or as arrays (`events_as="array"`)."""
    return _ENCODERS[events_as].encode(ts, list(events), rank, epoch)


def one_store(h: int, ts: float = 1.0, rank: int | None = 0) -> bytes:
    """A batch storing the single 2-token page `h` on GPU (a distinct payload per hash)."""
    return batch([BlockStored([h], None, [1, 2], 2, None, "GPU", None)], ts=ts, rank=rank)
