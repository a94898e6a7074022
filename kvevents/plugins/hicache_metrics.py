"""Prometheus metrics of the HiCache page store: names defined once here, read from `stats()` at scrape.

Nothing is counted on the engine's storage threads beyond the store's own counters: a collector asks
the store for `stats()` when Prometheus scrapes. Each backend serves its own registry on its own port
(one per engine rank), so two ranks in one process or one host never mix their counters.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["HICACHE_METRICS", "MetricsServer"]

# stats() key -> (metric name, help, kind)
HICACHE_METRICS: dict[str, tuple[str, str, str]] = {
    "pages": ("kvevents_hicache_pages", "Page files in this rank's store", "gauge"),
    "hits": ("kvevents_hicache_hits_total", "Pages read and verified", "counter"),
    "misses": (
        "kvevents_hicache_misses_total",
        "Page reads that found no usable page (absent, corrupt, misplaced or of the wrong size)",
        "counter",
    ),
    "corrupt": (
        "kvevents_hicache_corrupt_pages_total",
        "Damaged or truncated page files found (each a miss, the file dropped)",
        "counter",
    ),
    "misplaced": (
        "kvevents_hicache_misplaced_pages_total",
        "Valid pages found under another key's or scope's name (a swapped or copied file; a miss, dropped)",
        "counter",
    ),
    "size_mismatch": (
        "kvevents_hicache_size_mismatch_total",
        "Pages of another size than the engine's page (another geometry or dtype; a miss)",
        "counter",
    ),
    "writes": ("kvevents_hicache_writes_total", "Pages written", "counter"),
    "write_skipped": ("kvevents_hicache_writes_skipped_total", "Writes of a page already stored", "counter"),
    "write_errors": ("kvevents_hicache_write_errors_total", "Pages that could not be written", "counter"),
    "read_errors": ("kvevents_hicache_read_errors_total", "Page files that could not be read (I/O errors)", "counter"),
    "bad_keys": ("kvevents_hicache_bad_keys_total", "Calls with a key that is not a storage key", "counter"),
    "exists_hits": (
        "kvevents_hicache_exists_hits_total",
        "Pages batch_exists found present (the consecutive prefix)",
        "counter",
    ),
    "exists_misses": (
        "kvevents_hicache_exists_misses_total",
        "batch_exists calls that stopped at an absent page",
        "counter",
    ),
}


class _StatsCollector(Collector):
    def __init__(self, stats: Callable[[], Mapping[str, int]], labels: Mapping[str, str]) -> None:
        self.stats = stats
        self.labels = dict(labels)

    def collect(self) -> Iterator[Any]:
        stats = self.stats()
        names, values = list(self.labels), list(self.labels.values())
        for key, (name, doc, kind) in HICACHE_METRICS.items():
            if key not in stats:
                continue
            if kind == "counter":
                fam: Any = CounterMetricFamily(name.removesuffix("_total"), doc, labels=names)
            else:
                fam = GaugeMetricFamily(name, doc, labels=names)
            fam.add_metric(values, stats[key])
            yield fam


class MetricsServer:
    """`/metrics` of one store on `addr:port` (port 0: a free one, read back from `port`)."""

    def __init__(
        self, stats: Callable[[], Mapping[str, int]], port: int, *, addr: str = "127.0.0.1", labels: Mapping[str, str]
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_StatsCollector(stats, labels))
        started = start_http_server(port, addr=addr, registry=self.registry)  # (server, thread) since 0.20
        if not isinstance(started, tuple):  # pragma: no cover - prometheus-client < 0.20 gives no handle
            raise OSError("the HiCache metrics server needs prometheus-client >= 0.20")
        self._server, self._thread = started
        self.port = int(self._server.server_port)
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        """Stop serving and join the server's thread (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)
