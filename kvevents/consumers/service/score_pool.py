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
- is read at a paced rate (ReadRate: all long bodies together, 48 MiB/s by default): reading is the
  event loop's own work (uvicorn's h11 parser and the copy, ~1 core at 300-400 MB/s), so unpaced,
  four clients of 16 MB bodies held normal /score at p99 x5 idle; while a body is paused the
  server stops reading its socket and TCP holds the client back;
- is decoded, hashed, looked up and its answer encoded on a pool of `slots` threads, the body
  freed once decoded; the compiled decoder and the page hash let the GIL go for a long body, and
  the pool's threads run at a lower CPU priority, so the loop keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Callable

import msgspec

from kvevents.consumers.service.http_guard import Admission
from kvevents.consumers.service.score_body import Body
from kvevents.consumers.service.seams import HttpService

__all__ = ["BodyTooLong", "LongBodies", "ReadRate", "read_body", "score_encoded"]

_json = msgspec.json.Encoder()


class BodyTooLong(ValueError):
    """More body bytes arrived than allowed (or declared)."""


class ReadRate:
    """A token bucket on the bytes of long bodies read (all of them together, on the event loop):
    `pause(n)` is how long to wait after reading n more, so reading stays under `bytes_per_s` on
    average with up to `burst` bytes at once. 0 bytes/s: no pacing."""

    def __init__(self, bytes_per_s: float, burst: int = 1 << 20, clock: Callable[[], float] = time.monotonic) -> None:
        if bytes_per_s < 0 or burst < 0:
            raise ValueError(f"a read rate needs bytes_per_s >= 0 and burst >= 0 (got {bytes_per_s}, {burst})")
        self.bytes_per_s, self.burst, self._clock = bytes_per_s, burst, clock
        self._paid_until = float("-inf")  # when the bytes read so far are paid for at the rate
        self.pauses = 0
        self.paused_s = 0.0

    def pause(self, n: int) -> float:
        """Seconds to wait before reading on, having just read `n` bytes (0: read on at once)."""
        if not self.bytes_per_s:
            return 0.0
        now = self._clock()
        start = max(self._paid_until, now - self.burst / self.bytes_per_s)  # idle time refills, up to a burst
        self._paid_until = start + n / self.bytes_per_s
        wait = self._paid_until - now
        if wait <= 0:
            return 0.0
        self.pauses += 1
        self.paused_s += wait
        return wait

    def seconds(self, n: int) -> float:
        """How long reading `n` bytes takes at the rate alone (what a body's timeout adds)."""
        return n / self.bytes_per_s if self.bytes_per_s else 0.0


class LongBodies:
    """The gate, the read rate and the worker pool for long /score bodies; `close()` joins the pool."""

    def __init__(self, slots: int, queue: int, wait_s: float, bytes_per_s: float = 0.0) -> None:
        self.gate = Admission(slots, queue, wait_s, name="long bodies")
        self.rate = ReadRate(bytes_per_s)
        self._pool = ThreadPoolExecutor(
            max_workers=slots, thread_name_prefix="kvevents-score", initializer=_background_priority
        )

    def read_allowance(self, n: int) -> float:
        """Seconds the pacing adds to reading an `n`-byte body, when every place reads at once."""
        return self.gate.limit * self.rate.seconds(n)

    def counts(self) -> dict[str, int]:
        """The gate's counts, and the pacing's: pauses made and milliseconds paused in all."""
        return {**self.gate.counts, "paced": self.rate.pauses, "paced_ms": int(self.rate.paused_s * 1e3)}

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


async def read_body(
    chunks: AsyncIterator[bytes], declared: int | None, limit: int, rate: ReadRate | None = None
) -> Body:
    """The body from its chunks into one buffer: `declared` bytes long when a Content-Length was
    given, else grown as it comes; BodyTooLong past `limit` (or past `declared`); paced by `rate`."""
    if not declared:
        grown = bytearray()
        async for chunk in chunks:
            grown += chunk
            if len(grown) > limit:
                raise BodyTooLong(f"body exceeds {limit} bytes")
            await _paced(rate, len(chunk))
        return grown
    buf = _anonymous(declared)
    off = 0
    async for chunk in chunks:
        if off + len(chunk) > declared:
            raise BodyTooLong(f"body longer than its Content-Length of {declared}")
        buf[off : off + len(chunk)] = chunk
        off += len(chunk)
        await _paced(rate, len(chunk))
    return buf if off == declared else buf[:off]  # short: the stream ended early


async def _paced(rate: ReadRate | None, n: int) -> None:
    wait = rate.pause(n) if rate is not None else 0.0
    if wait > 0:
        await asyncio.sleep(wait)


def _anonymous(size: int) -> mmap.mmap:
    """`size` bytes of private anonymous memory: zero pages the kernel supplies as they are written."""
    if hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS"):
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return mmap.mmap(-1, size)  # pragma: no cover - Windows


def score_encoded(service: HttpService, held: list[Body]) -> tuple[int, bytes]:
    """Score the body in `held` (taken out of it, so it is freed once decoded): (status, JSON answer)."""
    status, obj = service.score_decoded(service.decode_score(held.pop()))
    return status, _json.encode(obj) + b"\n"
