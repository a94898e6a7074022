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
from kvevents.demo.cluster import BoundedLoad, Cluster, fleet_engines, random_policy, round_robin_policy
from kvevents.demo.config import REPRODUCIBLE, DemoConfig
from kvevents.demo.steps import (
    check_stored_hashes,
    choose,
    flush_drops,
    open_publisher,
    probe_vllm_prefix,
    progress_figures,
    publish_step,
    restart_worker,
    wait_applied,
    wait_restart_seen,
    wait_settled,
)
from kvevents.demo.timeline import Timeline
from kvevents.sim.worker import Request, Workload
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.subscriber import Source

__all__ = ["DemoConfig", "run_demo", "check_stored_hashes", "REPRODUCIBLE"]

#: on_progress(elapsed_s, figures); figures["fraction"] is the share of the run done (time or requests).
#: An on_progress object with a `phase(text)` method is also told each phase of the run.
ProgressFn = Callable[[float, dict[str, Any]], None]


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
    """Start, route until the end (or Ctrl-C), settle and check; the publishers and the router are
    stopped whatever happens."""
    run = _DemoRun(cfg, on_progress, interrupt)
    try:
        run.start()
        run.traffic()
        run.settle()
    finally:
        run.stop()
    return run.result()


@dataclass
class _Tally:
    """What the traffic loop counts: stored events checked against recomputed hashes, and routing."""

    hash_checked: int = 0
    hash_bad: int = 0
    hash_checked_extra: int = 0  # of hash_checked: under a LoRA extra_key
    routed_to_best: int = 0


class _DemoRun:
    """One demo run, step by step: start (publishers, router, join), traffic (routing, the two
    faults at their share of the run), settle (catch up, probe, compare), stop, result."""

    DROP_AT, RESTART_AT = 0.4, 0.6  # shares of the run (time, or requests with cfg.requests)

    def __init__(self, cfg: DemoConfig, on_progress: ProgressFn | None, interrupt: _Interrupt) -> None:
        self.cfg, self.on_progress, self.interrupt = cfg, on_progress, interrupt
        self.phase: Callable[[str], None] = getattr(on_progress, "phase", None) or (lambda _text: None)
        n = self.n = cfg.workers
        self.rng = random.Random(cfg.seed)
        self.engines = fleet_engines(cfg.fleet, n)
        kw: dict[str, Any] = {"page_size": cfg.page_size, "capacity_pages": cfg.capacity_pages, "engines": self.engines}
        self.live = Cluster("prefix", n, **kw)
        self.shadows = {
            "random": (Cluster("random", n, **kw), random_policy(n, cfg.seed + 1)),
            "round_robin": (Cluster("round_robin", n, **kw), round_robin_policy(n)),
        }
        self.names = [w.name for w in self.live.workers]
        self.pubs: list[Publisher] = []  # one list for the run: a restart replaces its entry (Timeline reads it)
        self.service: RouterService | None = None
        self.retired: list[dict[str, int]] = []
        self.faults: dict[str, Any] = {"dropped_live": 0, "drop_worker": None, "restart_worker": None}
        self.tally = _Tally()
        self.drop_mark = 0
        self.flushed = False  # the drop burst was used up at once (cfg.requests)
        self.run_s = 0.0
        self.interrupted = False

    @property
    def router(self) -> RouterService:
        assert self.service is not None, "start() first"
        return self.service

    # ---------------------------------------------------------------- start
    def start(self) -> None:
        """Publishers on loopback, a router subscribed to all, and the wait until it follows each one."""
        cfg, n = self.cfg, self.n
        self.phase(f"starting {n} publisher{'s' * (n != 1)} on loopback and a router subscribed to all")
        for engine in self.engines:
            self.pubs.append(open_publisher(cfg, vllm=engine == "vllm"))
        sources = [Source(p.endpoint, p.replay_endpoint, name) for p, name in zip(self.pubs, self.names)]
        self.service = RouterService(
            sources,
            page_size=cfg.page_size,
            seed=cfg.seed,
            stale_after_s=max(2.0, 10 * cfg.heartbeat_s),
            default_key_mode="auto",
        )
        self.service.start()
        for w, p in zip(self.live.workers, self.pubs):  # the construction-time AllBlocksCleared (vLLM: nothing)
            if not publish_step(p, w):
                p.publish([])
        # Faults only test something once the router follows every stream (a restart it never
        # saw the old epoch of is just a first contact), so the clock starts after the join.
        wait_applied(self.service, self.names, self.pubs, cfg.settle_timeout_s, nudge=True)
        self.drop_victim = self.rng.randrange(n)
        restart_victim = (self.drop_victim + 1) % n if n > 1 else 0
        while self.engines[restart_victim] == "vllm":  # vLLM has no snapshots: the restart hits a contract worker
            restart_victim = (restart_victim + 1) % n
        self.restart_victim = restart_victim

    # ---------------------------------------------------------------- traffic
    def traffic(self) -> None:
        """Route requests until the run's time (or request count) is used up or Ctrl-C."""
        cfg, live = self.cfg, self.live
        self.phase(
            f"router follows every publisher; routing {_plural(cfg.requests, 'request')}"
            if cfg.requests
            else f"router follows every publisher; routing requests for {cfg.duration:g} s"
        )
        balance = BoundedLoad(self.names, window=16 * self.n)
        tie = random.Random(cfg.seed + 2)
        requests = iter(Workload(seed=cfg.seed, page_size=cfg.page_size))
        policy_stats = {"prefix": live.stats, **{k: c.stats for k, (c, _) in self.shadows.items()}}
        interval = max(0.25, cfg.duration / 240)
        self.timeline = timeline = Timeline(self.router, self.names, self.pubs, policy_stats, interval_s=interval)
        start = time.monotonic()
        last_progress = -1.0
        while not self.interrupt.hit.is_set():
            elapsed = time.monotonic() - start
            done = live.stats.requests / cfg.requests if cfg.requests else elapsed / cfg.duration
            if done >= 1.0:
                break
            if self.faults["drop_worker"] is None and done >= self.DROP_AT:
                self._drop(elapsed)
            if self.faults["restart_worker"] is None and done >= self.RESTART_AT:
                self._restart(elapsed)
            self._route(next(requests), balance, tie)
            timeline.tick(time.monotonic() - start)  # for --html: hit rates, backlog, repairs over time
            if self.on_progress is not None and elapsed - last_progress >= 0.2:
                last_progress = elapsed
                figures = progress_figures(live, self.shadows, self.router)
                self.on_progress(elapsed, {**figures, "fraction": min(1.0, done)})
        self.run_s = time.monotonic() - start
        timeline.tick(self.run_s, force=True)
        self.interrupted = self.interrupt.hit.is_set()

    def _route(self, req: Request, balance: BoundedLoad, tie: random.Random) -> None:
        """One request: scored by the router, served by its pick (and by the shadow policies),
        published; its stored events are checked against recomputed hashes."""
        cfg, names, tally = self.cfg, self.names, self.tally
        ranked = self.router.score(req.tokens, req.namespace.cache_salt, req.lora_name, loads=balance.loads())
        pick = choose(ranked, balance, tie)
        balance.record(names[pick])
        tally.routed_to_best += 1 if ranked and ranked[0].worker == names[pick] else 0
        self.live.serve(pick, req)
        events = publish_step(self.pubs[pick], self.live.workers[pick])
        if cfg.requests:  # the next score sees this batch: routing does not depend on timing
            wait_applied(self.router, [names[pick]], [self.pubs[pick]], cfg.settle_timeout_s, poll_s=0.0002)
        checked, bad = check_stored_hashes(req, events, cfg.page_size)
        tally.hash_checked += checked
        tally.hash_bad += bad
        if checked and req.namespace.extra_key is not None:
            tally.hash_checked_extra += checked
        for cluster, policy in self.shadows.values():
            cluster.serve(policy(req), req)

    def _drop(self, elapsed: float) -> None:
        """Fault 1: a burst of live frames of one publisher is dropped (replay must heal it)."""
        cfg, victim = self.cfg, self.drop_victim
        name, pub = self.names[victim], self.pubs[victim]
        self.phase(f"t={elapsed:.1f}s: dropping {cfg.drop_burst} live frames of {name} (replay must heal them)")
        self.drop_mark = pub.stats()["batches_published"]
        pub.drop_live(cfg.drop_burst)
        self.faults.update(dropped_live=cfg.drop_burst, drop_worker=name)
        self.timeline.mark(elapsed, "drop", name, f"{cfg.drop_burst} live frames dropped")
        if cfg.requests:  # reproducible: the burst eats heartbeats now, not a timing-dependent share of batches
            self._flush_drop_burst()

    def _flush_drop_burst(self) -> None:
        """Use up the drop burst now and wait until replay healed it."""
        victim = self.drop_victim
        flush_drops(self.pubs[victim], self.cfg.drop_burst, self.drop_mark)
        wait_applied(self.router, [self.names[victim]], [self.pubs[victim]], self.cfg.settle_timeout_s)
        self.flushed = True

    def _restart(self, elapsed: float) -> None:
        """Fault 2: one contract worker restarts (new epoch; a snapshot must resync the router)."""
        cfg, victim, service = self.cfg, self.restart_victim, self.router
        name = self.names[victim]
        self.phase(f"t={elapsed:.1f}s: restarting {name} (new epoch; snapshot must resync it)")
        if victim == self.drop_victim and not self.flushed:  # one worker: let replay heal the burst first
            self._flush_drop_burst()
        restarts_seen = service.stats()["resets"].get("restart", 0)
        self.pubs[victim] = restart_worker(cfg, self.live, self.shadows, self.pubs[victim], victim, self.retired)
        self.faults["restart_worker"] = name
        self.timeline.mark(elapsed, "restart", name, "new epoch")
        if cfg.requests:  # the old epoch's seqs are higher: first wait for the router to see the restart
            wait_restart_seen(service, restarts_seen, cfg.settle_timeout_s)
            wait_applied(service, [name], [self.pubs[victim]], cfg.settle_timeout_s)

    # ---------------------------------------------------------------- settle, stop, result
    def settle(self) -> None:
        """Heal what is left of the drop burst, probe a vLLM prefix, wait until the router's index
        equals the caches; read the counters."""
        self.phase(
            ("interrupted (Ctrl-C)" if self.interrupted else "traffic done") + f" after {self.run_s:.1f}s, "
            f"{_plural(self.live.stats.requests, 'request')}; checking once the router caught up"
        )
        if self.faults["drop_worker"] is not None and not self.flushed:
            flush_drops(self.pubs[self.drop_victim], self.cfg.drop_burst, self.drop_mark)
        service = self.router
        args = (self.cfg, service, self.live, self.pubs, self.names)
        self.probe = probe_vllm_prefix(*args, self.rng) if "vllm" in self.engines else None
        self.settled, self.settle_s, self.mismatched = wait_settled(*args)
        # the last sample is the settled state: a fault late in a short run may be repaired after the traffic
        self.timeline.tick(self.run_s + self.settle_s, force=True)
        self.sub = dict(service.feed.counters())
        self.svc = service.stats()
        self.key_modes = {name: service.keyer.mode(name) for name in self.names}

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()
        for p in self.pubs:
            p.close(timeout=0.2)

    def result(self) -> dict[str, Any]:
        """The figures and checks of a run that settled (see run_demo)."""
        cfg, live, tally = self.cfg, self.live, self.tally
        clusters = [live] + [c for c, _ in self.shadows.values()]
        content_errors = sum(w.content_errors for c in clusters for w in c.workers)
        transport = self._transport()
        checks = self._checks(transport, content_errors)
        return {
            "workers": self.n,
            "fleet": cfg.fleet,
            "engines": dict(zip(self.names, self.engines)),
            "key_modes": self.key_modes,
            "vllm_probe": self.probe,
            "duration_s": round(self.run_s, 3),
            "seed": cfg.seed,
            "timeline": self.timeline.as_dict(),
            "requests_asked": cfg.requests,  # None: a time-bound run (not reproducible)
            "reproducible": list(REPRODUCIBLE) if cfg.requests and not self.interrupted else [],
            "interrupted": self.interrupted,
            "requests": live.stats.requests,
            "requests_per_s": round(live.stats.requests / max(self.run_s, 1e-9), 1),
            "routed_to_top_score": tally.routed_to_best,
            "faults": self.faults,
            "transport": transport,
            "policies": self._policies(),
            "index": {"copies": self.svc["copies"], "counters": self.svc["index"]},
            "contract": {
                "stored_events_checked": tally.hash_checked,
                "stored_events_under_extra_key": tally.hash_checked_extra,
                "stored_events_wrong": tally.hash_bad,
                "content_errors": content_errors,
                "index_mismatched_workers": self.mismatched,
            },
            "checks": checks,
            "ok": all(checks.values()),
        }

    def _policies(self) -> dict[str, Any]:
        """Per policy: its summary, and the tokens reused on the device, loaded from the shared
        tier and prefilled again."""
        n = self.n
        policies = {"prefix": self.live.stats.summary(n)}
        policies.update({name: c.stats.summary(n) for name, (c, _) in self.shadows.items()})
        for name, st in [("prefix", self.live.stats)] + [(k, c.stats) for k, (c, _) in self.shadows.items()]:
            policies[name].update(
                device_tokens_reused=st.device_hit_tokens,
                storage_tokens_loaded=st.storage_hit_tokens,
                prefill_tokens_recomputed=st.tokens - st.device_hit_tokens - st.storage_hit_tokens,
            )
        return policies

    def _transport(self) -> dict[str, Any]:
        """Publishers' and the router's counters: what was published, applied, repaired, lost."""
        pub_stats = [p.stats() for p in self.pubs] + self.retired
        sub, svc = self.sub, self.svc
        return {
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
            "settle_s": round(self.settle_s, 3),
        }

    def _checks(self, transport: dict[str, Any], content_errors: int) -> dict[str, bool]:
        tally = self.tally
        checks = {
            "no_published_hash_moved_by_extra_key": tally.hash_bad == 0 and tally.hash_checked_extra > 0,
            "storage_never_served_across_namespaces": content_errors == 0,
            "router_index_equals_worker_caches": self.settled,
            "injected_faults_observed": transport["batches_replayed"] >= 1 and transport["restarts_detected"] >= 1,
        }
        if self.interrupted and self.faults["restart_worker"] is None:  # stopped before the faults: nothing to observe
            del checks["injected_faults_observed"]
        if self.probe is not None:
            checks["key_mode_detected_per_source"] = all(
                self.key_modes[name] == ("tokens" if e == "vllm" else "contract")
                for name, e in zip(self.names, self.engines)
            )
            checks["vllm_prefix_found_as_on_contract_worker"] = self.probe["ok"]
        return checks


def _plural(count: int | None, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"
