"""Shared pieces of the JetStream tests: a simulated engine, a router fed from JetStream, what it stored."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

from kvevents.consumers.indexer import BlockIndex
from kvevents.jetstream.feed import JetStreamFeed
from kvevents.jetstream.link import NatsOptions
from kvevents.sim.worker import SimWorker, Workload
from kvevents.testing.zeromq import EPH
from kvevents.zeromq.publisher import Publisher, publish_steps
from kvevents.zeromq.subscriber import Delivery, Reset, Source


class Engine:
    """A SimWorker publishing through a real Publisher with a replay endpoint (ephemeral ports)."""

    def __init__(self, name: str, seed: int, *, endpoint: str = EPH, replay: str = EPH) -> None:
        self.name = name
        self.worker = SimWorker(name, page_size=4, capacity_pages=64)
        self.load = iter(
            Workload(seed, page_size=4, system_prompt_pages=(1, 4), user_tokens=(4, 40), answer_tokens=(4, 40))
        )
        self.pub = Publisher(endpoint=endpoint, replay_endpoint=replay, bind=True, heartbeat_interval_s=0.1)

    @property
    def source(self) -> Source:
        return Source(self.pub.endpoint, self.pub.replay_endpoint, self.name)

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            self.worker.serve(next(self.load))
            publish_steps(self.worker, self.pub)

    def last_seq(self) -> int:
        return self.pub.stats()["next_seq"] - 1

    def truth(self) -> Counter:
        return +self.worker.cache.published_copies()

    def close(self) -> None:
        self.pub.close()


class JSRouter:
    """A JetStreamFeed driving a BlockIndex (what RouterService does, without HTTP)."""

    def __init__(self, url: str, stream: str = "KV", reorder_wait_s: float = 0.3, **options: object) -> None:
        self.index = BlockIndex()
        self.applied: dict[str, int] = {}
        self.resets: list[Reset] = []
        self.kinds: Counter = Counter()
        self.src = JetStreamFeed(NatsOptions(url), stream, reorder_wait_s=reorder_wait_s, **options)  # type: ignore[arg-type]

    def pump(self, timeout: float = 0.05) -> None:
        for it in self.src.poll(timeout):
            if isinstance(it, Delivery):
                self.index.apply(it.source, it.batch)
                self.applied[it.source] = it.seq
                self.kinds[it.kind] += 1
            else:
                self.index.drop_source(it.source, it.dp_rank)
                self.applied.pop(it.source, None)
                self.resets.append(it)

    def state(self, source: str) -> Counter:
        return +self.index.copies(source)

    def stop(self) -> None:
        self.src.stop()


def caught_up(routers: list[JSRouter], engines: list[Engine]) -> Callable[[], bool]:
    """Every router applied each engine's seq as of now (or later) and holds exactly its true cache."""
    targets = {e.name: e.last_seq() for e in engines}

    def cond() -> bool:
        return all(
            r.applied.get(e.name, -1) >= targets[e.name] and r.state(e.name) == e.truth()
            for r in routers
            for e in engines
        )

    return cond


def stored_seqs(url: str, subject: str, stream: str = "KV") -> list[int]:
    """The engine seq header of every message stored on `subject`, in stream order."""
    import asyncio

    from nats.js.api import DeliverPolicy

    from kvevents.jetstream.link import H_SEQ, close, connect

    async def main() -> list[int]:
        nc = await connect(NatsOptions(url), give_up_after_s=5.0)
        try:
            js = nc.jetstream()
            info = await js.stream_info(stream, subjects_filter=subject)
            total = int((info.state.subjects or {}).get(subject, 0))
            out: list[int] = []
            if not total:
                return out
            done = asyncio.Event()

            async def cb(msg) -> None:
                out.append(int(msg.headers[H_SEQ]))
                if len(out) >= total:
                    done.set()

            sub = await js.subscribe(subject, cb=cb, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
            await asyncio.wait_for(done.wait(), 10.0)
            await sub.unsubscribe()
            return out
        finally:
            await close(nc)

    return asyncio.run(main())


def consumer_names(url: str, stream: str = "KV") -> list[str]:
    """The names of the stream's durable consumers, as the server lists them."""
    import asyncio

    from kvevents.jetstream.link import close, connect

    async def main() -> list[str]:
        nc = await connect(NatsOptions(url), give_up_after_s=5.0)
        try:
            infos = await nc.jetstream().consumers_info(stream)
            return sorted(i.name for i in infos if i.config.durable_name)
        finally:
            await close(nc)

    return asyncio.run(main())


@contextmanager
def bridged_engine(url: str, seed: int, batches: int, name: str = "w0") -> Iterator[tuple[Engine, Any]]:
    """An engine that published `batches` steps through a started Bridge into stream KV, every
    batch stored before this yields (engine, bridge); both closed after."""
    from kvevents.jetstream.bridge import Bridge
    from kvevents.jetstream.link import live_subject
    from tests.helpers.wait import wait_until

    e = Engine(name, seed)
    bridge = Bridge([e.source], "KV", NatsOptions(url), snapshot_every_s=3600, request_timeout_s=0.5)
    bridge.start()
    try:
        assert bridge.wait_connected(10)
        e.step(batches)
        last = e.last_seq()
        wait_until(
            "the stream holds every batch",
            lambda: set(range(last + 1)) <= set(stored_seqs(url, live_subject("KV", name, 0))),
            timeout=20,
        )
        yield e, bridge
    finally:
        bridge.stop()
        e.close()
