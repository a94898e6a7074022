"""One row of GET /workers: what the router knows of one worker (a source's dp rank), as JSON.

The service gathers the figures under its lock (kvevents.consumers.service.core); this module only
lays them out, so the row's shape is defined once.
"""

from __future__ import annotations

from typing import Any

from kvevents.feed import SourceStatus

__all__ = ["worker_row"]


def worker_row(
    name: str,
    status: SourceStatus,
    rank: int,
    media: dict[str, int],
    applied: tuple[int | None, int | None, float | None],
    now: float,
    key_mode: str,
    mismatch: str | None,
) -> dict[str, Any]:
    """The row of source `name` (its feed `status`) at dp rank `rank`: blocks by medium, `applied` (its last seq,
    epoch and lag), staleness, key mode, replay framing, what it publishes and a likely problem."""
    last_seq, epoch, lag_s = applied
    return {
        "worker": name,
        "dp_rank": rank,
        "endpoint": status.endpoint,
        "blocks": sum(media.values()),
        "blocks_by_medium": media,
        "last_seq": last_seq,
        "epoch": epoch,
        "lag_s": None if lag_s is None else round(lag_s, 6),
        "last_heard_age_s": None if status.last_heard is None else round(now - status.last_heard, 3),
        "stale": status.stale,
        "repairing": status.busy,
        "key_mode": key_mode,  # contract | tokens | auto (still detecting)
        # the form of its replay replies (kvevents.zeromq.framing), null until one came
        "replay_framing": status.replay_framing,
        # what it publishes (kvevents.published) and why this router cannot use it
        "published": {"page_size": status.page_size, "hash_chain": status.hash_chain, "mismatch": mismatch},
        "problem": status.problem,  # a likely misconfiguration its sockets saw
    }
