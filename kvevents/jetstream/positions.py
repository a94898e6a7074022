"""Where a JetStream feed starts: a record log's positions per (source, dp_rank), given to the ordering.

`positions_from_records` reads them off records (`resume=` of `JetStreamFeed`); `start_from` tells a
`StreamOrder` those positions, and whether a stream may begin anywhere (reading from a time).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from kvevents.events import rank_of
from kvevents.jetstream.order import StreamOrder

__all__ = ["positions_from_records", "start_from"]

_Positions = Mapping[tuple[str, int], tuple[int | None, int]]


def positions_from_records(records: Iterable[Any]) -> dict[tuple[str, int], tuple[int | None, int]]:
    """Where a record log stands per (source, dp_rank): (epoch, next seq), for `resume=`.

    Records are duck-typed (kind, source, dp_rank, seq, epoch); a reset marker forgets the position.
    """
    out: dict[tuple[str, int], tuple[int | None, int]] = {}
    for r in records:
        rank = rank_of(r.dp_rank)
        if r.kind == "reset":
            if r.dp_rank is None:
                for k in [k for k in out if k[0] == r.source]:
                    del out[k]
            else:
                out.pop((r.source, rank), None)
        elif isinstance(r.seq, int) and r.seq >= 0:
            out[(r.source, rank)] = (r.epoch, r.seq + 1)
    return out


def start_from(order: StreamOrder, start_time: float | None, resume: _Positions | None) -> None:
    """Tell `order` where each stream starts: anywhere with a start time, after a resumed position."""
    if start_time is not None:
        order.start_anywhere = True
    for (source, rank), (epoch, next_seq) in (resume or {}).items():
        order.resume(source, rank, epoch, next_seq)
