"""Load-honest simulated serving: a request takes time in proportion to the tokens it prefills and
decodes, at most `max_running` run at once and the rest queue in arrival order, and the worker
reports what it is doing (running, waiting, KV pages held) as an engine's /metrics would.

Scaled: the defaults are microseconds per prefill token and a millisecond per decoded token, so a
test or a demo fleet shows real queueing in seconds, not minutes. The engine step itself (the
cache insert and its events) runs when a request is admitted; its uncached tokens are then
"prefilled" (a sleep), its `max_tokens` decoded (a sleep), and its pages freed. `sleep` is
injectable: tests hold requests in flight without waiting on a clock.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kvevents.sim.metrics import SimLoad

__all__ = ["SimTiming", "LoadHonestEngine"]


@dataclass(frozen=True)
class SimTiming:
    """Seconds per token prefilled and decoded, and requests running at once."""

    prefill_s_per_token: float = 10e-6
    decode_s_per_token: float = 1e-3
    max_running: int = 8

    def __post_init__(self) -> None:
        for name in ("prefill_s_per_token", "decode_s_per_token"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 10:
                raise ValueError(f"{name} must be 0..10 seconds, got {v!r}")
        if isinstance(self.max_running, bool) or not isinstance(self.max_running, int) or self.max_running < 1:
            raise ValueError(f"max_running must be an integer >= 1, got {self.max_running!r}")


class LoadHonestEngine:
    """Admission, timing and load accounting of one simulated worker (thread-safe)."""

    def __init__(
        self,
        timing: SimTiming,
        *,
        page_size: int,
        capacity_pages: int,
        dp_rank: int = 0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.timing = timing
        self.page_size = page_size
        self.capacity_pages = capacity_pages
        self.dp_rank = dp_rank
        self._sleep = sleep
        self._lock = threading.Lock()
        self._queue: deque[threading.Event] = deque()
        self.running = 0
        self.used_pages = 0
        self.served = 0

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def load(self, model: str = "kvevents-sim") -> SimLoad:
        with self._lock:
            return SimLoad(self.running, len(self._queue), self.used_pages, self.capacity_pages, self.page_size,
                           self.dp_rank, model)  # fmt: skip

    def run(self, prompt_tokens: int, decode_tokens: int, step: Callable[[], int]) -> int:
        """Serve one request: wait for a slot, run `step` (the engine step: returns the prompt
        tokens found cached), prefill the rest, decode, free the slot; returns step's result."""
        pages = math.ceil((prompt_tokens + decode_tokens) / self.page_size)
        self._admit()
        with self._lock:
            self.used_pages += pages
        try:
            cached = step()
            self._sleep(max(0, prompt_tokens - cached) * self.timing.prefill_s_per_token)
            self._sleep(decode_tokens * self.timing.decode_s_per_token)
        finally:
            with self._lock:
                self.used_pages -= pages
                self.served += 1
            self._release()
        return cached

    def _admit(self) -> None:
        with self._lock:
            if self.running < self.timing.max_running and not self._queue:
                self.running += 1
                return
            turn = threading.Event()
            self._queue.append(turn)
        turn.wait()  # _release hands this request its slot (running stays counted)

    def _release(self) -> None:
        with self._lock:
            if self._queue:
                self._queue.popleft().set()
            else:
                self.running -= 1
