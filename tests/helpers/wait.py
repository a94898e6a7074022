"""One way to wait in a test: poll a condition until a monotonic deadline, then fail naming it."""

from __future__ import annotations

import time
from typing import Callable


def wait_until(
    what: str,
    cond: Callable[[], object],
    pump: Callable[[], object] | None = None,
    timeout: float = 15.0,
    interval: float = 0.02,
) -> None:
    """Until `cond()` is true: call `pump()` between checks (a poll that also waits), else sleep."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for: {what}")
        if pump is not None:
            pump()
        else:
            time.sleep(interval)
