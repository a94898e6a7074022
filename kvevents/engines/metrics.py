"""The engines' own Prometheus metric names and labels that carry a worker's load (facts, read as
vLLM 0.33 and SGLang 0.5.20 export them), defined once: the router's scraper reads them
(kvevents.consumers.engine_load) and the simulated workers write them (kvevents.sim.metrics).

vLLM: one series per engine core, labelled `engine` (its data-parallel rank) and `model_name`;
`vllm:cache_config_info` is an info gauge (value 1) whose `num_gpu_blocks` and `block_size` labels
give the KV pool's size. SGLang: one series per scheduler, labelled `dp_rank` when data-parallel
attention is on (plus `tp_rank`, `pp_rank`, `moe_ep_rank`, `engine_type`, `model_name`); with
priority scheduling the totals sit under `priority=""` and per-priority counts under
`priority="<n>"`; `sglang:max_total_num_tokens` and `sglang:page_size` give the pool's size.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineMetricNames", "VLLM", "SGLANG", "ENGINE_METRICS"]


@dataclass(frozen=True)
class EngineMetricNames:
    """One engine's load metrics: what each gauge is called and which label names its rank."""

    engine: str
    running: str  # requests being executed
    waiting: str  # requests queued
    usage: str  # KV pool in use, 0..1
    rank_label: str  # the label holding the data-parallel rank (absent: rank 0)
    capacity_info: str | None = None  # an info gauge whose labels give the pool size (vLLM)
    capacity_blocks_label: str | None = None
    block_size_label: str | None = None
    capacity_tokens: str | None = None  # a gauge of the pool size in tokens (SGLang)
    page_size: str | None = None  # a gauge of tokens per page (SGLang)

    def families(self) -> frozenset[str]:
        """Every metric family the router reads for this engine."""
        names = (self.running, self.waiting, self.usage, self.capacity_info, self.capacity_tokens, self.page_size)
        return frozenset(n for n in names if n)


VLLM = EngineMetricNames(
    engine="vllm",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    usage="vllm:kv_cache_usage_perc",
    rank_label="engine",
    capacity_info="vllm:cache_config_info",
    capacity_blocks_label="num_gpu_blocks",
    block_size_label="block_size",
)

SGLANG = EngineMetricNames(
    engine="sglang",
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    usage="sglang:token_usage",
    rank_label="dp_rank",
    capacity_tokens="sglang:max_total_num_tokens",
    page_size="sglang:page_size",
)

#: By engine name (`kvevents serve --engine vllm` exports VLLM's names, every other engine SGLANG's).
ENGINE_METRICS: dict[str, EngineMetricNames] = {"vllm": VLLM, "sglang": SGLANG}
