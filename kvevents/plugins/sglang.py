"""kvevents' Publisher as SGLang's KV-event publisher "kvevents" (SGLang >= 0.5.20 plug-in).

SGLang loads entry points of group `sglang.srt.plugins` in its scheduler process before the
scheduler is built; `register()` adds the publisher name "kvevents" to SGLang's
`EventPublisherFactory`, so `--kv-events-config '{"publisher": "kvevents", "endpoint": ...,
"replay_endpoint": ...}'` publishes through `kvevents.zeromq.publisher.Publisher`: the same
`[ts, events, rank]` batches SGLang's own decoder reads, plus KVE/SNAPSHOT, KVE/DESCRIBE with an
epoch, heartbeats, the bounded replay ROUTER, metrics and CURVE (schemas/README.md, "Transport in
one page"). SGLang's config carries only its own fields, so the rest comes from the environment
(ENV_* below). Nothing of SGLang is imported here except inside `register()`.
"""

from __future__ import annotations

import atexit
import enum
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, Event
from kvevents.zeromq.publisher import Publisher, PublisherConfig

__all__ = [
    "PUBLISHER_NAME",
    "ENV_CURVE_SECRET",
    "ENV_CURVE_ALLOW",
    "ENV_METRICS_PORT",
    "ENV_HEARTBEAT_S",
    "SGLangPublisher",
    "convert_events",
    "publisher_config",
    "register",
]

log = logging.getLogger("kvevents.plugins.sglang")

PUBLISHER_NAME = "kvevents"
ENV_CURVE_SECRET = "KVEVENTS_CURVE_SECRET"  # the server certificate with its secret key (kvevents keys generate)
ENV_CURVE_ALLOW = "KVEVENTS_CURVE_ALLOW"  # a directory of allowed client certificates (*.key)
ENV_METRICS_PORT = "KVEVENTS_METRICS_PORT"  # /metrics on this port + dp rank (0: a free port per rank)
ENV_HEARTBEAT_S = "KVEVENTS_HEARTBEAT_S"  # idle heartbeat interval in seconds (0: none; default 1)

#: SGLang's KVEventsConfig fields (0.5.20) besides `publisher`: every one is honoured.
SGLANG_FIELDS = ("endpoint", "replay_endpoint", "buffer_steps", "hwm", "max_queue_size", "topic")


def register() -> None:
    """The entry point: make "kvevents" a publisher SGLang's factory can build (idempotent)."""
    from sglang.srt.disaggregation.kv_events import EventPublisherFactory

    try:
        EventPublisherFactory.register_publisher(PUBLISHER_NAME, SGLangPublisher)
    except KeyError:  # loaded twice in one process: ours is there already, or someone else's
        log.info("SGLang publisher %r was already registered; keeping it", PUBLISHER_NAME)


def _ipc_rank(endpoint: str, rank: int) -> str:
    """ipc paths of ranks > 0 get a `_dp{r}` suffix, as inproc names do (SGLang's own publisher
    refuses them); tcp ports and inproc names are offset by the Publisher itself (dp_rank)."""
    if rank > 0 and endpoint.startswith("ipc://"):
        return f"{endpoint}_dp{rank}"
    return endpoint


def _env_float(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number of seconds") from None


def _env_port(env: Mapping[str, str], rank: int) -> int | None:
    raw = env.get(ENV_METRICS_PORT, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) > 65535:
        raise ValueError(f"{ENV_METRICS_PORT}={raw!r}: expected a port in 0..65535")
    port = int(raw)
    return port if port == 0 else port + rank


def publisher_config(
    attn_dp_rank: int = 0,
    endpoint: str = "tcp://*:5557",
    replay_endpoint: str | None = None,
    buffer_steps: int = 10_000,
    hwm: int = 100_000,
    max_queue_size: int = 100_000,
    topic: str = "",
    env: Mapping[str, str] | None = None,
) -> PublisherConfig:
    """SGLang's KVEventsConfig fields (and the ENV_* variables) as a kvevents PublisherConfig.

    The dp rank offsets both endpoints as SGLang does and is the rank every batch carries.
    ValueError for what kvevents cannot honour (e.g. max_queue_size 0, which SGLang takes as unbounded).
    """
    env = os.environ if env is None else env
    if isinstance(attn_dp_rank, bool) or not isinstance(attn_dp_rank, int) or attn_dp_rank < 0:
        raise ValueError(f"attn_dp_rank must be a non-negative integer, got {attn_dp_rank!r}")
    if max_queue_size < 1:
        raise ValueError(f"max_queue_size must be >= 1, got {max_queue_size} (kvevents never queues without bound)")
    heartbeat = _env_float(env, ENV_HEARTBEAT_S)
    extra: dict[str, Any] = {} if heartbeat is None else {"heartbeat_interval_s": heartbeat}
    return PublisherConfig(
        endpoint=_ipc_rank(endpoint, attn_dp_rank),
        replay_endpoint=_ipc_rank(replay_endpoint, attn_dp_rank) if replay_endpoint else None,
        buffer_steps=buffer_steps,
        hwm=hwm,
        max_queue_size=max_queue_size,
        topic=topic,
        dp_rank=attn_dp_rank,  # offsets tcp ports (+r) and inproc names (_dp{r}); every batch carries it
        metrics_port=_env_port(env, attn_dp_rank),
        curve_secret_key_file=env.get(ENV_CURVE_SECRET) or None,
        curve_allow_dir=env.get(ENV_CURVE_ALLOW) or None,
        **extra,
    )


def _medium(value: Any) -> str | None:
    """SGLang's StorageMedium (a str enum) as its plain value: "GPU", "CPU_PINNED", ..."""
    if isinstance(value, enum.Enum):
        return str(value.value)
    return value if value is None else str(value)


def convert_events(events: Iterable[Any]) -> tuple[list[Event], int]:
    """SGLang's event structs (or kvevents' own) as kvevents events, by class name, in order.

    Returns (events, unknown): an event of another kind is counted and left out.
    """
    out: list[Event] = []
    unknown = 0
    for ev in events:
        if isinstance(ev, (BlockStored, BlockRemoved, AllBlocksCleared)):
            out.append(ev)
            continue
        kind = type(ev).__name__
        if kind == "BlockStored":
            out.append(
                BlockStored(
                    block_hashes=list(ev.block_hashes),
                    parent_block_hash=ev.parent_block_hash,
                    token_ids=list(ev.token_ids),
                    block_size=ev.block_size,
                    lora_id=getattr(ev, "lora_id", None),
                    medium=_medium(getattr(ev, "medium", None)),
                    lora_name=getattr(ev, "lora_name", None),
                    cache_salt=getattr(ev, "cache_salt", None),
                    session_id=getattr(ev, "session_id", None),
                )
            )
        elif kind == "BlockRemoved":
            out.append(BlockRemoved(list(ev.block_hashes), _medium(getattr(ev, "medium", None))))
        elif kind == "AllBlocksCleared":
            out.append(AllBlocksCleared())
        else:
            unknown += 1
    return out, unknown


class SGLangPublisher:
    """SGLang's EventPublisher interface (`publish(batch)`, `shutdown()`) over a kvevents Publisher.

    Built by SGLang's `EventPublisherFactory.create(config, attn_dp_rank)` with the config's fields.
    `publish` never waits: the batch is converted and handed to the Publisher's bounded send queue
    (max_queue_size); a full queue drops the batch, counted, its seq consumed (consumers see the gap
    and heal it by snapshot).
    """

    def __init__(self, attn_dp_rank: int = 0, **fields: Any) -> None:
        unknown = sorted(set(fields) - set(SGLANG_FIELDS))
        if unknown:  # a newer SGLang's field: said once, never silently honoured or dropped
            log.warning("kvevents publisher: SGLang config fields not understood, ignored: %s", ", ".join(unknown))
        known = {k: v for k, v in fields.items() if k in SGLANG_FIELDS}
        self.config = publisher_config(attn_dp_rank, **known)
        self.rank = attn_dp_rank
        self.publisher = Publisher(self.config, send_mode="queue")
        self._lock = threading.Lock()
        self._counts = {"unknown_events": 0, "foreign_rank_batches": 0}
        self._running = True
        atexit.register(self.shutdown)
        log.info(
            "kvevents publisher for SGLang: rank %d on %s (replay %s), epoch %d",
            self.rank,
            self.publisher.endpoint,
            self.publisher.replay_endpoint,
            self.publisher.epoch,
        )

    @property
    def endpoint(self) -> str:
        return self.publisher.endpoint

    @property
    def replay_endpoint(self) -> str | None:
        return self.publisher.replay_endpoint

    def publish(self, events: Any) -> None:
        """Publish one SGLang EventBatch (`ts`, `events`, `attn_dp_rank`) under this rank."""
        if not self._running:
            raise RuntimeError("Publisher is closed")
        converted, unknown = convert_events(events.events)
        rank = getattr(events, "attn_dp_rank", None)
        if unknown or (rank is not None and rank != self.rank):
            with self._lock:
                self._counts["unknown_events"] += unknown
                if rank is not None and rank != self.rank:
                    self._counts["foreign_rank_batches"] += 1
        self.publisher.publish(converted, ts=events.ts)

    def stats(self) -> dict[str, int]:
        """The Publisher's counters plus this adapter's (unknown_events, foreign_rank_batches)."""
        out = self.publisher.stats()
        with self._lock:
            out.update(self._counts)
        return out

    def shutdown(self) -> None:
        """Flush for up to 1 s (SGLang's own shutdown timeout), then close both sockets."""
        if not self._running:
            return
        self._running = False
        atexit.unregister(self.shutdown)
        self.publisher.close(1.0)
