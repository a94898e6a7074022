"""What the HTTP front, the status board, the metrics and the proxy need of the router service.

`RouterService` (core.py) builds all of them, so they name it by these protocols instead of
importing it: the service imports its parts, never the other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.router import PrefixRouter
from kvevents.consumers.service.freshness import Freshness
from kvevents.consumers.worker_key import WorkerKey

__all__ = [
    "ScoringService",
    "InflightSource",
    "MetricsSource",
    "StatusSource",
    "HttpService",
    "ProxyService",
    "ProxyFront",
]

InflightSource = Callable[[], Mapping[WorkerKey, tuple[int, int]]]  # worker -> (prefill, decode) blocks in flight


class MetricsSource(Protocol):
    """What /metrics reads at scrape time (the service's counters, and its cost inputs)."""

    def metrics_snapshot(self) -> dict[str, Any]: ...

    def routing_snapshot(self) -> dict[str, Any]: ...


class StatusSource(Protocol):
    """What the status page reads."""

    def workers_view(self) -> dict[str, Any]: ...

    def adapter_counts(self) -> dict[WorkerKey, dict[str, int]]: ...


class _Rendered(Protocol):
    @property
    def registry(self) -> Any: ...

    def render(self) -> bytes: ...


class HttpService(Protocol):
    """What the FastAPI app serves."""

    @property
    def metrics(self) -> _Rendered: ...

    def handle_score(self, body: Any) -> tuple[int, dict[str, Any]]: ...

    def decode_score(self, body: Any) -> Any: ...

    def score_decoded(self, decoded: Any) -> tuple[int, dict[str, Any]]: ...

    def score_request_schema(self) -> dict[str, Any]: ...

    def workers_view(self) -> dict[str, Any]: ...

    def status_view(self) -> dict[str, Any]: ...


class _Router(Protocol):
    @property
    def page_size(self) -> int: ...


class ProxyService(HttpService, Protocol):
    """What the OpenAI-compatible proxy uses: scoring, the renderer, its seams for load and status."""

    @property
    def renderer(self) -> Any: ...

    @property
    def router(self) -> _Router: ...

    @property
    def cost_settings(self) -> Any: ...

    def set_inflight_source(self, fn: InflightSource | None) -> None: ...

    def add_status_section(self, name: str, view: Callable[[], Any]) -> None: ...


class ProxyFront(Protocol):
    """What the app needs of the proxy (service/proxy.py): its /v1 routes and their names."""

    endpoints: tuple[str, ...]

    def mount(self, app: Any, limits: Any) -> None: ...


class ScoringService(Protocol):
    """What the scorer reads of the service: the index lock, router and index, the staleness view."""

    @property
    def lock(self) -> Any: ...

    @property
    def router(self) -> PrefixRouter: ...

    @property
    def index(self) -> BlockIndex: ...

    @property
    def freshness(self) -> Freshness: ...
