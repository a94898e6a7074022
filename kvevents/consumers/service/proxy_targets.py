"""Where the proxy sends a worker's requests: `route --worker-url NAME[#dpR]=URL`, and which URLs
failed to connect lately.

`NAME=URL` gives the URL for every dp rank of the publisher NAME (a data-parallel engine has one
HTTP front for all its ranks); `NAME#dpR=URL` for rank R alone, and wins over `NAME=URL` for it.
A worker whose connection failed is tried after the others for `down_for_s` seconds (then as
usual again): requests do not keep paying a refused or timed-out connect.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import httpx

from kvevents.consumers.worker_key import WorkerKey

__all__ = ["Targets", "WorkerUrl", "parse_worker_url"]

_RANKED = re.compile(r"(.+)#dp(\d{1,4})")


@dataclass(frozen=True)
class WorkerUrl:
    """A worker's OpenAI-compatible base URL (no trailing `/` or `/v1`); dp_rank None: every rank."""

    source: str
    dp_rank: int | None
    url: str


def parse_worker_url(spec: str) -> WorkerUrl:
    """`NAME=http://HOST:PORT` or `NAME#dpR=https://...` -> WorkerUrl (ValueError naming the spec)."""
    name, sep, url = spec.partition("=")
    name, url = name.strip(), url.strip()
    usage = f"--worker-url {spec!r}: expected NAME=http://HOST:PORT or NAME#dpR=http://HOST:PORT"
    if not sep or not name or not url:
        raise ValueError(usage)
    rank: int | None = None
    m = _RANKED.fullmatch(name)
    if m is not None:
        name, rank = m.group(1), int(m.group(2))
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        raise ValueError(f"{usage} (not a URL: {url!r})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"{usage} (the URL must be http:// or https:// with a host)")
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return WorkerUrl(name, rank, base)


class Targets:
    """URL per worker key, the ranks seen per source, and the recently failed URLs."""

    def __init__(
        self, urls: Sequence[WorkerUrl], *, down_for_s: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not urls:
            raise ValueError("the proxy needs at least one --worker-url NAME=URL")
        self._exact: dict[WorkerKey, str] = {}
        self._any: dict[str, str] = {}
        for w in urls:
            if w.dp_rank is None:
                if w.source in self._any:
                    raise ValueError(f"--worker-url {w.source}: given twice")
                self._any[w.source] = w.url
            else:
                key = WorkerKey(w.source, w.dp_rank)
                if key in self._exact:
                    raise ValueError(f"--worker-url {w.source}#dp{w.dp_rank}: given twice")
                self._exact[key] = w.url
        self.down_for_s = down_for_s
        self.clock = clock
        self._lock = threading.Lock()
        self._ranks: dict[str, set[int]] = {}  # ranks of each source seen in rankings
        self._down_until: dict[str, float] = {}

    def url_for(self, key: WorkerKey) -> str | None:
        """The URL serving this worker, or None (no --worker-url for it)."""
        got = self._exact.get(key)
        return got if got is not None else self._any.get(key.source)

    def urls(self) -> list[str]:
        """Every distinct URL, in the order given."""
        return list(dict.fromkeys([*self._exact.values(), *self._any.values()]))

    def seen(self, keys: Iterable[WorkerKey]) -> None:
        """Remember the ranks a ranking showed, so a URL for every rank knows which keys it serves."""
        with self._lock:
            for key in keys:
                self._ranks.setdefault(key.source, set()).add(key.dp_rank)

    def all_keys(self) -> list[WorkerKey]:
        """Every worker key a URL serves: exact ones, and each seen rank (else rank 0) of the others."""
        with self._lock:
            out = list(self._exact)
            for source in self._any:
                ranks = sorted(self._ranks.get(source) or {0})
                out += [WorkerKey(source, r) for r in ranks if WorkerKey(source, r) not in self._exact]
        return out

    def failed(self, url: str) -> None:
        """A connection to `url` failed: try it last for `down_for_s` seconds."""
        with self._lock:
            self._down_until[url] = self.clock() + self.down_for_s

    def answered(self, url: str) -> None:
        with self._lock:
            self._down_until.pop(url, None)

    def is_down(self, url: str) -> bool:
        with self._lock:
            until = self._down_until.get(url)
            if until is None:
                return False
            if self.clock() >= until:
                del self._down_until[url]
                return False
            return True
