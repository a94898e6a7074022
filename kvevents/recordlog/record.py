"""Recording deliveries from a Subscriber into a log (duck-typed: no transport import here)."""

from __future__ import annotations

import threading
import time
from typing import Any

from kvevents.recordlog.writer import RecordWriter

__all__ = ["Recorder"]


class Recorder:
    """Callbacks for a Subscriber: `on_delivery` writes a batch record, `on_reset` a reset marker.

    The subscriber hands deliveries over in repaired order (replayed gaps filled in seq order,
    resyncs as a Reset then "snapshot" deliveries), so the log keeps exactly that order.
    `done` is set once `count` batch records (heartbeats included) have been written.
    """

    def __init__(self, writer: RecordWriter, *, count: int | None = None) -> None:
        self.writer = writer
        self.count = count
        self.batches = 0
        self.resets = 0
        self.done = threading.Event()
        self.error: Exception | None = None  # a failed write (disk full...): recording stops, done is set
        self._lock = threading.Lock()

    def stop(self) -> None:
        """Write nothing more (waits for a write in progress)."""
        with self._lock:
            self.done.set()

    def _fail(self, exc: Exception) -> None:
        self.error = exc
        self.done.set()

    def on_delivery(self, d: Any) -> None:
        with self._lock:
            if self.done.is_set():
                return
            batch = getattr(d, "batch", None)
            epoch = getattr(d, "epoch", None)
            if epoch is None and batch is not None:
                epoch = batch.epoch
            rank = getattr(d, "dp_rank", None)
            if rank is None and batch is not None:
                rank = batch.data_parallel_rank
            try:
                self.writer.write(
                    d.payload,
                    source=str(d.source),
                    endpoint=str(getattr(d, "endpoint", "") or ""),
                    topic=str(getattr(d, "topic", "") or ""),
                    seq=getattr(d, "seq", None),
                    epoch=epoch,
                    dp_rank=rank,
                    kind=str(getattr(d, "kind", "live") or "live"),
                    recv_time=getattr(d, "received_at", None) or time.time(),
                )
            except (OSError, ValueError) as exc:
                return self._fail(exc)
            self.batches += 1
            if self.count is not None and self.batches >= self.count:
                self.done.set()

    def on_reset(self, r: Any) -> None:
        with self._lock:
            if self.done.is_set():
                return
            try:
                self.writer.write_reset(source=str(r.source), reason=str(getattr(r, "reason", "") or ""),
                                        dp_rank=getattr(r, "dp_rank", None))
            except (OSError, ValueError) as exc:
                return self._fail(exc)
            self.resets += 1
