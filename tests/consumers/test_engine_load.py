"""Engines' /metrics pages -> load per rank (issue 26 part 2), on text the engines' own metric code
wrote: vLLM 0.33's PrometheusStatLogger and SGLang 0.5.20's SchedulerMetricsCollector
(tests/engines/capture_metrics.py made tests/consumers/data, two dp ranks each, LOADS there),
and on the simulated workers' page, which must read the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvevents.consumers.engine_load import EngineLoad, read_engine_loads
from kvevents.consumers.prom_text import parse_samples
from kvevents.consumers.scraper import to_worker_load
from kvevents.sim.metrics import SimLoad, render_metrics

DATA = Path(__file__).parent / "data"
CAPTURED = {  # file -> its engine and KV pool in 16-token pages (vLLM: 2048 blocks of 16; SGLang: 4096 tokens)
    "vllm-0.33.0-metrics.txt": ("vllm", 2048.0),
    "sglang-0.5.20-metrics.txt": ("sglang", 256.0),
    "sglang-0.5.20-priority-metrics.txt": ("sglang", 256.0),
}
LOADS = [(3, 2, 0.25), (1, 0, 0.0625)]  # as capture_metrics.py recorded them, per dp rank


@pytest.mark.parametrize("name", sorted(CAPTURED))
def test_captured_engine_pages_read_per_rank(name: str) -> None:
    engine, pool = CAPTURED[name]
    loads, bad = read_engine_loads((DATA / name).read_text(), page_size=16)
    assert bad == 0
    assert loads == [
        EngineLoad(engine, rank, float(run), float(wait), use, pool) for rank, (run, wait, use) in enumerate(LOADS)
    ]


@pytest.mark.parametrize("name", sorted(CAPTURED))
def test_every_sample_line_of_a_real_page_parses(name: str) -> None:
    """Histograms, counters, info gauges, escaped label values: every sample line is read, none is malformed."""
    text = (DATA / name).read_text()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    families = {ln.split("{")[0].split(" ")[0] for ln in lines}
    samples, bad = parse_samples(text, frozenset(families))
    assert bad == 0 and len(samples) == len(lines) > 100


def test_the_pool_size_follows_the_router_page_size() -> None:
    """vLLM's 2048 blocks of 16 tokens are 1024 router pages of 32; SGLang's 4096 tokens 128."""
    vllm, _ = read_engine_loads((DATA / "vllm-0.33.0-metrics.txt").read_text(), page_size=32)
    sgl, _ = read_engine_loads((DATA / "sglang-0.5.20-metrics.txt").read_text(), page_size=32)
    assert [x.capacity_pages for x in vllm] == [1024.0, 1024.0] and [x.capacity_pages for x in sgl] == [128.0, 128.0]


def test_priority_breakdowns_do_not_count_twice() -> None:
    """SGLang with priority scheduling: rank 0's queue is 2 in all (1 + 1 by priority), not 4."""
    text = (DATA / "sglang-0.5.20-priority-metrics.txt").read_text()
    assert 'priority="1"' in text
    loads, _ = read_engine_loads(text, 16)
    assert loads[0].waiting == 2.0


def test_load_in_blocks() -> None:
    """decode = usage x pool; prefill = waiting x the mean request; without a pool size, running x mean."""
    loads, _ = read_engine_loads((DATA / "vllm-0.33.0-metrics.txt").read_text(), 16)
    w = to_worker_load(loads[0], pages_per_request=10.0, at=5.0)
    assert (w.prefill_blocks, w.decode_blocks, w.queue, w.at, w.source) == (20.0, 512.0, 2, 5.0, "metrics")
    bare = EngineLoad("vllm", 0, running=4, waiting=1, usage=0.5, capacity_pages=None)
    assert to_worker_load(bare, 10.0, 0.0).decode_blocks == 40.0


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_simulated_page_reads_like_the_engines(engine: str) -> None:
    load = SimLoad(running=3, waiting=2, used_pages=512, capacity_pages=2048, page_size=16, dp_rank=1, model='a"b')
    names = "vllm" if engine == "vllm" else "contract"
    loads, bad = read_engine_loads(render_metrics(names, load), 16)
    assert bad == 0
    assert loads == [EngineLoad(engine, 1, 3.0, 2.0, 0.25, 2048.0)]


def test_malformed_lines_are_counted_and_skipped() -> None:
    text = "\n".join(
        [
            'vllm:num_requests_running{engine="0",model_name="m"} 2',
            'vllm:num_requests_running{engine="1",model_name="m} 2',  # unterminated value
            'vllm:num_requests_running{engine="x"} 2',  # not a rank
            'vllm:num_requests_waiting{engine="0"} NaN',
            'vllm:num_requests_waiting{engine="0",note="a\\"b\\\\c\\n"} 7 1700000000000',
            'other_metric{engine="0"} oops',  # not read at all
        ]
    )
    loads, bad = read_engine_loads(text, 16)
    assert bad == 2  # the NaN sample is a value ("not measured"), skipped without counting
    assert loads == [EngineLoad("vllm", 0, 2.0, 7.0, None, None)]
    samples, _ = parse_samples(text, frozenset({"vllm:num_requests_waiting"}))
    assert [x.labels.get("note") for x in samples] == [None, 'a"b\\c\n']


def test_a_page_without_engine_metrics_gives_nothing() -> None:
    assert read_engine_loads("# HELP x y\nx 1\n", 16) == ([], 0)
