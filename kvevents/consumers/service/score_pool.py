"""Long POST /score bodies kept off the router's event loop (issue 28 part 2).

Four clients posting legal 4M-token bodies (16 MB each) used to stall every other request (normal
/score p99 x376) and grow the router to 445 MB: each body was joined from its chunks on the loop,
decoded with the GIL held and hashed on one of 40 pool threads. Now a body over the inline size
- first takes one of `slots` places (past them it waits in a FIFO of at most `queue`, unread: the
  server stops reading a waiting request after 64 KB; past the queue, 503 with Retry-After), so at
  most `slots` long bodies are in memory at once;
- is read into one buffer of its declared length (an anonymous mapping: no join, and no 16 MB
  zero-fill on the loop as bytearray(n) does, 1.4-8 ms), within the body timeout and the size
  limit (a chunked body is counted as it arrives);
- is decoded, hashed, looked up and its answer encoded on a pool of `slots` threads, the body
  freed once decoded; the compiled decoder and the page hash let the GIL go for a long body, and
  the pool's threads run at a lower CPU priority, so the loop keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Callable

import msgspec

from kvevents.consumers.service.http_guard import Admission
from kvevents.consumers.service.score_body import Body
from kvevents.consumers.service.seams import HttpService

__all__ = ["BodyTooLong", "LongBodies", "read_body", "score_encoded"]

_json = msgspec.json.Encoder()


class BodyTooLong(ValueError):
    """More body bytes arrived than allowed (or declared)."""


class LongBodies:
    """The gate and the worker pool for long /score bodies; `close()` joins the pool's threads."""

    def __init__(self, slots: int, queue: int, wait_s: float) -> None:
        self.gate = Admission(slots, queue, wait_s, name="long bodies")
        self._pool = ThreadPoolExecutor(
            max_workers=slots, thread_name_prefix="kvevents-score", initializer=_background_priority
        )

    async def run(self, job: Callable[[], tuple[int, bytes]]) -> tuple[int, bytes]:
        """`job` on a pool thread (the caller holds a gate place, so one is always free)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, job)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


POOL_NICE = 10  # the pool's threads yield the CPU to the event loop's (Linux: a nice value per thread)


def _background_priority() -> None:
    """Lower this pool thread's CPU priority, so on a busy machine the scheduler runs the event loop
    first: a long body's hashing is the work that can wait (Linux; elsewhere nothing changes)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), POOL_NICE)
    except (AttributeError, OSError):  # pragma: no cover - not Linux, or not allowed
        pass


async def read_body(chunks: AsyncIterator[bytes], declared: int | None, limit: int) -> Body:
    """The body from its chunks into one buffer: `declared` bytes long when a Content-Length was
    given, else grown as it comes; BodyTooLong past `limit` (or past `declared`)."""
    if not declared:
        grown = bytearray()
        async for chunk in chunks:
            grown += chunk
            if len(grown) > limit:
                raise BodyTooLong(f"body exceeds {limit} bytes")
        return grown
    buf = _anonymous(declared)
    off = 0
    async for chunk in chunks:
        if off + len(chunk) > declared:
            raise BodyTooLong(f"body longer than its Content-Length of {declared}")
        buf[off : off + len(chunk)] = chunk
        off += len(chunk)
    return buf if off == declared else buf[:off]  # short: the stream ended early


def _anonymous(size: int) -> mmap.mmap:
    """`size` bytes of private anonymous memory: zero pages the kernel supplies as they are written."""
    if hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS"):
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return mmap.mmap(-1, size)  # pragma: no cover - Windows


def score_encoded(service: HttpService, held: list[Body]) -> tuple[int, bytes]:
    """Score the body in `held` (taken out of it, so it is freed once decoded): (status, JSON answer)."""
    status, obj = service.score_decoded(service.decode_score(held.pop()))
    return status, _json.encode(obj) + b"\n"
