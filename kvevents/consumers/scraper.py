"""The router's load scraper: each engine's Prometheus page (`route --metrics-url NAME=URL`), read
every `interval_s` on a background thread, becomes its workers' `metrics` load (kvevents.consumers.loads).

Each fetch has a deadline (`timeout_s` for the whole response, connect included) and a bounded
body (`max_body_bytes`, past it the page is refused); engines are fetched in parallel (a few
threads), so one that hangs delays nobody else. A failed fetch is counted and leaves the last load
in place, which then turns stale by age. What a page says becomes blocks (README, "Load"):
decode = KV pool in use x pool size (or, when the engine does not export its pool size, running
requests x the mean request size), prefill = waiting requests x the mean request size, the mean
being the whole pages of the requests /score has seen.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

from kvevents.consumers.engine_load import EngineLoad, read_engine_loads
from kvevents.consumers.loads import LoadBoard, WorkerLoad
from kvevents.consumers.worker_key import WorkerKey

__all__ = ["MetricsScraper", "ScrapeStatus", "parse_metrics_urls", "fetch_text", "to_worker_load"]

log = logging.getLogger("kvevents.consumers.scraper")

MAX_BODY_BYTES = 4 << 20  # a vLLM page is ~80 KB, SGLang's ~30 KB
_PARALLEL = 8


def parse_metrics_urls(specs: Sequence[str]) -> dict[str, str]:
    """`NAME=URL` specs -> {name: url} (http or https); ValueError names the bad one."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, url = spec.partition("=")
        name, url = name.strip(), url.strip()
        if not sep or not name or not url:
            raise ValueError(f"--metrics-url {spec!r}: expected NAME=URL, e.g. w0=http://127.0.0.1:8000/metrics")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--metrics-url {spec!r}: the URL must be http:// or https:// with a host")
        if name in out:
            raise ValueError(f"--metrics-url: {name!r} given twice")
        out[name] = url
    return out


def fetch_text(url: str, timeout_s: float, max_body_bytes: int = MAX_BODY_BYTES) -> str:
    """GET `url` within `timeout_s` (the whole exchange); the body as text. OSError / ValueError on failure."""
    parts = urlsplit(url)
    deadline = time.monotonic() + timeout_s
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "", parts.port, timeout=timeout_s)
    try:
        path = parts.path or "/"
        conn.request("GET", path + (f"?{parts.query}" if parts.query else ""), headers={"Accept": "text/plain"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise ValueError(f"HTTP {resp.status}")
        length = resp.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > max_body_bytes:
            raise ValueError(f"body of {length} bytes exceeds {max_body_bytes}")
        chunks: list[bytes] = []
        got = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no whole answer within {timeout_s:g} s")
            if conn.sock is not None:
                conn.sock.settimeout(left)
            chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
            if not chunk:
                break
            got += len(chunk)
            if got > max_body_bytes:
                raise ValueError(f"body exceeds {max_body_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        conn.close()


def to_worker_load(load: EngineLoad, pages_per_request: float, at: float) -> WorkerLoad:
    """An engine's reported load in the router's blocks (module docstring)."""
    if load.usage is not None and load.capacity_pages:
        decode = load.usage * load.capacity_pages
    else:
        decode = load.running * pages_per_request
    return WorkerLoad(load.waiting * pages_per_request, decode, int(load.waiting), at, "metrics")


@dataclass
class ScrapeStatus:
    """One engine's scraping so far."""

    url: str
    ok: int = 0
    errors: int = 0
    last_ok_at: float | None = None  # clock seconds
    last_error: str | None = None
    ranks: int = 0  # ranks its last good page reported


class MetricsScraper:
    """Scrapes `urls` (publisher name -> metrics URL) into `board`; `scrape_once()` runs one round
    in the caller's thread (tests), `start()` a thread that runs one every `interval_s`."""

    def __init__(
        self,
        urls: Mapping[str, str],
        board: LoadBoard,
        page_size: int,
        *,
        pages_per_request: Callable[[], float] = lambda: 0.0,
        interval_s: float = 1.0,
        timeout_s: float = 2.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        fetch: Callable[[str, float, int], str] = fetch_text,
    ) -> None:
        if not interval_s > 0 or not timeout_s > 0:
            raise ValueError("scrape interval and timeout must be > 0")
        self.board = board
        self.page_size = page_size
        self.pages_per_request = pages_per_request
        self.interval_s, self.timeout_s, self.max_body_bytes = interval_s, timeout_s, max_body_bytes
        self._fetch = fetch
        self.status: dict[str, ScrapeStatus] = {name: ScrapeStatus(url) for name, url in urls.items()}
        for name in urls:
            board.expect(name)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._notices: list[str] = []  # one line per change (unreachable / read again), for `route`
        self._notice_lock = threading.Lock()

    def scrape_once(self) -> dict[str, str | None]:
        """Fetch every engine once; per name the error, or None when its load was recorded."""
        names = list(self.status)
        if len(names) <= 1 or self._pool is None:
            return {name: self._scrape(name) for name in names}
        return dict(zip(names, self._pool.map(self._scrape, names)))

    def _scrape(self, name: str) -> str | None:
        st = self.status[name]
        try:
            text = self._fetch(st.url, self.timeout_s, self.max_body_bytes)
            loads, _bad = read_engine_loads(text, self.page_size)
            if not loads:
                raise ValueError("no vLLM or SGLang load metrics on the page")
        except (OSError, ValueError, http.client.HTTPException) as exc:
            st.errors += 1
            if st.last_error is None:
                self._notice(f"{name}: load metrics at {st.url} unreadable ({exc}); its last load turns stale")
            st.last_error = str(exc) or type(exc).__name__
            return st.last_error
        at = self.board.clock()
        per = max(0.0, float(self.pages_per_request()))
        for load in loads:
            self.board.put(WorkerKey(name, load.dp_rank), to_worker_load(load, per, at))
        if st.last_error is not None or not st.ok:
            self._notice(f"{name}: load metrics read ({len(loads)} rank(s))")
        st.ok, st.last_ok_at, st.last_error, st.ranks = st.ok + 1, at, None, len(loads)
        return None

    def _notice(self, line: str) -> None:
        log.info("%s", line)
        with self._notice_lock:
            self._notices.append(line)
            del self._notices[:-100]

    def take_notices(self) -> list[str]:
        """The lines said since the last call: an engine's page turned unreadable, or was read (again)."""
        with self._notice_lock:
            out, self._notices = self._notices, []
        return out

    def start(self) -> MetricsScraper:
        if self._thread is None and self.status:
            self._stop.clear()
            self._pool = ThreadPoolExecutor(min(_PARALLEL, len(self.status)), thread_name_prefix="kvevents-scrape")
            self._thread = threading.Thread(target=self._run, name="kvevents-load-scraper", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.scrape_once()
            except Exception as exc:  # noqa: BLE001 - the thread must go on; say it once a round
                log.error("load scraper: %s: %s", type(exc).__name__, exc)
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 2.0)
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def counters(self) -> dict[str, tuple[int, int]]:
        """Per name: (good scrapes, failed scrapes)."""
        return {name: (st.ok, st.errors) for name, st in self.status.items()}
