"""`kvevents serve`'s option bundles (kvevents.cli.flag_groups): the workload (WorkloadFlags), the
endpoints and wire (WireFlags), the engine emulated (EngineFlags) and the per-worker HTTP front
(SimHttpFlags -> its SimTiming). serve files each bundle under its --help panel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from kvevents.cli.app import user_error
from kvevents.cli.flag_groups import flag

__all__ = ["EngineFlags", "SimHttpFlags", "WireFlags", "WorkloadFlags"]


@dataclass(frozen=True)
class WorkloadFlags:
    """How many workers, how busy, for how long, and their caches."""

    workers: int = flag(1, min=1, max=64, help="Simulated workers, one publisher each (DP ranks).")
    rate: float = flag(200.0, min=0.0, help="Requests per second, all workers (0: flat out).")
    duration: Optional[float] = flag(None, min=0.0, help="Stop after S seconds (default: Ctrl-C).")
    seed: int = flag(0, help="Workload seed (worker i: seed + i).")
    page_size: int = flag(16, min=1, help="Tokens per page.")
    capacity_pages: int = flag(4096, min=1, help="Device pages per worker (evicts beyond).")


@dataclass(frozen=True)
class WireFlags:
    """Where worker 0 publishes (worker i: port + i) and what its messages carry."""

    endpoint: str = flag("tcp://127.0.0.1:5557", help="Worker 0's live PUB endpoint (worker i: port + i).")
    replay_endpoint: Optional[str] = flag(
        None,
        help="Worker 0's replay endpoint (worker i: port + i). Default: the port after the last live port; '': none.",
    )
    topic: str = flag("", help="Topic frame of every message.")
    heartbeat: float = flag(1.0, min=0.0, help="Heartbeat every S seconds (0: none).")
    bind: bool = flag(True, help="Bind the live endpoint (else connect).")
    epoch_in_batch: bool = flag(
        False, "--epoch-in-batch", help="Add the epoch as a 4th batch element (strict decoders reject it)."
    )


@dataclass(frozen=True)
class EngineFlags:
    """The engine the workers emulate, and with vLLM its hash."""

    engine: str = flag(
        "contract", "--engine", help="contract, or vllm: what a vLLM 0.33 worker emits (no snapshots, no heartbeats)."
    )
    hash_algo: Optional[str] = flag(None, "--hash-algo", help="With --engine vllm: sha256 (default) or sha256_cbor.")

    def check(self) -> None:
        from kvevents.sim.worker import ENGINES

        if self.engine not in ENGINES:
            user_error(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.hash_algo is not None and self.engine != "vllm":
            user_error(
                f"--hash-algo {self.hash_algo} is vLLM's hash: add --engine vllm "
                f"(--engine {self.engine} hashes by the contract)"
            )
        if self.hash_algo not in (None, "sha256", "sha256_cbor"):
            user_error(f"--hash-algo must be sha256 or sha256_cbor, got {self.hash_algo!r}")


@dataclass(frozen=True)
class SimHttpFlags:
    """--http: a /v1/completions per worker, and how long its simulated requests take."""

    http: Optional[str] = flag(None, "--http", help="/v1/completions, /metrics per worker (port+i).")
    prefill_us: float = flag(
        10.0, "--prefill-us-per-token", min=0.0, help="--http: us/new token (10).", show_default=False
    )
    decode_ms: float = flag(
        1.0, "--decode-ms-per-token", min=0.0, help="--http: ms/max_tokens (1).", show_default=False
    )
    max_running: int = flag(8, "--max-running", min=1, help="--http: run at once (8).", show_default=False)

    def timing(self) -> Any:  # SimTiming
        from kvevents.sim.timing import SimTiming

        return SimTiming(self.prefill_us * 1e-6, self.decode_ms * 1e-3, self.max_running)
