"""The JetStream feed's queue from its NATS side (an asyncio loop) to its poll side, bounded.

Cold start reads a whole stream as fast as the server sends it; a poll side that applies slower
(a 10M-copy index) would otherwise hold the unread rest in memory. Stored messages are counted in
items and payload bytes: while either bound is reached, the NATS side waits (`room`) before taking
the next one, which holds up an ordered consumer's callback (the server pauses on flow control) or a
pull consumer's next fetch. Control items (snapshots picked, caught up, refills, stop) are never held.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Callable, Generic, TypeVar

__all__ = ["Backlog", "BACKLOG_ITEMS", "BACKLOG_BYTES"]

BACKLOG_ITEMS = 8192  # stored messages the poll side has not taken yet
BACKLOG_BYTES = 64 << 20  # ... and their payload bytes

T = TypeVar("T")


class Backlog(Generic[T]):
    """A FIFO of items with a bound on the stored messages among them (items and bytes)."""

    def __init__(self, max_items: int = BACKLOG_ITEMS, max_bytes: int = BACKLOG_BYTES, poll_s: float = 0.005) -> None:
        if max_items < 1 or max_bytes < 1:
            raise ValueError(f"backlog bounds must be >= 1 (got {max_items} items, {max_bytes} bytes)")
        self.max_items, self.max_bytes = max_items, max_bytes
        self._q: queue.SimpleQueue[tuple[T, int]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._items = self._bytes = 0
        self._poll_s = poll_s
        self.waits = 0  # times the NATS side waited for room
        self.peak_items = self.peak_bytes = 0

    def put(self, item: T, nbytes: int | None = None) -> None:
        """Queue `item`; a stored message gives its payload size (`nbytes`) and counts toward the bounds."""
        if nbytes is not None:
            with self._lock:
                self._items += 1
                self._bytes += nbytes
                self.peak_items = max(self.peak_items, self._items)
                self.peak_bytes = max(self.peak_bytes, self._bytes)
        self._q.put((item, -1 if nbytes is None else nbytes))

    def get(self, timeout: float | None = None) -> T:
        """The next item (queue.Empty after `timeout` seconds; None: wait; 0: do not wait)."""
        if timeout is None:
            item, nbytes = self._q.get()
        else:
            item, nbytes = self._q.get(timeout=timeout) if timeout > 0 else self._q.get_nowait()
        if nbytes >= 0:
            with self._lock:
                self._items -= 1
                self._bytes -= nbytes
        return item

    def full(self) -> bool:
        return self._items >= self.max_items or self._bytes >= self.max_bytes

    def held(self) -> tuple[int, int]:
        """Stored messages queued now, and their bytes."""
        with self._lock:
            return self._items, self._bytes

    def has_room(self, items: int = 1) -> bool:
        """Whether `items` more stored messages fit under the item bound (at most all of it) and the
        bytes are below theirs."""
        return self._items + min(items, self.max_items) <= self.max_items and self._bytes < self.max_bytes

    async def room(self, stopped: Callable[[], bool], items: int = 1) -> None:
        """Wait (on the NATS side's loop) until `items` more stored messages fit (`has_room`), or
        `stopped()`. A pull waits for room for a whole request, not for one message at a time."""
        if self.has_room(items):
            return
        self.waits += 1
        while not self.has_room(items) and not stopped():
            await asyncio.sleep(self._poll_s)
