"""Prometheus metrics of the router's cost inputs: scraped loads, their age and the scrapes, and the
predicted copies (names defined once here; read at scrape time from `RouterService.routing_snapshot`)."""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvevents.consumers.service.seams import MetricsSource

__all__ = ["LOAD_METRIC_NAMES", "LoadCollector"]

LOAD_METRIC_NAMES: dict[str, str] = {
    "load_blocks": "kvevents_router_worker_load_blocks",
    "load_queue": "kvevents_router_worker_load_queue",
    "load_age": "kvevents_router_worker_load_age_seconds",
    "scrapes": "kvevents_router_load_scrapes_total",
    "predicted": "kvevents_router_predicted_blocks",
    "predicted_events": "kvevents_router_predicted_pages_total",
}


class LoadCollector(Collector):
    def __init__(self, service: MetricsSource) -> None:
        self.service = service

    def collect(self) -> Iterator[Any]:
        snap = self.service.routing_snapshot()
        names = LOAD_METRIC_NAMES
        blocks = GaugeMetricFamily(
            names["load_blocks"], "Scraped load per worker in pages (prefill, decode)", labels=["worker", "kind"]
        )
        queue = GaugeMetricFamily(names["load_queue"], "Scraped requests waiting per worker", labels=["worker"])
        age = GaugeMetricFamily(names["load_age"], "Seconds since the worker's scraped load", labels=["worker"])
        for label, load in sorted(snap["loads"].items()):
            blocks.add_metric([label, "prefill"], load["prefill_blocks"])
            blocks.add_metric([label, "decode"], load["decode_blocks"])
            if load["queue"] is not None:
                queue.add_metric([label], load["queue"])
            age.add_metric([label], load["age_s"])
        yield blocks
        yield queue
        yield age
        scrapes = CounterMetricFamily(
            names["scrapes"], "Engine /metrics scrapes by outcome", labels=["source", "outcome"]
        )
        for name, (ok, failed) in sorted(snap["scrapes"].items()):
            scrapes.add_metric([name, "ok"], ok)
            scrapes.add_metric([name, "error"], failed)
        yield scrapes
        held = GaugeMetricFamily(names["predicted"], "Predicted copies held per worker", labels=["worker"])
        for label, n in sorted(snap["predicted"].items()):
            held.add_metric([label], n)
        yield held
        events = CounterMetricFamily(
            names["predicted_events"],
            "Predicted copies by outcome (credited; confirmed by the engine, expired, evicted, replaced)",
            labels=["outcome"],
        )
        for outcome, n in sorted(snap["predicted_counters"].items()):
            events.add_metric([outcome], n)
        yield events
