"""The demo's knobs (`DemoConfig`) and which of its figures a seeded `--requests N` run repeats."""

from __future__ import annotations

from dataclasses import dataclass

from kvevents.demo.cluster import fleet_engines

__all__ = ["DemoConfig", "REPRODUCIBLE"]

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
