"""Serving simulated workers (`kvevents serve`): one Publisher per worker (worker i is DP rank i on
port + i), a seeded workload each, and the loop that serves requests round-robin at a rate.

The loop takes an injectable clock and sleep, and a status callback once per second of its clock;
the caller renders the figures (`FleetStatus`) and owns signals.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from kvevents.sim.worker import Request, Workload, make_worker, serve_and_publish
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.wire import offset_endpoint

__all__ = ["ServeConfig", "SimFleet", "FleetStatus", "ServeLoop", "default_replay_endpoint", "rank_endpoints"]


def default_replay_endpoint(endpoint: str, workers: int) -> str:
    """The replay endpoint of worker 0 when none is given: the port right after the last worker's
    live port (`*` / 0 stays ephemeral; an ipc/inproc name gets `-replay`)."""
    head, _, port = endpoint.rpartition(":")
    if endpoint.startswith("tcp://") and port.isdigit() and int(port) > 0:
        return f"{head}:{int(port) + workers}"
    if endpoint.startswith("tcp://"):
        return endpoint  # ephemeral: the OS picks a port
    return endpoint + "-replay"


def rank_endpoints(endpoint: str, replay_endpoint: str, workers: int) -> tuple[list[str], list[str]]:
    """(live, replay) endpoint of each rank (replay: none for ''); ValueError past port 65535."""
    lives = [offset_endpoint(endpoint, i) for i in range(workers)]
    replays = [offset_endpoint(replay_endpoint, i) for i in range(workers)] if replay_endpoint else []
    return lives, replays


@dataclass
class ServeConfig:
    """What `kvevents serve` runs: the endpoints of worker 0, the workers and their publishers."""

    endpoint: str = "tcp://127.0.0.1:5557"
    replay_endpoint: Optional[str] = None  # None or '': no replay endpoint
    topic: str = ""
    workers: int = 1
    seed: int = 0
    page_size: int = 16
    capacity_pages: int = 4096
    heartbeat_s: float = 1.0  # contract workers only (vLLM sends none)
    bind: bool = True
    metrics_port: Optional[int] = None  # 0: a free port, shared by every rank
    engine: str = "contract"
    hash_algo: str = "sha256"
    epoch_in_batch: bool = False
    curve_secret_key_file: Optional[str] = None
    curve_allow_dir: Optional[str] = None

    def publisher(self, rank: int, metrics_port: Optional[int]) -> Publisher:
        """Rank `rank`'s publisher (a vLLM engine has no snapshots and no heartbeats)."""
        contract = self.engine == "contract"
        return Publisher(
            endpoint=self.endpoint,
            replay_endpoint=self.replay_endpoint or None,
            topic=self.topic,
            dp_rank=rank,
            bind=self.bind,
            heartbeat_interval_s=self.heartbeat_s if contract else 0.0,
            snapshots=contract,
            metrics_port=metrics_port,
            epoch_in_batch=self.epoch_in_batch,
            curve_secret_key_file=self.curve_secret_key_file,
            curve_allow_dir=self.curve_allow_dir,
        )


@dataclass(frozen=True)
class FleetStatus:
    """The fleet's figures, summed over the workers and their publishers."""

    requests: int
    batches: int
    events: int
    dropped: int
    live_blocks: int
    replays: int
    snapshots: int
    device_hit: float  # share of request tokens found on the device


class SimFleet:
    """Simulated workers, each with its own publisher and workload; `lock` serialises their steps
    (the serving loop and an HTTP front end take turns)."""

    def __init__(self, sims: list[Any], pubs: list[Publisher], loads: list[Iterator[Request]]) -> None:
        self.sims, self.pubs, self.loads = sims, pubs, loads
        self.lock = threading.Lock()

    @classmethod
    def open(cls, cfg: ServeConfig) -> SimFleet:
        """Bind every rank's publisher and build its worker; on a failure the ones open are closed."""
        sims: list[Any] = []
        pubs: list[Publisher] = []
        loads: list[Iterator[Request]] = []
        metrics_port = cfg.metrics_port
        try:
            for i in range(cfg.workers):
                pubs.append(cfg.publisher(i, metrics_port))
                metrics_port = pubs[0].metrics_port  # 0 picked a free port: the other ranks share it
                sims.append(
                    make_worker(
                        cfg.engine,
                        f"w{i}",
                        page_size=cfg.page_size,
                        capacity_pages=cfg.capacity_pages,
                        hash_algo=cfg.hash_algo,
                        dp_rank=i,
                    )
                )
                loads.append(iter(Workload(cfg.seed + i, page_size=cfg.page_size)))
        except BaseException:
            for p in pubs:
                p.close(0)
            raise
        return cls(sims, pubs, loads)

    def __len__(self) -> int:
        return len(self.pubs)

    def serve_next(self, k: int) -> None:
        """Worker k serves its workload's next request and publishes what it changed."""
        with self.lock:
            serve_and_publish(self.sims[k], next(self.loads[k]), self.pubs[k])

    def status(self, served: int) -> FleetStatus:
        stats = [p.stats() for p in self.pubs]
        tok = sum(s.tokens for s in self.sims) or 1
        return FleetStatus(
            requests=served,
            batches=sum(s["batches_published"] for s in stats),
            events=sum(s["events_published"] for s in stats),
            dropped=sum(s["dropped_queue_full"] for s in stats),
            live_blocks=sum(s["live_blocks"] for s in stats),
            replays=sum(s["replay_requests"] for s in stats),
            snapshots=sum(s["snapshot_requests"] for s in stats),
            device_hit=sum(s.device_hit_tokens for s in self.sims) / tok,
        )

    def close(self, timeout: float = 1.0) -> int:
        """Close every publisher (each flushes for up to `timeout` s); returns the batches left unsent."""
        return sum(p.close(timeout) for p in self.pubs)


class ServeLoop:
    """Requests round-robin over the fleet at `rate` per second (0: as fast as possible) for
    `duration` s (None: until stopped); `served` and `elapsed()` stay readable after an interrupt."""

    def __init__(
        self,
        fleet: SimFleet,
        rate: float,
        duration: Optional[float] = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.fleet, self.duration = fleet, duration
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.clock, self.sleep = clock, sleep
        self.served = 0
        self.started = clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    def run(self, stop: threading.Event, on_status: Callable[[float], None]) -> None:
        """Serve until `stop` is set or the duration is up; `on_status(elapsed)` once per second."""
        t0 = self.started = self.clock()
        next_status = t0 + 1.0
        next_req = t0
        while not stop.is_set():
            now = self.clock()
            if self.duration is not None and now - t0 >= self.duration:
                break
            if now >= next_status:
                on_status(now - t0)
                next_status += 1.0
            if self.interval and now < next_req:
                self.sleep(min(next_req - now, max(0.0, next_status - now), 0.05))
                continue
            self.fleet.serve_next(self.served % len(self.fleet))
            self.served += 1
            next_req += self.interval
