"""How the long-running commands (route, bridge) stop: SIGINT and SIGTERM set one event, and the
command says afterwards whether Ctrl-C was the cause (exit 130, as `demo` does)."""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["StopSignals"]


class StopSignals:
    """Installs handlers for SIGINT and SIGTERM (from the main thread) that set `stop`."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._got: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._got.append(signum)
        self.stop.set()

    @property
    def interrupted(self) -> bool:
        """Whether SIGINT (Ctrl-C) was received."""
        return signal.SIGINT in self._got
