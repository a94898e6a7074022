"""The demo run's moves on its publishers and its router: publish a worker's step, restart a
worker, drop and heal a burst, wait (bounded) until the router applied what was published, route a
request within the load bound, compare the router's index with the caches, probe a vLLM prefix."""

from __future__ import annotations

import random
import time
from typing import Any

from kvevents.consumers.service.core import RouterService
from kvevents.demo.cluster import BoundedLoad, Cluster, DemoWorker, VllmClusterWorker
from kvevents.demo.config import DemoConfig
from kvevents.events import BlockStored, Event
from kvevents.hashing import Namespace, event_hashes, to_int64
from kvevents.sim.worker import Request
from kvevents.zeromq.publisher import Publisher

__all__ = [
    "check_stored_hashes",
    "open_publisher",
    "recreate",
    "publish_step",
    "expected_copies",
    "choose",
    "flush_drops",
    "wait_applied",
    "wait_restart_seen",
    "restart_worker",
    "wait_settled",
    "progress_figures",
    "probe_vllm_prefix",
]

LOOPBACK = "tcp://127.0.0.1:*"


def check_stored_hashes(request: Request, events: list[Event], page_size: int) -> tuple[int, int]:
    """(events checked, events wrong): every BlockStored must be a run of the request's event
    hashes recomputed WITHOUT extra_key (salt only), with the right parent and cache_salt."""
    stored = [e for e in events if type(e) is BlockStored]
    if not stored:
        return 0, 0
    usable = len(request.tokens) - len(request.tokens) % page_size
    salt = request.namespace.cache_salt
    want = [to_int64(h) for h in event_hashes(request.tokens[:usable], page_size, Namespace(cache_salt=salt))]
    pos = {h: i for i, h in enumerate(want)}
    bad = 0
    for e in stored:
        k = pos.get(e.block_hashes[0]) if e.block_hashes else None
        ok = (
            k is not None
            and want[k : k + len(e.block_hashes)] == list(e.block_hashes)
            and e.parent_block_hash == (want[k - 1] if k else None)
            and e.cache_salt == salt
        )
        bad += 0 if ok else 1
    return len(stored), bad


def open_publisher(
    cfg: DemoConfig, endpoint: str = LOOPBACK, replay: str = LOOPBACK, *, vllm: bool = False
) -> Publisher:
    """A worker's publisher, bound with a replay endpoint; a vLLM worker's has no snapshots (vLLM's
    feature set): its payloads go out as encoded."""
    return Publisher(
        endpoint=endpoint, replay_endpoint=replay, bind=True, heartbeat_interval_s=cfg.heartbeat_s, snapshots=not vllm
    )


def recreate(cfg: DemoConfig, old: Publisher, *, vllm: bool = False) -> Publisher:
    """Close a publisher and bind a new one (new epoch, seq from 0) on the same two ports."""
    endpoint, replay = old.endpoint, old.replay_endpoint
    old.close(timeout=0.2)  # close() releases the ports before it returns
    return open_publisher(cfg, endpoint, replay or LOOPBACK, vllm=vllm)


def publish_step(pub: Publisher, worker: DemoWorker) -> list[Event]:
    """Publish what the worker queued (vLLM: its own payload, as encoded); returns contract events."""
    if isinstance(worker, VllmClusterWorker):
        payload = worker.take_payload()
        if payload is not None:
            pub.publish_payload(payload)
        return []
    events = worker.take_events()
    if events:
        pub.publish(events)
    return events


def expected_copies(worker: DemoWorker) -> Any:
    """The copies a router's index must hold for this worker (contract keys)."""
    if isinstance(worker, VllmClusterWorker):
        return worker.expected_copies()
    return worker.cache.published_copies()


def choose(ranked: list, balance: BoundedLoad, tie: random.Random) -> int:
    """Best-scored worker within the load bound; ties by load hint, then in an order drawn from `tie`
    (the router's own tie order follows its index ids, which depend on which stream it heard first).

    Workers the router has not heard from yet count as score 0, least loaded first."""
    shuffled = list(balance.names)
    tie.shuffle(shuffled)
    rank = {name: i for i, name in enumerate(shuffled)}
    ranked = sorted(ranked, key=lambda s: (-s.score, s.load, rank.get(s.worker, len(rank))))
    order = [s.worker for s in ranked]
    seen = set(order)
    loads = balance.loads()
    order += sorted((n for n in balance.names if n not in seen), key=lambda n: loads[n])
    index = {n: i for i, n in enumerate(balance.names)}
    for name in order:
        if name in index and balance.allowed(name):
            return index[name]
    return min(range(len(balance.names)), key=lambda i: loads[balance.names[i]])


def flush_drops(pub: Publisher, burst: int, mark: int) -> None:
    """Publish empty batches (heartbeats) until the drop burst is used up, plus one the
    subscriber receives live and so sees the gap: replay then heals the burst."""
    pending = burst - (pub.stats()["batches_published"] - mark)
    for _ in range(max(0, pending) + 1):
        pub.publish([])


def wait_applied(
    service: RouterService,
    names: list[str],
    pubs: list[Publisher],
    timeout_s: float,
    *,
    nudge: bool = False,
    poll_s: float = 0.01,
) -> bool:
    """Wait (bounded) until the router applied every seq these publishers published, replayed ones too.

    nudge: SUB sockets drop what is sent before they connect, so each publisher still behind
    sends a heartbeat now and then; it reaches the router live and the gap before it is replayed.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        applied = [service.applied_seq(name) for name in names]
        behind = [p for a, p in zip(applied, pubs) if a is None or a < p.stats()["next_seq"] - 1]
        if not behind:
            return True
        for p in behind if nudge else ():
            p.publish([])
        time.sleep(0.02 if nudge else poll_s)
    return False


def wait_restart_seen(service: RouterService, before: int, timeout_s: float) -> bool:
    """Wait (bounded) until the router reset a source for a restart once more than `before` times."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if service.stats()["resets"].get("restart", 0) > before:
            return True
        time.sleep(0.005)
    return False


def restart_worker(cfg: DemoConfig, live: Cluster, shadows: dict, pub: Publisher, i: int, retired: list) -> Publisher:
    """A worker crash: every cluster resets worker i; the live one restarts its publisher too."""
    retired.append(pub.stats())
    new = recreate(cfg, pub, vllm=isinstance(live.workers[i], VllmClusterWorker))
    live.restart(i)
    for cluster, _ in shadows.values():
        cluster.restart(i)
    publish_step(new, live.workers[i])  # AllBlocksCleared from the fresh engine
    return new


def wait_settled(
    cfg: DemoConfig, service: RouterService, live: Cluster, pubs: list[Publisher], names: list[str]
) -> tuple[bool, float, list[str]]:
    """Wait until the router applied every published seq and its index equals the caches."""
    start = time.monotonic()
    truth = {name: expected_copies(w) for name, w in zip(names, live.workers)}
    mismatched = list(names)
    while True:
        targets = [p.stats()["next_seq"] - 1 for p in pubs]
        applied = [service.applied_seq(name) for name in names]
        caught_up = all(a is not None and a >= t for a, t in zip(applied, targets))
        if caught_up:
            with service.lock:
                mismatched = [name for name in names if service.index.copies(name) != truth[name]]
            if not mismatched:
                return True, time.monotonic() - start, []
        if time.monotonic() - start > cfg.settle_timeout_s:
            return False, time.monotonic() - start, mismatched
        time.sleep(0.05)


def progress_figures(live: Cluster, shadows: dict, service: RouterService) -> dict[str, Any]:
    """Requests so far, each policy's device hit rate, the events the router applied."""
    out: dict[str, Any] = {"requests": live.stats.requests}
    for name, stats in [("prefix", live.stats)] + [(k, c.stats) for k, (c, _) in shadows.items()]:
        out[name] = stats.device_hit_tokens / max(1, stats.tokens)
    out["events_applied"] = service.events_applied
    return out


def probe_vllm_prefix(
    cfg: DemoConfig, service: RouterService, live: Cluster, pubs: list[Publisher], names: list[str], rng: random.Random
) -> dict[str, Any]:
    """One fresh salted LoRA prompt cached on a contract worker and on a vLLM worker: the router must
    credit both with every page, and a longer request with the same prefix pages on both."""
    ci = next(i for i, w in enumerate(live.workers) if not isinstance(w, VllmClusterWorker))
    vi = next(i for i, w in enumerate(live.workers) if isinstance(w, VllmClusterWorker))
    pages = 8
    tokens = [rng.randrange(100_000, 200_000) for _ in range(pages * cfg.page_size)]
    req = Request(tokens, Namespace("lora-probe", "tenant-probe"), "lora-probe")
    for i in (ci, vi):
        live.workers[i].serve(req)
        publish_step(pubs[i], live.workers[i])
    applied = wait_applied(service, [names[ci], names[vi]], [pubs[ci], pubs[vi]], cfg.settle_timeout_s)
    longer = tokens + [rng.randrange(100_000, 200_000) for _ in range(3 * cfg.page_size)]
    found: dict[str, dict[str, int]] = {}
    for label, toks in (("prefix", tokens), ("longer", longer)):
        got = {s.worker: s.matched_pages for s in service.score(toks, "tenant-probe", "lora-probe")}
        found[label] = {"contract": got.get(names[ci], 0), "vllm": got.get(names[vi], 0)}
    ok = applied and all(f["contract"] == f["vllm"] == pages for f in found.values())
    return {"contract_worker": names[ci], "vllm_worker": names[vi], "pages": pages, "matched_pages": found, "ok": ok}
