"""Which publishers are stale, read in O(1) by every /score answer.

Building the feed's per-source status costs ~1.4 us a source (~90 us at 64, over a millisecond at
1,024), too much per request. `Freshness` keeps the set of stale source names, refreshed every
`refresh_s` by a background thread while the service runs (or, without the thread, by the first
read after `refresh_s`): a request reads a frozenset and a bool. Staleness is seconds-scale
(`--stale-after`, 5 s by default), so answering from a view at most `refresh_s` old loses nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Freshness"]

log = logging.getLogger("kvevents.consumers.service.freshness")


class Freshness:
    """A cached view of `status()` (source name -> an object with `.stale`)."""

    def __init__(self, status: Callable[[], Mapping[str, Any]], clock: Callable[[], float], refresh_s: float = 0.25):
        self._status = status
        self.clock = clock
        self.refresh_s = refresh_s
        self.stale: frozenset[str] = frozenset()
        self.any_stale = False
        self._at = -float("inf")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> None:
        """Read the feed's status now."""
        with self._lock:
            stale = frozenset(name for name, st in self._status().items() if st.stale)
            self.stale, self.any_stale, self._at = stale, bool(stale), self.clock()

    def read(self) -> tuple[frozenset[str], bool]:
        """(stale source names, any stale): the cached view; refreshed here only when no thread runs."""
        if self._thread is None and self.clock() - self._at >= self.refresh_s:
            self.refresh()
        return self.stale, self.any_stale

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self.refresh()
            self._thread = threading.Thread(target=self._run, name="kvevents-route-freshness", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - keep serving the last view; say why
                log.error("stale view: %s: %s", type(exc).__name__, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
            self._thread = None
