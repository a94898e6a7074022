"""The /score answer's worker objects, one dict per listed worker, from the ranking's columns.

At fleet scale an answer lists 30-170 matched workers, so the rows are built from columns (the
ranking's workers, costs and positions, the lookup's matched pages and scores) in one call: the
compiled `score_rows` copies one template dict per row and sets its numbers; `rows_py` is its
pure-Python twin (same keys in the same order, same values). Fields that vary only when loads,
hints, publisher staleness or `explain` are in play come in as extra columns, set after the rest.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvevents import native
from kvevents.consumers.cost import Ranking, WorkerSlots
from kvevents.consumers.lookup import MatchColumns

__all__ = ["ROW_TEMPLATE", "answer_rows", "rows_py"]

#: One answer row's keys in order, with the values of a worker without load, hint or staleness.
ROW_TEMPLATE: dict[str, Any] = {
    "worker": None,
    "dp_rank": 0,
    "cost": 0.0,
    "score": 0.0,
    "matched_pages": 0,
    "matched_tokens": 0,
    "overlap_blocks": 0,
    "predicted_blocks": 0,
    "active_prefill_blocks": 0.0,
    "active_decode_blocks": 0.0,
    "queue": None,
    "load": 0.0,
    "load_source": None,
    "load_stale": False,
    "stale": False,
}


def answer_rows(
    ranking: Ranking,
    found: MatchColumns,
    slots: WorkerSlots,
    predicted: np.ndarray | None,
    page_size: int,
    extra: dict[str, list[Any]],
) -> list[dict[str, Any]]:
    """The rows of `ranking` (best first). `predicted`: per row, predicted pages (None: none);
    `extra`: field -> per-row values that replace the template's."""
    args = (
        ROW_TEMPLATE,
        slots.sources,
        slots.dp_ranks,
        ranking.worker,
        ranking.at,
        ranking.cost,
        found.matched,
        found.score,
        predicted,
        page_size,
        tuple(extra),
        tuple(extra.values()),
    )
    if native.active():
        return native.score_rows(*args)
    return rows_py(*args)


def _round6(x: float) -> float:
    """x >= 0 to 6 decimals (3.6, not 3.5999999999999996), 3x cheaper than round()."""
    return int(x * 1e6 + 0.5) / 1e6 if x < 1e15 else x


def rows_py(
    template: dict[str, Any],
    sources: list[Any],
    dp_ranks: list[Any],
    worker: np.ndarray,
    at: np.ndarray,
    cost: np.ndarray,
    matched_pages: np.ndarray,
    matched_score: np.ndarray,
    predicted: np.ndarray | None,
    page_size: int,
    names: tuple[str, ...],
    extra: tuple[list[Any], ...],
) -> list[dict[str, Any]]:
    """The twin of the compiled score_rows (kvevents/native/_rows.c)."""
    nm = len(matched_pages)
    pages_of, score_of = matched_pages.tolist(), matched_score.tolist()
    more_of = predicted.tolist() if predicted is not None else [0] * len(worker)
    out = []
    for i, (wi, a, c) in enumerate(zip(worker.tolist(), at.tolist(), cost.tolist())):
        if not 0 <= wi < len(sources):
            raise ValueError(f"score_rows: worker {wi} is not in 0..{len(sources) - 1}")
        pages, score = (pages_of[a], score_of[a]) if 0 <= a < nm else (0, 0.0)
        more = more_of[i]
        row = template.copy()
        row["worker"], row["dp_rank"] = sources[wi], dp_ranks[wi]
        row["cost"], row["score"] = _round6(c), _round6(score)
        row["matched_pages"], row["matched_tokens"] = pages, pages * page_size
        row["overlap_blocks"], row["predicted_blocks"] = pages + more, more
        for name, col in zip(names, extra):
            row[name] = col[i]
        out.append(row)
    return out
