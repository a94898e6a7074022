"""Simulated clusters and routing policies for the demo.

Each policy serves the same request stream on its own cluster of SimWorkers (one shared page
store per cluster, like a shared L3). That is the honest comparison: a policy's hit rate comes
from caches its own decisions shaped, not from caches another policy filled. A mixed fleet also
has vLLM-faithful workers (`VllmClusterWorker`: vLLM 0.33's block pool and hashes, no shared store).
"""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, Sequence, Union

from kvevents.cache import MemoryStore
from kvevents.hashing import Namespace, event_hashes_int64
from kvevents.sim.vllm import VllmSimWorker
from kvevents.sim.worker import Request, ServeResult, SimWorker

__all__ = [
    "Cluster",
    "PolicyStats",
    "BoundedLoad",
    "random_policy",
    "round_robin_policy",
    "VllmClusterWorker",
    "fleet_engines",
    "FLEETS",
]

#: `kvevents demo --fleet`: contract (every worker emits by the contract) or mixed (half vLLM).
FLEETS = ("mixed", "contract")


def fleet_engines(fleet: str, n: int) -> list[str]:
    """Engine per worker: mixed gives the first ceil(n/2) workers the contract, the rest vLLM."""
    if fleet not in FLEETS:
        raise ValueError(f"--fleet must be one of {', '.join(FLEETS)}, got {fleet!r}")
    vllm = n // 2 if fleet == "mixed" else 0
    return ["contract"] * (n - vllm) + ["vllm"] * vllm


class VllmClusterWorker:
    """A vLLM 0.33-faithful worker with the demo-facing surface of SimWorker (serve, restart, truth)."""

    engine = "vllm"

    def __init__(self, name: str, *, page_size: int, capacity_pages: int, hash_algo: str = "sha256") -> None:
        self.name = name
        self.page_size = page_size
        self.hash_algo = hash_algo
        self.sim = VllmSimWorker(
            name, block_size=page_size, capacity_blocks=capacity_pages, hash_algo=hash_algo, dp_rank=0
        )
        self.content_errors = 0  # no storage tier: nothing can be served across namespaces

    def serve(self, request: Request) -> ServeResult:
        res = self.sim.serve_request(request)
        return ServeResult(res.num_tokens, res.hit_tokens, 0, True)

    def restart(self) -> None:
        self.sim.reset()

    def take_payload(self) -> bytes | None:
        """The step's batch, encoded as vLLM 0.33 does (None: nothing happened)."""
        return self.sim.take_payload(time.time())

    def expected_copies(self) -> Counter[int]:
        """What a router's index must hold for this worker: the contract key of every cached block."""
        out: Counter[int] = Counter()
        for cb in self.sim.cached_blocks():
            out[event_hashes_int64(cb.prefix, self.page_size, Namespace(cache_salt=cb.cache_salt))[-1]] += 1
        return out


DemoWorker = Union[SimWorker, VllmClusterWorker]


@dataclass
class PolicyStats:
    """What one policy achieved on its cluster."""

    requests: int = 0
    tokens: int = 0
    device_hit_tokens: int = 0
    storage_hit_tokens: int = 0
    content_errors: int = 0
    per_worker: Counter = field(default_factory=Counter)

    def add(self, worker: int, res: ServeResult) -> None:
        self.requests += 1
        self.tokens += res.num_tokens
        self.device_hit_tokens += res.device_hit_tokens
        self.storage_hit_tokens += res.storage_hit_tokens
        self.content_errors += 0 if res.content_ok else 1
        self.per_worker[worker] += 1

    def summary(self, n_workers: int) -> dict[str, float | int]:
        saved = self.device_hit_tokens + self.storage_hit_tokens
        tokens = max(1, self.tokens)
        loads = [self.per_worker.get(i, 0) for i in range(n_workers)]
        mean = sum(loads) / max(1, n_workers)
        return {
            "requests": self.requests,
            "prompt_tokens": self.tokens,
            "hit_rate_incl_storage": round(saved / tokens, 4),  # device + shared storage
            "device_hit_rate": round(self.device_hit_tokens / tokens, 4),
            "storage_hit_rate": round(self.storage_hit_tokens / tokens, 4),
            "prefill_tokens_saved": saved,
            "load_max_over_mean": round(max(loads) / mean, 3) if mean else 0.0,
            "content_errors": self.content_errors,
        }


class Cluster:
    """N SimWorkers sharing one page store; `serve(i, request)` records the policy's figures."""

    def __init__(
        self, name: str, n: int, *, page_size: int, capacity_pages: int, engines: Sequence[str] | None = None
    ) -> None:
        self.name = name
        self.store = MemoryStore(capacity_pages=16 * capacity_pages * n)
        self.engines = list(engines) if engines is not None else ["contract"] * n
        self.workers: list[DemoWorker] = []
        for i, engine in enumerate(self.engines):
            if engine == "vllm":  # alternate vLLM's two reproducible algos
                algo = "sha256" if self.engines[:i].count("vllm") % 2 == 0 else "sha256_cbor"
                self.workers.append(
                    VllmClusterWorker(f"vllm-{i}", page_size=page_size, capacity_pages=capacity_pages, hash_algo=algo)
                )
            else:
                self.workers.append(
                    SimWorker(f"worker-{i}", page_size=page_size, capacity_pages=capacity_pages, store=self.store)
                )
        self.stats = PolicyStats()

    def serve(self, i: int, request: Request) -> ServeResult:
        res = self.workers[i].serve(request)
        self.stats.add(i, res)
        return res

    def restart(self, i: int) -> None:
        self.workers[i].restart()


Policy = Callable[[Request], int]


def random_policy(n: int, seed: int) -> Policy:
    rng = random.Random(seed)
    return lambda _req: rng.randrange(n)


def round_robin_policy(n: int) -> Policy:
    state = {"i": -1}

    def pick(_req: Request) -> int:
        state["i"] = (state["i"] + 1) % n
        return state["i"]

    return pick


class BoundedLoad:
    """Load hint for the prefix router: requests each worker got among the last `window` ones.

    Workers above `factor` x the fair share are skipped unless every worker is (consistent
    hashing with bounded loads): prefix affinity without piling a popular prompt on one worker.
    """

    def __init__(self, names: Sequence[str], *, window: int = 64, factor: float = 1.5) -> None:
        self.names = list(names)
        self.recent: deque[str] = deque(maxlen=window)
        self.counts: Counter[str] = Counter()
        self.factor = factor

    def loads(self) -> dict[str, float]:
        return {n: float(self.counts.get(n, 0)) for n in self.names}

    def allowed(self, name: str) -> bool:
        cap = self.factor * max(1, len(self.recent)) / len(self.names) + 1
        return self.counts.get(name, 0) <= cap

    def record(self, name: str) -> None:
        if len(self.recent) == self.recent.maxlen:
            old = self.recent[0]
            self.counts[old] -= 1
        self.recent.append(name)
        self.counts[name] += 1
