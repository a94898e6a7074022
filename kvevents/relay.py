"""`kvevents relay`: kvevents' publisher beside an engine that cannot load it (vLLM 0.33, or any engine
speaking the wire).

The relay follows the engine's loopback stream with a `Subscriber` (full gap repair by replay) and
republishes every batch, payload bytes unchanged, through one kvevents `Publisher` per dp rank: its
own seqs and epoch, snapshots from its live view, heartbeats, KVE/DESCRIBE, CURVE and metrics. The
engine's rank r is followed on its ports + r and republished on the relay's ports + r (the
transport's per-rank port rule), so one relay serves every rank of one engine.

What downstream consumers may rely on (schemas/README.md, "Transport in one page"):
- a batch the relay could not get (an unrecoverable gap, an engine restart) is never silently
  skipped: the subscriber's `Reset` for that rank is republished as `AllBlocksCleared` before the
  batches that follow, so no consumer keeps blocks the engine no longer has;
- a relay restart is a new epoch: consumers resync from the new relay's snapshot, which the relay
  rebuilds from the engine's replay ring, read at start (its warm start: engines send no
  heartbeats, so the relay would otherwise learn of the stream only at the engine's next batch).
  Until it has relayed a batch (an engine that did not answer, an empty ring) it sends no
  heartbeats either, and consumers keep what the previous relay gave them (stale, not emptied).

Threads: the subscriber's thread calls `_on_delivery` / `_on_reset`; `Publisher.publish` is
thread-safe, and `stats()` reads counters under the relay's lock.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kvevents.events import AllBlocksCleared
from kvevents.feed import Delivery, Reset
from kvevents.zeromq.engine_requests import EngineRequestError, replay_replies
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.publisher_config import PublisherConfig
from kvevents.zeromq.security import client_context
from kvevents.zeromq.source import Source
from kvevents.zeromq.subscriber import Subscriber
from kvevents.zeromq.wire import offset_endpoint

__all__ = ["Relay", "RelayStats", "MAX_RANKS"]

log = logging.getLogger("kvevents.relay")

MAX_RANKS = 64  # the subscriber's own per-source rank bound: one relay, at most this many engine ranks
WARM_START_S = 2.0  # how long start() may spend reading the engine's replay rings, all ranks together
WARM_REPLY_S = 1.0  # the longest wait for one reply of a rank's ring


@dataclass(slots=True)
class RelayStats:
    """What the relay did, per run: batches relayed (by kind), resets turned into AllBlocksCleared,
    batches that could not be republished (a payload the publisher refused)."""

    relayed: dict[str, int] = field(default_factory=lambda: {"live": 0, "replay": 0, "snapshot": 0})
    resets: dict[str, int] = field(default_factory=dict)  # reason -> count
    failed: int = 0
    warm: int = 0  # batches read from the engine's replay rings at start (relayed among "live")

    def as_dict(self) -> dict[str, Any]:
        return {
            "relayed": dict(self.relayed),
            "resets": dict(self.resets),
            "failed": self.failed,
            "warm_start_batches": self.warm,
        }


class Relay:
    """One engine's stream, gap-repaired, republished through kvevents publishers (one per dp rank).

    `engine`: the engine's rank-0 live endpoint, replay endpoint and name (rank r: ports + r);
    `config`: the relay's own publisher settings for rank 0 (its `dp_rank` must be 0; rank r gets
    ports + r); `ranks`: how many dp ranks the engine runs. `subscriber_options` go to the
    `Subscriber` (request timeouts, stale_after_s, a clock for tests). `warm_start_s`: how long
    `start()` may spend reading the engine's replay rings (0: no warm start).
    """

    def __init__(
        self,
        engine: Source,
        config: PublisherConfig,
        *,
        ranks: int = 1,
        topic: str = "",
        subscriber_options: dict[str, Any] | None = None,
        warm_start_s: float = WARM_START_S,
    ) -> None:
        if not 1 <= ranks <= MAX_RANKS:
            raise ValueError(f"relay: ranks must be in 1..{MAX_RANKS}, got {ranks}")
        if config.dp_rank != 0:
            raise ValueError(
                f"relay: the publisher config is rank 0's (rank r gets ports + r), got dp_rank {config.dp_rank}"
            )
        self.engine_name = str(engine.name)
        self.warm_start_s = warm_start_s
        self._started = False
        self._sources = [self._rank_source(engine, r, ranks) for r in range(ranks)]
        self._rank_of = {str(s.name): r for r, s in enumerate(self._sources)}
        self._lock = threading.Lock()
        self._stats = RelayStats()
        self._publishers: list[Publisher] = []
        # no heartbeat before the first batch relayed (warm start or the engine's next): until then the
        # relay does not know the engine's state, and a new epoch announced now would have consumers
        # resync to an empty snapshot
        config = config.model_copy(update={"heartbeat_before_first": False})
        try:
            for r in range(ranks):
                cfg = config.model_copy(update={"dp_rank": r}) if r else config
                if r and self._publishers[0].metrics_port is not None:  # every rank on one metrics port
                    cfg = cfg.model_copy(update={"metrics_port": self._publishers[0].metrics_port})
                self._publishers.append(Publisher(cfg))
            opts = dict(subscriber_options or {})
            if config.metrics_port is not None:
                opts.setdefault("metrics_port", self._publishers[0].metrics_port)
            self._subscriber = Subscriber(
                self._sources, topic=topic, on_delivery=self._on_delivery, on_reset=self._on_reset, **opts
            )
        except BaseException:
            for pub in self._publishers:
                pub.close(timeout=0.2)
            raise

    @staticmethod
    def _rank_source(engine: Source, rank: int, ranks: int) -> Source:
        """Rank r of the engine: its live and replay ports + r, named NAME (one rank) or NAME/dpR."""
        name = str(engine.name) if ranks == 1 else f"{engine.name}/dp{rank}"
        replay = offset_endpoint(engine.replay_endpoint, rank) if engine.replay_endpoint else None
        return Source(
            offset_endpoint(engine.endpoint, rank), replay, name, engine.bind, engine.curve, engine.start or "oldest"
        )

    # ------------------------------------------------------------------ public API
    @property
    def publishers(self) -> list[Publisher]:
        """The relay's publishers, index = dp rank (their endpoints, epochs, stats)."""
        return list(self._publishers)

    @property
    def subscriber(self) -> Subscriber:
        """The subscriber following the engine (its status and counters)."""
        return self._subscriber

    @property
    def sources(self) -> list[Source]:
        """The engine's per-rank sources the relay follows."""
        return list(self._sources)

    def start(self) -> Relay:
        """The warm start, then follow the engine on the subscriber's thread; returns self."""
        if self.warm_start_s > 0 and not self._started:
            self._warm_start()
        self._started = True
        self._subscriber.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stop following, then close every publisher (idempotent)."""
        self._subscriber.stop(timeout=timeout)
        for pub in self._publishers:
            pub.close(timeout=timeout)

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> dict[str, Any]:
        """Relayed batches by kind, resets by reason, failures; plus each rank's publisher stats."""
        with self._lock:
            out = self._stats.as_dict()
        out["publishers"] = [pub.stats() for pub in self._publishers]
        out["subscriber"] = dict(self._subscriber.counters())
        return out

    def _warm_start(self) -> None:
        """Each rank's replay ring, read now and offered to the subscriber as the stream so far, so the
        relay has the engine's state before the engine's next batch. A ring cut short (no answer in
        the time left, a bad reply) is offered as far as it came; the engine's next batch then shows
        the subscriber the rest as a gap, which it replays."""
        deadline = time.monotonic() + self.warm_start_s
        for src in self._sources:
            left = deadline - time.monotonic()
            if not src.replay_endpoint or left <= 0:
                continue
            ctx = client_context(src.curve)
            n = 0
            try:
                for reply in replay_replies(
                    src.replay_endpoint, 0, timeout=min(left, WARM_REPLY_S), within=left, context=ctx
                ):
                    self._subscriber.offer(str(src.name), reply)
                    n += not reply.is_end
            except EngineRequestError as exc:
                log.info("relay: %s: warm start cut short after %d batches (%s)", src.name, n, exc)
            with self._lock:
                self._stats.warm += n

    # ------------------------------------------------------------------ subscriber callbacks
    def _publisher_for(self, source: str) -> Publisher | None:
        rank = self._rank_of.get(source)
        return None if rank is None else self._publishers[rank]

    def _on_delivery(self, d: Delivery) -> None:
        pub = self._publisher_for(d.source)
        if pub is None:  # pragma: no cover - the subscriber only follows our sources
            return
        try:
            if d.payload:
                pub.publish_payload(d.payload)  # the engine's bytes, under the relay's seq
            else:
                pub.publish(d.batch.events, d.batch.ts)
        except ValueError as exc:  # a payload the publisher cannot re-read: counted, never fatal
            with self._lock:
                self._stats.failed += 1
            log.warning("relay: batch %s of %s not republished: %s", d.seq, d.source, exc)
            return
        with self._lock:
            self._stats.relayed[str(d.kind)] = self._stats.relayed.get(str(d.kind), 0) + 1

    def _on_reset(self, r: Reset) -> None:
        """A restart or an unrecoverable gap: downstream must drop that rank's blocks first."""
        pub = self._publisher_for(r.source)
        if pub is None:  # pragma: no cover
            return
        pub.publish([AllBlocksCleared()])
        with self._lock:
            self._stats.resets[str(r.reason)] = self._stats.resets.get(str(r.reason), 0) + 1
        log.info("relay: %s reset (%s): republished as AllBlocksCleared", r.source, r.reason)
