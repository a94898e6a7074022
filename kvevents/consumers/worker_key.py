"""What a worker is to a consumer: a typed (source, dp_rank) key, the same in the index, the router,
the keying maps, the service and its /score and /workers answers.

`WorkerKey.of(source, rank)` applies the one rank rule (`kvevents.events.rank_of`: nil, a bool, a
negative or a non-int rank is rank 0). `label` renders the key for people ("w", "w#dp1"); a label
is never parsed back, so a source named `w#dp1` stays apart from rank 1 of `w` everywhere but in
the label-keyed display reports.
"""

from __future__ import annotations

from typing import NamedTuple

from kvevents.events import rank_of

__all__ = ["WorkerKey", "worker_label"]


class WorkerKey(NamedTuple):
    """One worker: a publisher (the source name given to the consumer) and its data-parallel rank."""

    source: str
    dp_rank: int = 0

    @classmethod
    def of(cls, source: str, data_parallel_rank: object) -> WorkerKey:
        """The worker a batch of `source` with this `data_parallel_rank` is filed under."""
        return cls(source, rank_of(data_parallel_rank))

    @property
    def label(self) -> str:
        """The display name: the source, with `#dp<r>` for ranks > 0 (not unique: never parse it)."""
        return self.source if self.dp_rank == 0 else f"{self.source}#dp{self.dp_rank}"


def worker_label(source: str, dp_rank: int) -> str:
    """The name a worker is reported under (`WorkerKey.label`)."""
    return WorkerKey(source, dp_rank).label
