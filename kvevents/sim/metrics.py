"""A simulated worker's /metrics page, in its engine's own names, labels and text format (vLLM's
under `--engine vllm`, SGLang's otherwise: kvevents.engines.metrics), so the router's scraper reads
the simulated fleet exactly as it reads a real one."""

from __future__ import annotations

from dataclasses import dataclass

from kvevents.engines.metrics import SGLANG, VLLM

__all__ = ["SimLoad", "render_metrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class SimLoad:
    """What a simulated worker reports: requests running and waiting, pool use and size."""

    running: int
    waiting: int
    used_pages: int
    capacity_pages: int
    page_size: int
    dp_rank: int = 0
    model: str = "kvevents-sim"

    @property
    def usage(self) -> float:
        return min(1.0, self.used_pages / self.capacity_pages) if self.capacity_pages else 0.0


def _gauge(name: str, doc: str, labels: str, value: float) -> list[str]:
    return [f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name}{{{labels}}} {float(value)!r}"]


def render_metrics(engine: str, load: SimLoad) -> str:
    """The exposition text an engine of this kind would serve for this load."""
    model = load.model.replace("\\", "\\\\").replace('"', '\\"')
    if engine == "vllm":
        labels = f'engine="{load.dp_rank}",model_name="{model}"'
        info = (
            f'block_size="{load.page_size}",enable_prefix_caching="True",engine="{load.dp_rank}",'
            f'num_cpu_blocks="None",num_gpu_blocks="{load.capacity_pages}"'
        )
        lines = [
            *_gauge(VLLM.running, "Number of requests in model execution batches.", labels, load.running),
            *_gauge(VLLM.waiting, "Number of requests waiting to be processed.", labels, load.waiting),
            *_gauge(VLLM.usage, "KV-cache usage. 1 means 100 percent usage.", labels, load.usage),
            *_gauge(str(VLLM.capacity_info), "Information of the LLMEngine CacheConfig", info, 1),
        ]
    else:
        labels = (
            f'dp_rank="{load.dp_rank}",engine_type="unified",model_name="{model}",moe_ep_rank="0",'
            'pp_rank="0",tp_rank="0"'
        )
        tokens = load.capacity_pages * load.page_size
        lines = [
            *_gauge(SGLANG.running, "The number of running requests.", labels, load.running),
            *_gauge(SGLANG.waiting, "The number of requests in the waiting queue.", labels, load.waiting),
            *_gauge(SGLANG.usage, "The token usage.", labels, load.usage),
            *_gauge(
                str(SGLANG.capacity_tokens), "Maximum total number of tokens in the KV cache pool.", labels, tokens
            ),
            *_gauge(str(SGLANG.page_size), "KV cache page size in tokens.", labels, load.page_size),
        ]
    return "\n".join(lines) + "\n"
