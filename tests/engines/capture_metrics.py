"""Capture the /metrics text the engines' own metric code writes, for tests/consumers/data (issue 26).

Run in an engine venv (scripts/engine_env.sh), from the repository root:

    /work/.engine-venvs/vllm-0.33.0/bin/python tests/engines/capture_metrics.py vllm tests/consumers/data
    /work/.engine-venvs/sglang-0.5.20/bin/python tests/engines/capture_metrics.py sglang tests/consumers/data

vLLM: its PrometheusStatLogger for two engine cores (data-parallel ranks 0 and 1), each recording
one SchedulerStats, then its cache_config_info, rendered by prometheus_client as `vllm serve`
does. The logger is given a stand-in VllmConfig (a namespace with the attributes it reads: the
real one needs a model). SGLang: its SchedulerMetricsCollector in one process per dp rank, in
prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR), collected as SGLang's HTTP
server collects it; a second page with priority scheduling on (totals under priority="").
The figures each rank records are in LOADS below (the tests read them back).
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace as NS

# per dp rank: (running, waiting, KV usage); pools: vLLM 2048 blocks of 16, SGLang 4096 tokens
LOADS = [(3, 2, 0.25), (1, 0, 0.0625)]


def vllm(out: Path) -> None:
    from prometheus_client import generate_latest
    from vllm.config import CacheConfig, ObservabilityConfig
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.stats import SchedulerStats

    cache = CacheConfig(block_size=16)
    cache.num_gpu_blocks = 2048
    cfg = NS(
        observability_config=ObservabilityConfig(),
        model_config=NS(served_model_name="m", max_model_len=4096, is_diffusion=False),
        speculative_config=None, kv_transfer_config=None, ec_transfer_config=None, lora_config=None,
        cache_config=cache, watermark_config=None, device_config=NS(device_type="cpu"),
        compilation_config=NS(), parallel_config=NS(data_parallel_size=2),
    )  # fmt: skip
    logger = PrometheusStatLogger(cfg, engine_indexes=[0, 1])
    for idx, (run, wait, use) in enumerate(LOADS):
        logger.record(
            SchedulerStats(num_running_reqs=run, num_waiting_reqs=wait, kv_cache_usage=use), None, engine_idx=idx
        )
    logger.log_engine_initialized()
    (out / "vllm-0.33.0-metrics.txt").write_bytes(generate_latest())


def sglang(out: Path, priority: bool) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import standins

    standins.stub_torchvision()
    mp = tempfile.mkdtemp()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = mp
    from sglang.srt import runtime_context
    from sglang.srt.observability.metrics_collector import QueueCount, SchedulerMetricsCollector, SchedulerStats
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path="dummy")
    runtime_context.publish(args, role="scheduler")
    for dp, (run, wait, use) in enumerate(LOADS):
        pid = os.fork()
        if pid == 0:  # one scheduler process per dp rank, as SGLang runs them
            labels = {"model_name": "m", "engine_type": "unified", "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 1}
            if priority:
                labels["priority"] = ""
            labels["dp_rank"] = dp
            c = SchedulerMetricsCollector(labels=labels, server_args=args)
            st = SchedulerStats()
            by = {0: wait - 1, 1: 1} if priority and wait else None
            st.num_running_reqs, st.num_queue_reqs = QueueCount(run), QueueCount(wait, by)
            st.token_usage, st.num_used_tokens = use, int(use * 4096)
            c.log_stats(st)
            c.emit_constants(4096, None, 1.0, 0.5, {}, None, 16, 256, 4096, 10.0)
            os._exit(0)
        os.waitpid(pid, 0)
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    reg = CollectorRegistry()
    multiprocess.MultiProcessCollector(reg)
    name = "sglang-0.5.20-priority-metrics.txt" if priority else "sglang-0.5.20-metrics.txt"
    (out / name).write_bytes(generate_latest(reg))


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    engine, dest = sys.argv[1], Path(sys.argv[2])
    dest.mkdir(parents=True, exist_ok=True)
    if engine == "vllm":
        vllm(dest)
    else:
        sglang(dest, priority=len(sys.argv) > 3 and sys.argv[3] == "priority")
