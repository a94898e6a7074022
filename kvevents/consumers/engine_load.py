"""An engine's /metrics page -> its load per data-parallel rank: requests running and waiting, the
share of its KV pool in use, and the pool's size in the router's pages (vLLM's or SGLang's names,
kvevents.engines.metrics, whichever the page carries).

Several series of one rank (SGLang's tensor-parallel ranks, each reporting the same scheduler) are
read as their largest value; SGLang's per-priority breakdowns (a non-empty `priority` label) are
skipped, their total kept, and so are NaN samples (not measured yet). A rank label that is not a non-negative integer is counted as malformed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvevents.consumers.prom_text import Sample, parse_samples
from kvevents.engines.metrics import SGLANG, VLLM, EngineMetricNames

__all__ = ["EngineLoad", "read_engine_loads"]

_WANTED = VLLM.families() | SGLANG.families()


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One rank's load as its engine reports it."""

    engine: str  # "vllm" | "sglang"
    dp_rank: int
    running: float
    waiting: float
    usage: float | None  # KV pool in use, 0..1 (None: not reported)
    capacity_pages: float | None  # the KV pool in router pages (None: the engine does not say)


def read_engine_loads(text: str, page_size: int) -> tuple[list[EngineLoad], int]:
    """Per rank, the load in an exposition page (empty when it carries neither engine's metrics),
    and the number of malformed lines of the families read."""
    samples, bad = parse_samples(text, _WANTED)
    names = {s.name for s in samples}
    for spec in (VLLM, SGLANG):
        if spec.running in names or spec.waiting in names:
            loads, more = _loads(spec, samples, page_size)
            return loads, bad + more
    return [], bad


def _loads(spec: EngineMetricNames, samples: list[Sample], page_size: int) -> tuple[list[EngineLoad], int]:
    by: dict[str, dict[int, float]] = {}  # family -> rank -> value
    capacity: dict[int, float] = {}
    bad = 0
    for s in samples:
        if s.labels.get("priority") or math.isnan(s.value):
            continue  # SGLang's per-priority breakdown (the total is its own series), or not measured
        rank = _rank(s.labels.get(spec.rank_label))
        if rank is None:
            bad += 1
            continue
        if s.name == spec.capacity_info:
            pages = _info_capacity(spec, s.labels, page_size)
            if pages is not None:
                capacity[rank] = max(capacity.get(rank, 0.0), pages)
            continue
        if s.name == spec.capacity_tokens:
            if s.value > 0:
                capacity[rank] = max(capacity.get(rank, 0.0), s.value / page_size)
            continue
        per = by.setdefault(s.name, {})
        per[rank] = max(per.get(rank, s.value), s.value)
    ranks = sorted(set(by.get(spec.running, {})) | set(by.get(spec.waiting, {})))
    out = [
        EngineLoad(
            engine=spec.engine,
            dp_rank=r,
            running=max(0.0, by.get(spec.running, {}).get(r, 0.0)),
            waiting=max(0.0, by.get(spec.waiting, {}).get(r, 0.0)),
            usage=_fraction(by.get(spec.usage, {}).get(r)),
            capacity_pages=capacity.get(r),
        )
        for r in ranks
    ]
    return out, bad


def _rank(value: str | None) -> int | None:
    if value is None or value == "":
        return 0
    return int(value) if value.isdigit() else None


def _fraction(value: float | None) -> float | None:
    return None if value is None else min(1.0, max(0.0, value))


def _info_capacity(spec: EngineMetricNames, labels: dict[str, str], page_size: int) -> float | None:
    """vLLM's cache_config_info labels -> the pool in router pages (None when not yet sized)."""
    blocks = labels.get(spec.capacity_blocks_label or "", "")
    size = labels.get(spec.block_size_label or "", "")
    if not blocks.isdigit() or int(blocks) == 0:
        return None
    tokens_per_block = int(size) if size.isdigit() and int(size) > 0 else page_size
    return int(blocks) * tokens_per_block / page_size
