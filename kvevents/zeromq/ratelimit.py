"""Per-peer token buckets: how often one ROUTER identity may be answered (KVE/DESCRIBE).

A peer may send `burst` requests at once and `rate_per_s` a second after that; the rest are
refused (the caller counts them). Memory is bounded: at most `max_peers` identities are
remembered, the oldest forgotten first (a forgotten peer starts again with a full bucket, which
only ever lets more through). The clock is injectable so tests need no sleeps.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["PeerRateLimiter"]


class PeerRateLimiter:
    """`allow(ident)`: True and one token spent, or False (no token: refuse the request)."""

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        *,
        max_peers: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not rate_per_s > 0 or burst < 1 or max_peers < 1:
            raise ValueError(
                f"rate_per_s > 0, burst >= 1 and max_peers >= 1 needed, got {rate_per_s}, {burst}, {max_peers}"
            )
        self.rate_per_s = float(rate_per_s)
        self.burst = float(burst)
        self.max_peers = max_peers
        self.clock = clock
        self._buckets: dict[bytes, tuple[float, float]] = {}  # ident -> (tokens, when last counted)

    def allow(self, ident: bytes) -> bool:
        now = self.clock()
        held = self._buckets.get(ident)
        if held is None:
            if len(self._buckets) >= self.max_peers:
                del self._buckets[next(iter(self._buckets))]  # the oldest identity goes
            tokens = self.burst
        else:
            tokens, last = held
            tokens = min(self.burst, tokens + max(0.0, now - last) * self.rate_per_s)
        if tokens < 1.0:
            self._buckets[ident] = (tokens, now)
            return False
        self._buckets[ident] = (tokens - 1.0, now)
        return True

    def __len__(self) -> int:
        """Identities remembered (bounded by max_peers)."""
        return len(self._buckets)
