"""The demo run: simulated workers publishing on loopback, one router subscribed to all, faults, checks.

Timeline (its clock starts once the router follows every publisher): requests from `Workload`
are routed by the prefix router (live cluster, whose workers publish every step with their own
Publisher) and, in shadow, by random and round-robin policies on their own clusters. Around 40%
of the run one publisher drops a burst of live frames (replay heals them); around 60% one
worker restarts (its publisher is closed and recreated on the same
ports with a new epoch; every cluster resets that worker). At the end the router must have
caught up and its index must equal the union of the live workers' caches.

A mixed fleet (`fleet="mixed"`, the default) runs half of the workers as vLLM 0.33 workers
(VllmClusterWorker: vLLM's hashes and events, published as vLLM encodes them); the router keys
every source automatically (contract or token-derived keys, kvevents.consumers.keying) and routes all of
them. Extra live checks: each source got the right key mode, and a prefix cached on a vLLM
worker is found exactly as the same prefix cached on a contract worker.

`requests=N` (instead of a duration) runs a reproducible demo: the faults fire at request counts,
the router applies each batch before the next request is scored, and the drop burst is flushed at
once, so every figure in REPRODUCIBLE is the same for the same seed; timings are not.
Ctrl-C (SIGINT, main thread) ends the traffic early: the run settles and reports what it measured.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from kvevents.consumers.service.core import RouterService
from kvevents.demo.cluster import (
    BoundedLoad,
    Cluster,
    DemoWorker,
    VllmClusterWorker,
    fleet_engines,
    random_policy,
    round_robin_policy,
)
from kvevents.demo.timeline import Timeline
from kvevents.events import BlockStored, Event
from kvevents.hashing import Namespace, event_hashes, to_int64
from kvevents.sim.worker import Request, Workload
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.subscriber import Source

__all__ = ["DemoConfig", "run_demo", "check_stored_hashes", "REPRODUCIBLE"]

LOOPBACK = "tcp://127.0.0.1:*"
#: on_progress(elapsed_s, figures); figures["fraction"] is the share of the run done (time or requests).
#: An on_progress object with a `phase(text)` method is also told each phase of the run.
ProgressFn = Callable[[float, dict[str, Any]], None]
#: With --requests N and one seed, these figures repeat exactly (JSON paths); timings and batch counts
#: (heartbeats, replayed batches, settle time) do not.
REPRODUCIBLE = (
    "requests",
    "policies",
    "contract",
    "checks",
    "key_modes",
    "vllm_probe",
    "faults",
    "transport.events_published",
)


@dataclass
class DemoConfig:
    """Demo knobs (the CLI exposes workers, duration, seed)."""

    workers: int = 4
    duration: float = 15.0
    seed: int = 0
    page_size: int = 16
    capacity_pages: int = 4096
    drop_burst: int = 20
    heartbeat_s: float = 0.2
    settle_timeout_s: float = 15.0
    fleet: str = "mixed"
    requests: int | None = None  # a reproducible run of exactly this many requests (duration unused)

    def validate(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or not 1 <= self.workers <= 64:
            raise ValueError(f"--workers must be an integer in 1..64, got {self.workers!r}")
        if not self.duration > 0 or self.duration > 24 * 3600:
            raise ValueError(f"--duration must be > 0 seconds, got {self.duration!r}")
        if self.requests is not None and not 1 <= self.requests <= 10_000_000:
            raise ValueError(f"--requests must be in 1..10000000, got {self.requests!r}")
        if self.page_size < 1 or self.capacity_pages < 1 or self.drop_burst < 0:
            raise ValueError("page_size and capacity_pages must be >= 1, drop_burst >= 0")
        fleet_engines(self.fleet, self.workers)


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


def _publisher(cfg: DemoConfig, endpoint: str = LOOPBACK, replay: str = LOOPBACK, *, vllm: bool = False) -> Publisher:
    # a vLLM worker has replay but no snapshots (vLLM's feature set): its payloads go out as encoded
    return Publisher(
        endpoint=endpoint, replay_endpoint=replay, bind=True, heartbeat_interval_s=cfg.heartbeat_s, snapshots=not vllm
    )


def _recreate(cfg: DemoConfig, old: Publisher, *, vllm: bool = False) -> Publisher:
    """Close a publisher and bind a new one (new epoch, seq from 0) on the same two ports."""
    endpoint, replay = old.endpoint, old.replay_endpoint
    old.close(timeout=0.2)  # close() releases the ports before it returns
    return _publisher(cfg, endpoint, replay or LOOPBACK, vllm=vllm)


def _publish_step(pub: Publisher, worker: DemoWorker) -> list[Event]:
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


def _truth(worker: DemoWorker) -> Any:
    """The copies a router's index must hold for this worker (contract keys)."""
    if isinstance(worker, VllmClusterWorker):
        return worker.expected_copies()
    return worker.cache.published_copies()


class _Interrupt:
    """The first Ctrl-C ends the traffic (the run settles and reports); a second one aborts."""

    def __init__(self) -> None:
        self.hit = threading.Event()
        self._old: Any = None

    def __enter__(self) -> _Interrupt:
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.hit.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *exc: object) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def run_demo(cfg: DemoConfig, on_progress: ProgressFn | None = None) -> dict[str, Any]:
    """Run the whole demo; returns the figures and a `checks` map (name -> bool), plus `ok`."""
    cfg.validate()
    with _Interrupt() as interrupt:
        return _run(cfg, on_progress, interrupt)


def _run(cfg: DemoConfig, on_progress: ProgressFn | None, interrupt: _Interrupt) -> dict[str, Any]:
    phase: Callable[[str], None] = getattr(on_progress, "phase", None) or (lambda _text: None)
    n = cfg.workers
    rng = random.Random(cfg.seed)
    engines = fleet_engines(cfg.fleet, n)
    kw: dict[str, Any] = {"page_size": cfg.page_size, "capacity_pages": cfg.capacity_pages, "engines": engines}
    live = Cluster("prefix", n, **kw)
    shadows = {
        "random": (Cluster("random", n, **kw), random_policy(n, cfg.seed + 1)),
        "round_robin": (Cluster("round_robin", n, **kw), round_robin_policy(n)),
    }
    names = [w.name for w in live.workers]
    pubs: list[Publisher] = []
    service: RouterService | None = None
    retired: list[dict[str, int]] = []
    try:
        phase(f"starting {n} publisher{'s' * (n != 1)} on loopback and a router subscribed to all")
        for engine in engines:
            pubs.append(_publisher(cfg, vllm=engine == "vllm"))
        sources = [Source(p.endpoint, p.replay_endpoint, name) for p, name in zip(pubs, names)]
        service = RouterService(
            sources,
            page_size=cfg.page_size,
            seed=cfg.seed,
            stale_after_s=max(2.0, 10 * cfg.heartbeat_s),
            default_key_mode="auto",
        )
        service.start()
        for w, p in zip(live.workers, pubs):  # the construction-time AllBlocksCleared (vLLM: nothing)
            if not _publish_step(p, w):
                p.publish([])
        # Faults only test something once the router follows every stream (a restart it never
        # saw the old epoch of is just a first contact), so the clock starts after the join.
        _wait_applied(service, names, pubs, cfg.settle_timeout_s, nudge=True)
        balance = BoundedLoad(names, window=16 * n)
        drop_at, restart_at = 0.4, 0.6  # shares of the run (time, or requests with cfg.requests)
        phase(
            f"router follows every publisher; routing {_plural(cfg.requests, 'request')}"
            if cfg.requests
            else f"router follows every publisher; routing requests for {cfg.duration:g} s"
        )
        drop_victim = rng.randrange(n)
        restart_victim = (drop_victim + 1) % n if n > 1 else 0
        while engines[restart_victim] == "vllm":  # vLLM has no snapshots: the restart hits a contract worker
            restart_victim = (restart_victim + 1) % n
        faults: dict[str, Any] = {"dropped_live": 0, "drop_worker": None, "restart_worker": None}
        drop_mark = 0
        hash_checked = hash_bad = hash_checked_extra = 0
        routed_to_best = 0
        tie = random.Random(cfg.seed + 2)
        requests = iter(Workload(seed=cfg.seed, page_size=cfg.page_size))
        policy_stats = {"prefix": live.stats, **{k: c.stats for k, (c, _) in shadows.items()}}
        timeline = Timeline(service, names, pubs, policy_stats, interval_s=max(0.25, cfg.duration / 240))
        start = time.monotonic()
        last_progress = -1.0
        flushed = False  # the drop burst was used up at once (cfg.requests)
        while not interrupt.hit.is_set():
            elapsed = time.monotonic() - start
            done = live.stats.requests / cfg.requests if cfg.requests else elapsed / cfg.duration
            if done >= 1.0:
                break
            if faults["drop_worker"] is None and done >= drop_at:
                phase(
                    f"t={elapsed:.1f}s: dropping {cfg.drop_burst} live frames of {names[drop_victim]} (replay must heal them)"
                )
                drop_mark = pubs[drop_victim].stats()["batches_published"]
                pubs[drop_victim].drop_live(cfg.drop_burst)
                faults.update(dropped_live=cfg.drop_burst, drop_worker=names[drop_victim])
                timeline.mark(elapsed, "drop", names[drop_victim], f"{cfg.drop_burst} live frames dropped")
                if cfg.requests:  # reproducible: the burst eats heartbeats now, not a timing-dependent share of batches
                    _flush_drops(pubs[drop_victim], cfg.drop_burst, drop_mark)
                    _wait_applied(service, [names[drop_victim]], [pubs[drop_victim]], cfg.settle_timeout_s)
                    flushed = True
            if faults["restart_worker"] is None and done >= restart_at:
                phase(f"t={elapsed:.1f}s: restarting {names[restart_victim]} (new epoch; snapshot must resync it)")
                if restart_victim == drop_victim and not flushed:  # one worker: let replay heal the burst first
                    _flush_drops(pubs[drop_victim], cfg.drop_burst, drop_mark)
                    _wait_applied(service, [names[drop_victim]], [pubs[drop_victim]], cfg.settle_timeout_s)
                    flushed = True
                restarts_seen = service.stats()["resets"].get("restart", 0)
                pubs[restart_victim] = _restart(cfg, live, shadows, pubs[restart_victim], restart_victim, retired)
                faults["restart_worker"] = names[restart_victim]
                timeline.mark(elapsed, "restart", names[restart_victim], "new epoch")
                if cfg.requests:  # the old epoch's seqs are higher: first wait for the router to see the restart
                    _wait_restart_seen(service, restarts_seen, cfg.settle_timeout_s)
                    _wait_applied(service, [names[restart_victim]], [pubs[restart_victim]], cfg.settle_timeout_s)
            req = next(requests)
            ranked = service.score(req.tokens, req.namespace.cache_salt, req.lora_name, loads=balance.loads())
            pick = _choose(ranked, balance, tie)
            balance.record(names[pick])
            routed_to_best += 1 if ranked and ranked[0].worker == names[pick] else 0
            live.serve(pick, req)
            events = _publish_step(pubs[pick], live.workers[pick])
            if cfg.requests:  # the next score sees this batch: routing does not depend on timing
                _wait_applied(service, [names[pick]], [pubs[pick]], cfg.settle_timeout_s, poll_s=0.0002)
            checked, bad = check_stored_hashes(req, events, cfg.page_size)
            hash_checked += checked
            hash_bad += bad
            if checked and req.namespace.extra_key is not None:
                hash_checked_extra += checked
            for cluster, policy in shadows.values():
                cluster.serve(policy(req), req)
            timeline.tick(time.monotonic() - start)  # for --html: hit rates, backlog, repairs over time
            if on_progress is not None and elapsed - last_progress >= 0.2:
                last_progress = elapsed
                on_progress(elapsed, {**_progress_figures(live, shadows, service), "fraction": min(1.0, done)})
        run_s = time.monotonic() - start
        timeline.tick(run_s, force=True)
        interrupted = interrupt.hit.is_set()
        phase(
            ("interrupted (Ctrl-C)" if interrupted else "traffic done") + f" after {run_s:.1f}s and "
            f"{_plural(live.stats.requests, 'request')}; waiting for the router to catch up, then checking"
        )
        if faults["drop_worker"] is not None and not flushed:
            _flush_drops(pubs[drop_victim], cfg.drop_burst, drop_mark)
        probe = probe_vllm_prefix(cfg, service, live, pubs, names, rng) if "vllm" in engines else None
        settled, settle_s, mismatched = _settle(cfg, service, live, pubs, names)
        sub = dict(service.feed.counters())
        svc = service.stats()
        key_modes = {name: service.keyer.mode(name) for name in names}
    finally:
        if service is not None:
            service.stop()
        for p in pubs:
            p.close(timeout=0.2)
    pub_stats = [p.stats() for p in pubs] + retired
    content_errors = sum(w.content_errors for c in [live] + [c for c, _ in shadows.values()] for w in c.workers)
    policies = {"prefix": live.stats.summary(n)}
    policies.update({name: c.stats.summary(n) for name, (c, _) in shadows.items()})
    for name, st in [("prefix", live.stats)] + [(k, c.stats) for k, (c, _) in shadows.items()]:
        policies[name].update(  # per policy: reused on the device, loaded from the shared tier, prefilled again
            device_tokens_reused=st.device_hit_tokens,
            storage_tokens_loaded=st.storage_hit_tokens,
            prefill_tokens_recomputed=st.tokens - st.device_hit_tokens - st.storage_hit_tokens,
        )
    transport = {
        "events_published": sum(s["events_published"] for s in pub_stats),
        "batches_published": sum(s["batches_published"] for s in pub_stats),
        "events_applied": svc["events_applied"],
        "batches_applied": svc["batches"],
        "gaps_detected": sub.get("gaps", 0),
        "batches_replayed": sub.get("replayed", 0),
        "gaps_healed_by_replay": max(0, sub.get("gaps", 0) - sub.get("unrecoverable_gaps", 0)),
        "unrecoverable_gaps": sub.get("unrecoverable_gaps", 0),
        "resyncs_by_snapshot": sub.get("snapshots_applied", 0),
        "restarts_detected": sub.get("restarts", 0),
        "resets": svc["resets"],
        "losses": sub.get("losses", 0),
        "settle_s": round(settle_s, 3),
    }
    checks = {
        "no_published_hash_moved_by_extra_key": hash_bad == 0 and hash_checked_extra > 0,
        "storage_never_served_across_namespaces": content_errors == 0,
        "router_index_equals_worker_caches": settled,
        "injected_faults_observed": transport["batches_replayed"] >= 1 and transport["restarts_detected"] >= 1,
    }
    if interrupted and faults["restart_worker"] is None:  # stopped before the faults: nothing to observe
        del checks["injected_faults_observed"]
    if probe is not None:
        checks["key_mode_detected_per_source"] = all(
            key_modes[name] == ("tokens" if e == "vllm" else "contract") for name, e in zip(names, engines)
        )
        checks["vllm_prefix_found_as_on_contract_worker"] = probe["ok"]
    return {
        "workers": n,
        "fleet": cfg.fleet,
        "engines": dict(zip(names, engines)),
        "key_modes": key_modes,
        "vllm_probe": probe,
        "duration_s": round(run_s, 3),
        "seed": cfg.seed,
        "timeline": timeline.as_dict(),
        "requests_asked": cfg.requests,  # None: a time-bound run (not reproducible)
        "reproducible": list(REPRODUCIBLE) if cfg.requests and not interrupted else [],
        "interrupted": interrupted,
        "requests": live.stats.requests,
        "requests_per_s": round(live.stats.requests / max(run_s, 1e-9), 1),
        "routed_to_top_score": routed_to_best,
        "faults": faults,
        "transport": transport,
        "policies": policies,
        "index": {"copies": svc["copies"], "counters": svc["index"]},
        "contract": {
            "stored_events_checked": hash_checked,
            "stored_events_under_extra_key": hash_checked_extra,
            "stored_events_wrong": hash_bad,
            "content_errors": content_errors,
            "index_mismatched_workers": mismatched,
        },
        "checks": checks,
        "ok": all(checks.values()),
    }


def _choose(ranked: list, balance: BoundedLoad, tie: random.Random) -> int:
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


def _flush_drops(pub: Publisher, burst: int, mark: int) -> None:
    """Publish empty batches (heartbeats) until the drop burst is used up, plus one the
    subscriber receives live and so sees the gap: replay then heals the burst."""
    pending = burst - (pub.stats()["batches_published"] - mark)
    for _ in range(max(0, pending) + 1):
        pub.publish([])


def _wait_applied(
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


def _wait_restart_seen(service: RouterService, before: int, timeout_s: float) -> bool:
    """Wait (bounded) until the router reset a source for a restart once more than `before` times."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if service.stats()["resets"].get("restart", 0) > before:
            return True
        time.sleep(0.005)
    return False


def _plural(count: int | None, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _restart(cfg: DemoConfig, live: Cluster, shadows: dict, pub: Publisher, i: int, retired: list) -> Publisher:
    """A worker crash: every cluster resets worker i; the live one restarts its publisher too."""
    retired.append(pub.stats())
    new = _recreate(cfg, pub, vllm=isinstance(live.workers[i], VllmClusterWorker))
    live.restart(i)
    for cluster, _ in shadows.values():
        cluster.restart(i)
    _publish_step(new, live.workers[i])  # AllBlocksCleared from the fresh engine
    return new


def _settle(
    cfg: DemoConfig, service: RouterService, live: Cluster, pubs: list[Publisher], names: list[str]
) -> tuple[bool, float, list[str]]:
    """Wait until the router applied every published seq and its index equals the caches."""
    start = time.monotonic()
    truth = {name: _truth(w) for name, w in zip(names, live.workers)}
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


def _progress_figures(live: Cluster, shadows: dict, service: RouterService) -> dict[str, Any]:
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
        _publish_step(pubs[i], live.workers[i])
    applied = _wait_applied(service, [names[ci], names[vi]], [pubs[ci], pubs[vi]], cfg.settle_timeout_s)
    longer = tokens + [rng.randrange(100_000, 200_000) for _ in range(3 * cfg.page_size)]
    found: dict[str, dict[str, int]] = {}
    for label, toks in (("prefix", tokens), ("longer", longer)):
        got = {s.worker: s.matched_pages for s in service.score(toks, "tenant-probe", "lora-probe")}
        found[label] = {"contract": got.get(names[ci], 0), "vllm": got.get(names[vi], 0)}
    ok = applied and all(f["contract"] == f["vllm"] == pages for f in found.values())
    return {"contract_worker": names[ci], "vllm_worker": names[vi], "pages": pages, "matched_pages": found, "ok": ok}
