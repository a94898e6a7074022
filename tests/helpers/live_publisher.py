"""A real Publisher fed on a thread until closed: the contract's reference cache, or a vLLM 0.33
worker's payloads (kvevents.sim.vllm), for tests that point a command at a live stream."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from kvevents.testing.zeromq import EPH
from kvevents.zeromq.publisher import Publisher, PublisherConfig


class LivePublisher:
    """`engine="contract"` (RadixCache events) or `"vllm"` (VllmSimWorker payloads, no snapshots) at
    `page` tokens per page, published every 10 ms on ephemeral live and replay ports."""

    def __init__(self, engine: str = "contract", page: int = 4, **config: Any) -> None:
        self.engine, self.page = engine, page
        config.setdefault("heartbeat_interval_s", 0.2)
        if engine == "vllm":
            config.setdefault("snapshots", False)
        self.pub = Publisher(PublisherConfig(endpoint=EPH, replay_endpoint=EPH, **config))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="test-live-publisher", daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return self.pub.endpoint

    @property
    def replay(self) -> str:
        return str(self.pub.replay_endpoint)

    def _payloads(self) -> Iterator[tuple[list, bytes | None]]:
        from kvevents.sim.worker import Workload

        load = iter(Workload(seed=5, page_size=self.page))  # endless, one request at a time
        if self.engine == "vllm":
            from kvevents.sim.vllm import VllmSimWorker

            w = VllmSimWorker("vllm", block_size=self.page, capacity_blocks=256)
            for req in load:
                w.serve_request(req)
                yield [], w.take_payload(1.0)
            return
        from kvevents.cache import RadixCache

        cache = RadixCache(self.page, capacity_pages=256)
        for req in load:
            cache.insert(req.tokens, req.namespace)
            if cache.num_pages > 192:
                cache.evict(32)
            yield cache.take_events(), None

    def _run(self) -> None:
        for events, payload in self._payloads():
            if self.stop.wait(0.01):
                return
            if payload is not None:
                self.pub.publish_payload(payload)
            elif events:
                self.pub.publish(events)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.pub.close()

    def __enter__(self) -> LivePublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
