"""The injectable clock of the sans-IO state machines (sequencer, JetStream order, replay server)."""

from __future__ import annotations


class FakeClock:
    """A monotonic clock that moves only when a test says so."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        """Move forward by `dt` seconds (never backwards) and return the new time."""
        if dt < 0:
            raise ValueError("a monotonic clock never goes back")
        self.t += dt
        return self.t
