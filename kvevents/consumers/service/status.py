"""What `GET /` and `GET /status.json` of `kvevents route` show: workers, per-source repair activity
over the last minutes, and whether routing pays off.

`StatusBoard` keeps cheap running counts (a replay episode per source, /score outcomes) and a ring of
per-second samples of them, so the page can plot the last minutes without Prometheus. `view()`
builds the JSON; `render_page()` puts the same numbers, server-rendered, into the HTML page shipped
as package data (kvevents/consumers/service/static/status.html), whose small script then refreshes it.
"""

from __future__ import annotations

import html
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from importlib import resources
from itertools import pairwise
from typing import Any

from kvevents.consumers.service.seams import StatusSource
from kvevents.consumers.worker_key import WorkerKey

__all__ = ["MATCHED_BUCKETS", "PROXY_COLUMNS", "SOURCE_SERIES", "StatusBoard", "page_template", "render_page"]

#: matched-pages buckets of the page (lower bounds): 0, 1, 2-3, 4-7, ... 64+
MATCHED_BUCKETS: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32, 64)
#: per-source series kept in the ring, in column order
SOURCE_SERIES: tuple[str, ...] = ("gaps", "replays", "snapshots", "restarts")
RING_SECONDS = 300  # samples kept (one a second): five minutes
WINDOW_S = 120  # what the page shows


def _bucket_label(i: int) -> str:
    lo = MATCHED_BUCKETS[i]
    if i + 1 == len(MATCHED_BUCKETS):
        return f"{lo}+"
    hi = MATCHED_BUCKETS[i + 1] - 1
    return str(lo) if hi == lo else f"{lo}-{hi}"


def _bucket_of(pages: int) -> int:
    i = 0
    while i + 1 < len(MATCHED_BUCKETS) and pages >= MATCHED_BUCKETS[i + 1]:
        i += 1
    return i


class StatusBoard:
    """Running counts for the status page plus a ring of per-second samples of them.

    `delivered`/`reset` are called by the service under its index lock, `scored` by HTTP threads;
    `sample(now)` is called once a second by `start()`'s thread (tests call it with their own clock).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, ring_seconds: int = RING_SECONDS) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._last_kind: dict[str, str] = {}
        self._source: dict[str, Counter[str]] = {}  # source -> gaps, replays, snapshots, restarts (cumulative)
        self._requests = 0
        self._with_prefix = 0
        self._matched = [0] * len(MATCHED_BUCKETS)
        self._ring: deque[tuple[float, dict[str, tuple[int, ...]], int, int]] = deque(maxlen=ring_seconds)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.started_at = clock()
        # copies by adapter cost O(index) under the index lock (~50 ms at a million entries): they
        # are recounted at most every `adapter_refresh_s`, or 50x the last count's cost if longer
        self.adapter_refresh_s = 5.0
        self._adapters: tuple[float, float, dict[WorkerKey, dict[str, int]]] | None = None  # (at, cost, counts)

    # ---------------------------------------------------------------- counting

    def delivered(self, source: str, kind: str) -> None:
        """A batch applied: a run of replayed batches counts one (healed) gap, snapshot batches count."""
        with self._lock:
            c = self._source.setdefault(source, Counter())
            if kind == "replay":
                c["replays"] += 1
                if self._last_kind.get(source) != "replay":
                    c["gaps"] += 1
            elif kind == "snapshot" and self._last_kind.get(source) != "snapshot":
                c["snapshots"] += 1
            self._last_kind[source] = kind

    def reset(self, source: str, reason: str) -> None:
        """A Reset: "restart" counts a restart, "gap" an unrecoverable gap."""
        with self._lock:
            c = self._source.setdefault(source, Counter())
            if reason == "restart":
                c["restarts"] += 1
            elif reason == "gap":
                c["gaps"] += 1

    def scored(self, matched_pages: int) -> None:
        """One answered POST /score; `matched_pages` of the best worker (0: no worker had a prefix)."""
        with self._lock:
            self._requests += 1
            self._with_prefix += 1 if matched_pages > 0 else 0
            self._matched[_bucket_of(matched_pages)] += 1

    # ---------------------------------------------------------------- the ring

    def sample(self, now: float | None = None) -> None:
        """Record the running counts as of `now` (one sample a second is what the page assumes)."""
        now = self.clock() if now is None else now
        with self._lock:
            per = {s: tuple(c[k] for k in SOURCE_SERIES) for s, c in self._source.items()}
            self._ring.append((now, per, self._requests, self._with_prefix))

    def start(self, interval_s: float = 1.0) -> None:
        """Sample every `interval_s` on a daemon thread until `stop()`."""
        if self._thread is not None:
            return
        self._stop.clear()
        self.sample()

        def run() -> None:
            while not self._stop.wait(interval_s):
                self.sample()

        self._thread = threading.Thread(target=run, name="kvevents-route-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
            self._thread = None

    def activity(self, window_s: int = WINDOW_S) -> dict[str, Any]:
        """Per source: counts over the window and per-second deltas; /score rate and outcomes."""
        with self._lock:
            ring = list(self._ring)
            totals = {s: tuple(c[k] for k in SOURCE_SERIES) for s, c in self._source.items()}
            requests, with_prefix, matched = self._requests, self._with_prefix, list(self._matched)
        now = self.clock()
        ring.append((now, totals, requests, with_prefix))  # the current counts close the window
        ring = [r for r in ring if r[0] >= now - window_s - 0.5]
        t0 = ring[0][0]
        span = max(now - t0, 1e-9)
        sources: dict[str, Any] = {}
        for name in sorted(totals):
            cum = [r[1].get(name, (0,) * len(SOURCE_SERIES)) for r in ring]
            series = {k: [max(0, b[i] - a[i]) for a, b in pairwise(cum)] for i, k in enumerate(SOURCE_SERIES)}
            sources[name] = {
                "window": {k: max(0, cum[-1][i] - cum[0][i]) for i, k in enumerate(SOURCE_SERIES)},
                "total": dict(zip(SOURCE_SERIES, cum[-1])),
                "series": series,
            }
        reqs = [r[2] for r in ring]
        hits = [r[3] for r in ring]
        d_req, d_hit = reqs[-1] - reqs[0], hits[-1] - hits[0]
        return {
            "window_s": round(span, 1),
            "sources": sources,
            "score": {
                "requests_total": requests,
                "with_prefix_total": with_prefix,
                "window_requests": d_req,
                "rate_per_s": round(d_req / span, 2) if span >= 1 else 0.0,
                "prefix_share": round(d_hit / d_req, 4) if d_req else None,
                "prefix_share_total": round(with_prefix / requests, 4) if requests else None,
                "series": [max(0, b - a) for a, b in pairwise(reqs)],
                "matched_pages": [{"pages": _bucket_label(i), "requests": n} for i, n in enumerate(matched)],
            },
        }

    # ---------------------------------------------------------------- the whole view

    def view(self, service: StatusSource) -> dict[str, Any]:
        """GET /status.json: /workers plus copies by adapter, repair activity and /score outcomes."""
        workers = service.workers_view()
        adapters, adapters_at = self._adapter_counts(service)
        media: set[str] = set()
        names: set[str] = set()
        for w in workers["workers"]:
            w["blocks_by_adapter"] = adapters.get(WorkerKey(w["worker"], w["dp_rank"]), {})
            media.update(w["blocks_by_medium"])
            names.update(w["blocks_by_adapter"])
        act = self.activity()
        return {
            "generated_at": round(time.time(), 3),
            "uptime_s": round(self.clock() - self.started_at, 1),
            "workers": workers["workers"],
            "media": sorted(media),
            "adapters": sorted(names),
            "index": workers["index"],
            "adapters_age_s": round(self.clock() - adapters_at, 1),
            **act,
        }

    def _adapter_counts(self, service: StatusSource) -> tuple[dict[WorkerKey, dict[str, int]], float]:
        now = self.clock()
        cached = self._adapters
        if cached is not None and now - cached[0] < max(self.adapter_refresh_s, 50 * cached[1]):
            return cached[2], cached[0]
        t0 = time.perf_counter()
        counts = service.adapter_counts()
        self._adapters = (now, time.perf_counter() - t0, counts)
        return counts, now


# ---------------------------------------------------------------- server-side rendering


def page_template() -> str:
    """The page shipped as package data (kvevents/consumers/service/static/status.html)."""
    return resources.files("kvevents.consumers.service").joinpath("static/status.html").read_text(encoding="utf-8")


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _num(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else _e(v)


def _adapter_name(a: str) -> str:
    return a or "(base)"


def spark(values: list[int], width: int = 120, height: int = 22) -> str:
    """A per-second bar sparkline as inline SVG (the script draws the same)."""
    n = max(1, len(values))
    top = max(values) if values else 0
    bw = width / n
    bars = []
    for i, v in enumerate(values):
        if v:
            h = max(1.0, height * v / top)
            bars.append(
                f'<rect x="{i * bw:.1f}" y="{height - h:.1f}" width="{max(bw - 0.3, 0.6):.1f}" height="{h:.1f}"/>'
            )
    return (
        f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="per second, max {top}"><line x1="0" y1="{height - 0.5}" x2="{width}" y2="{height - 0.5}"/>'
        f"{''.join(bars)}</svg>"
    )


def _workers_html(s: dict[str, Any]) -> str:
    media, adapters = s["media"], s["adapters"]
    head = ["worker", "dp rank", "state", "blocks"] + [f"{m}" for m in media] + [_adapter_name(a) for a in adapters]
    head += ["last seq", "lag (s)", "heard (s ago)", "keys", "replay"]
    groups = (
        (
            f'<colgroup><col span="4"><col span="{len(media)}" class="g-medium">'
            f'<col span="{len(adapters)}" class="g-adapter"><col span="5"></colgroup>'
        )
        if media or adapters
        else ""
    )
    rows = []
    for w in s["workers"]:
        state = "stale" if w["stale"] else ("repairing" if w.get("repairing") else "healthy")
        cells = [
            f'<th scope="row" data-k="worker">{_e(w["worker"])}</th>',
            f'<td data-k="dp_rank">{w["dp_rank"]}</td>',
            f'<td data-k="state"><span class="pill {state}">{state}</span></td>',
            f'<td data-k="blocks">{_num(w["blocks"])}</td>',
        ]
        cells += [f'<td data-k="medium:{_e(m)}">{_num(w["blocks_by_medium"].get(m, 0))}</td>' for m in media]
        cells += [f'<td data-k="adapter:{_e(a)}">{_num(w["blocks_by_adapter"].get(a, 0))}</td>' for a in adapters]
        cells += [
            f'<td data-k="last_seq">{_num(w["last_seq"])}</td>',
            f'<td data-k="lag_s">{_num(w["lag_s"])}</td>',
            f'<td data-k="last_heard_age_s">{_num(w["last_heard_age_s"], 1)}</td>',
            f'<td data-k="key_mode">{_e(w.get("key_mode") or "")}</td>',
            f'<td data-k="replay_framing">{_e(w.get("replay_framing") or "")}</td>',
        ]
        rows.append(
            f'<tr data-worker="{_e(w["worker"])}" data-rank="{w["dp_rank"]}" class="{state}">{"".join(cells)}</tr>'
        )
    sub = (
        (
            f'<tr class="sub"><th colspan="4"></th><th colspan="{len(media)}">by medium</th>'
            f'<th colspan="{len(adapters)}">by adapter</th><th colspan="5"></th></tr>'
        )
        if media or adapters
        else ""
    )
    body = "".join(rows) or f'<tr><td colspan="{len(head)}">no publisher yet</td></tr>'
    ths = "".join(f'<th scope="col">{_e(h)}</th>' for h in head)
    return f'<table id="workers">{groups}<thead>{sub}<tr>{ths}</tr></thead><tbody>{body}</tbody></table>'


def _sources_html(s: dict[str, Any]) -> str:
    rows = []
    for name, src in s["sources"].items():
        cells = [f'<th scope="row">{_e(name)}</th>']
        for k in SOURCE_SERIES:
            cells.append(
                f'<td data-k="{k}">{_num(src["window"][k])} <small>({_num(src["total"][k])})</small>'
                f"{spark(src['series'][k])}</td>"
            )
        rows.append(f'<tr data-source="{_e(name)}">{"".join(cells)}</tr>')
    body = "".join(rows) or f'<tr><td colspan="{1 + len(SOURCE_SERIES)}">nothing applied yet</td></tr>'
    head = "".join(f'<th scope="col">{k}</th>' for k in ("source",) + SOURCE_SERIES)
    return f'<table id="sources"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _score_html(s: dict[str, Any]) -> str:
    sc = s["score"]
    share = "–" if sc["prefix_share"] is None else f"{sc['prefix_share']:.0%}"
    tiles = (
        f'<div class="tile"><b data-k="rate_per_s">{sc["rate_per_s"]:.2f}</b><span>/score per s</span>{spark(sc["series"])}</div>'
        f'<div class="tile"><b data-k="prefix_share">{share}</b><span>routed to a worker holding a prefix</span></div>'
        f'<div class="tile"><b data-k="requests_total">{_num(sc["requests_total"])}</b><span>/score answered</span></div>'
    )
    top = max([b["requests"] for b in sc["matched_pages"]] + [1])
    bars = "".join(
        f'<div class="bar" data-pages="{_e(b["pages"])}"><span class="lbl">{_e(b["pages"])}</span>'
        f'<span class="fill" style="width:{100 * b["requests"] / top:.1f}%"></span>'
        f'<span class="n">{_num(b["requests"])}</span></div>'
        for b in sc["matched_pages"]
    )
    return f'<div class="tiles">{tiles}</div><div id="matched" class="hist">{bars}</div>'


#: the proxy table's columns: (heading, key in /status.json's proxy.workers rows)
PROXY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("requests", "requests_total"),
    ("per s", "rate_per_s"),
    ("errors", "errors_total"),
    ("TTFB p50 (s)", "ttfb_p50_s"),
    ("TTFB p99 (s)", "ttfb_p99_s"),
    ("in flight", "inflight_requests"),
    ("prefill blocks", "prefill_blocks"),
    ("decode blocks", "decode_blocks"),
)


def _proxy_html(s: dict[str, Any]) -> str:
    """The proxy's per-worker table (route --proxy), or nothing."""
    proxy = s.get("proxy")
    if not proxy:
        return ""
    head = "".join(f'<th scope="col">{_e(h)}</th>' for h in ("worker", "dp rank", *(c[0] for c in PROXY_COLUMNS)))
    rows = []
    for w in proxy["workers"]:
        cells = [f'<th scope="row" data-k="worker">{_e(w["worker"])}</th>', f'<td data-k="dp_rank">{w["dp_rank"]}</td>']
        cells += [f'<td data-k="{k}">{_num(w[k], 4)}</td>' for _, k in PROXY_COLUMNS]
        rows.append(f'<tr data-worker="{_e(w["worker"])}" data-rank="{w["dp_rank"]}">{"".join(cells)}</tr>')
    body = "".join(rows) or f'<tr><td colspan="{2 + len(PROXY_COLUMNS)}">no request proxied yet</td></tr>'
    return f'<table id="proxy"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def render_page(status: dict[str, Any]) -> str:
    """The whole page with `status` rendered in (readable without JavaScript)."""
    page = page_template()
    idx = status["index"]
    summary = (
        f"{len(status['workers'])} worker(s), {_num(idx.get('copies', 0))} block copies, "
        f"{_num(idx.get('entries', 0))} index entries; last {status['window_s']:.0f} s"
    )
    parts = {
        "<!--SUMMARY-->": _e(summary),
        "<!--WORKERS-->": _workers_html(status),
        "<!--SOURCES-->": _sources_html(status),
        "<!--SCORE-->": _score_html(status),
        "<!--PROXY-->": _proxy_html(status),
        "<!--PROXY-HIDDEN-->": "" if status.get("proxy") else "hidden",
    }
    for key, value in parts.items():
        page = page.replace(key, value)
    return page
