"""Prometheus metrics of the consumer service: names defined once here, read at scrape time.

Nothing is incremented per event: a collector reads the service's counters, the index's counts
and the subscriber's status when /metrics is scraped. Each service has its own registry, so
several services (tests, the demo) can live in one process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvevents.consumers.service.load_metrics import LoadCollector
from kvevents.consumers.service.seams import MetricsSource
from kvevents.consumers.worker_key import WorkerKey

__all__ = ["METRIC_NAMES", "ProxyMetrics", "ServiceMetrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

METRIC_NAMES: dict[str, str] = {
    "batches": "kvevents_router_batches_applied_total",
    "resets": "kvevents_router_resets_total",
    "index_events": "kvevents_router_index_events_total",
    "copies": "kvevents_router_block_copies",
    "entries": "kvevents_router_index_entries",
    "last_seq": "kvevents_router_source_last_seq",
    "lag": "kvevents_router_source_lag_seconds",
    "stale": "kvevents_router_source_stale",
    "subscriber": "kvevents_router_subscriber_events_total",
    "score_requests": "kvevents_router_score_requests_total",
    "score_seconds": "kvevents_router_score_seconds",
    "score_matched_pages": "kvevents_router_score_matched_pages",
    "http_admission": "kvevents_router_http_admission_total",
    # route --proxy (kvevents.consumers.service.proxy), per worker (source name, dp rank)
    "proxy_requests": "kvevents_router_proxy_requests_total",
    "proxy_answers": "kvevents_router_proxy_answers_total",
    "proxy_errors": "kvevents_router_proxy_errors_total",
    "proxy_retries": "kvevents_router_proxy_retries_total",
    "proxy_load_only": "kvevents_router_proxy_load_only_total",
    "proxy_ttfb": "kvevents_router_proxy_ttfb_seconds",
    "proxy_inflight_requests": "kvevents_router_proxy_inflight_requests",
    "proxy_inflight_blocks": "kvevents_router_proxy_inflight_blocks",
}


class _Collector(Collector):
    def __init__(self, service: MetricsSource) -> None:
        self.service = service

    def collect(self) -> Iterator[Any]:
        snap = self.service.metrics_snapshot()
        batches = CounterMetricFamily(
            METRIC_NAMES["batches"], "Batches applied to the index", labels=["source", "kind"]
        )
        for (source, kind), n in sorted(snap["batches"].items()):
            batches.add_metric([source, kind], n)
        yield batches
        resets = CounterMetricFamily(
            METRIC_NAMES["resets"], "Source resets (index state dropped)", labels=["source", "reason"]
        )
        for (source, reason), n in sorted(snap["resets"].items()):
            resets.add_metric([source, reason], n)
        yield resets
        ev = CounterMetricFamily(METRIC_NAMES["index_events"], "Index outcomes by reason", labels=["reason"])
        for reason, n in sorted(snap["index"].items()):
            ev.add_metric([reason], n)
        yield ev
        copies = GaugeMetricFamily(
            METRIC_NAMES["copies"], "Block copies held per worker and medium", labels=["worker", "medium"]
        )
        for worker, media in sorted(snap["blocks"].items()):
            for medium, n in sorted(media.items()):
                copies.add_metric([worker, medium], n)
        yield copies
        yield GaugeMetricFamily(METRIC_NAMES["entries"], "Index dict entries (lora_name, hash)", value=snap["entries"])
        last = GaugeMetricFamily(METRIC_NAMES["last_seq"], "Last applied seq per source", labels=["source"])
        lag = GaugeMetricFamily(METRIC_NAMES["lag"], "Receive time minus batch ts, last live batch", labels=["source"])
        stale = GaugeMetricFamily(METRIC_NAMES["stale"], "1 if nothing was heard for stale_after_s", labels=["source"])
        for name, st in sorted(snap["sources"].items()):
            if st["last_seq"] is not None:
                last.add_metric([name], st["last_seq"])
            if st["lag_s"] is not None:
                lag.add_metric([name], st["lag_s"])
            stale.add_metric([name], 1.0 if st["stale"] else 0.0)
        yield last
        yield lag
        yield stale
        sub = CounterMetricFamily(METRIC_NAMES["subscriber"], "Subscriber counters", labels=["counter"])
        for key, n in sorted(snap["subscriber"].items()):
            sub.add_metric([key], n)
        yield sub
        req = CounterMetricFamily(METRIC_NAMES["score_requests"], "POST /score requests by status", labels=["status"])
        for status, n in sorted(snap["score_requests"].items()):
            req.add_metric([str(status)], n)
        yield req
        adm = CounterMetricFamily(
            METRIC_NAMES["http_admission"],
            "HTTP requests admitted, queued and refused (503), idle connections closed; long_*: /score bodies over 64 KiB "
            "(long_paced: pauses of their paced reading, long_paced_ms: milliseconds paused)",
            labels=["outcome"],
        )
        for outcome, n in sorted(snap.get("http", {}).items()):
            adm.add_metric([outcome], n)
        yield adm


class ServiceMetrics:
    """One registry per service: the scrape-time collector plus a score latency histogram."""

    def __init__(self, service: MetricsSource) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(service))
        self.registry.register(LoadCollector(service))  # loads and predictions (load_metrics.py)
        self.score_seconds = Histogram(
            METRIC_NAMES["score_seconds"],
            "Time to score one request (hashing + lookup)",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1),
            registry=self.registry,
        )
        self.score_matched_pages = Histogram(
            METRIC_NAMES["score_matched_pages"],
            "Prefix pages held by the best worker of each answered POST /score (0: no worker had one)",
            buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128),
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ProxyCollector(Collector):
    """The proxy's counters and in-flight figures, read at scrape time."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        snap = self.snapshot()
        wr = ["worker", "dp_rank"]
        sent = CounterMetricFamily(METRIC_NAMES["proxy_requests"], "Requests sent to a worker (retries too)", labels=wr)
        answers = CounterMetricFamily(
            METRIC_NAMES["proxy_answers"], "Answers relayed, by status class", labels=[*wr, "status"]
        )
        errors = CounterMetricFamily(
            METRIC_NAMES["proxy_errors"],
            "Failed requests by kind: connect, transport (closed before an answer), timeout, stream (broken off)",
            labels=[*wr, "kind"],
        )
        for key, c in sorted(snap["counters"].items()):
            labels = [key.source, str(key.dp_rank)]
            sent.add_metric(labels, c["sent"])
            for status, n in sorted(c["answers"].items()):
                answers.add_metric([*labels, status], n)
            for kind, n in sorted(c["errors"].items()):
                errors.add_metric([*labels, kind], n)
        yield from (sent, answers, errors)
        yield CounterMetricFamily(
            METRIC_NAMES["proxy_retries"], "Attempts on another worker after a failed connection", value=snap["retries"]
        )
        load_only = CounterMetricFamily(
            METRIC_NAMES["proxy_load_only"], "Requests routed by load alone (not scored), by why", labels=["why"]
        )
        for why, n in sorted(snap["load_only"].items()):
            load_only.add_metric([why], n)
        yield load_only
        reqs = GaugeMetricFamily(METRIC_NAMES["proxy_inflight_requests"], "Proxied requests in flight", labels=wr)
        blocks = GaugeMetricFamily(
            METRIC_NAMES["proxy_inflight_blocks"],
            "Blocks of proxied requests in flight: prefill (pages the worker lacks, until the first byte), "
            "decode (all the request's pages, until the answer ends)",
            labels=[*wr, "phase"],
        )
        for key, (prefill, decode) in sorted(snap["blocks"].items()):
            labels = [key.source, str(key.dp_rank)]
            reqs.add_metric(labels, snap["requests"].get(key, 0))
            blocks.add_metric([*labels, "prefill"], prefill)
            blocks.add_metric([*labels, "decode"], decode)
        yield from (reqs, blocks)


class ProxyMetrics:
    """The proxy's metrics in the service's registry: a scrape-time collector and a TTFB histogram."""

    def __init__(self, registry: CollectorRegistry, snapshot: Callable[[], dict[str, Any]]) -> None:
        registry.register(_ProxyCollector(snapshot))
        self.ttfb = Histogram(
            METRIC_NAMES["proxy_ttfb"],
            "Time from sending a request to a worker to the first byte of its answer's body",
            ["worker", "dp_rank"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=registry,
        )

    def observe_ttfb(self, key: WorkerKey, seconds: float) -> None:
        self.ttfb.labels(key.source, str(key.dp_rank)).observe(seconds)
