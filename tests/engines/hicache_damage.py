"""kvevents' HiCache backend under SGLang's own HiRadixCache with damaged page files (SGLang venv only).

One adapter prompt is served, flushed and served again while its page files are damaged in between:
a flipped payload byte (the prefetch stops at that page, SGLang recomputes the rest and its
write-through repairs the store), and two page files swapped (their headers name each other's key:
both misses, nothing served). The backend's Prometheus endpoint is scraped and must equal stats().
Stand-ins: standins.TORCHVISION and standins.HICACHE, installed by the driver.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from harness import Report

from kvevents.conformance.storage_engine import EngineSpec, HiCacheEngine, Request, Served
from kvevents.hashing import storage_hashes
from kvevents.plugins import STORAGE_BACKENDS
from kvevents.plugins.hicache import extra_config
from kvevents.plugins.hicache_metrics import HICACHE_METRICS

PAGES, PAGE = 5, 16


def _pages(engine: HiCacheEngine, s: Served) -> list[bytes]:
    n = engine.page_bytes()
    return [s.contents[i * n : (i + 1) * n] for i in range(len(s.contents) // n)]


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(kvevents_hicache_\w+)\{[^}]*\} (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


class Damage:
    def __init__(self, report: Report, tmp: str) -> None:
        backend = STORAGE_BACKENDS["sglang"]
        config = extra_config(Path(tmp) / "damage-pages", fsync=False, metrics_port=0)
        spec = EngineSpec(backend.module, backend.class_name, config, page_size=PAGE)
        self.r = report
        self.engine = HiCacheEngine(spec, Path(tmp) / "damage-work")
        self.req = Request([1000 + i for i in range(PAGES * PAGE + 5)], "lora-a", None)
        self.keys = storage_hashes(self.req.tokens, PAGE, self.req.namespace)
        self.store = self.engine.backend.store

    def serve(self) -> Served:
        s = self.engine.serve(self.req)
        self.engine.flush()
        return s

    def stats(self) -> dict[str, int]:
        return dict(self.engine.backend.stats())

    def corrupt_page(self) -> tuple[Served, Served]:
        first = self.serve()
        path = self.store.path_for(self.keys[2])
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF  # one payload byte: the header still names the key, the checksum fails
        path.write_bytes(bytes(raw))
        second = self.serve()
        st = self.stats()
        p1, p2 = _pages(self.engine, first), _pages(self.engine, second)
        self.r.check(
            "corrupt_page_is_a_counted_miss",
            second.from_storage == 2 * PAGE and second.computed == 3 * PAGE and st["corrupt"] == 1,
            f"from storage {second.from_storage}, computed {second.computed}, stats {st}",
        )
        # pages 0-1 came from storage, 2-4 were recomputed: the damaged byte never reached the device
        same = [a == b for a, b in zip(p1, p2)]
        self.r.check("corrupt_page_never_served", len(p2) == PAGES and all(same), f"pages equal {same}")
        third = self.serve()
        self.r.check(
            "write_through_repairs_corrupt_page",
            third.from_storage == PAGES * PAGE and third.contents == second.contents,
            f"from storage {third.from_storage}, identical {third.contents == second.contents}",
        )
        return second, third

    def swapped_pages(self) -> None:
        a, b = self.store.path_for(self.keys[0]), self.store.path_for(self.keys[1])
        raw_a, raw_b = a.read_bytes(), b.read_bytes()
        a.write_bytes(raw_b)
        b.write_bytes(raw_a)
        before = self.stats()["misplaced"]
        fourth = self.serve()
        st = self.stats()
        self.r.check(
            "swapped_pages_are_misses",
            fourth.storage_query == 0 and fourth.from_storage == 0 and st["misplaced"] - before == 2,
            f"query {fourth.storage_query}, from storage {fourth.from_storage}, misplaced {st['misplaced'] - before}",
        )
        fifth = self.serve()
        self.r.check(
            "swapped_pages_rewritten",
            fifth.from_storage == PAGES * PAGE and fifth.contents == fourth.contents,
            f"from storage {fifth.from_storage}",
        )

    def metrics(self) -> None:
        server = self.engine.backend.metrics
        scraped, st = _scrape(server.port), self.stats()
        want = {HICACHE_METRICS[k][0]: float(v) for k, v in st.items() if k in HICACHE_METRICS}
        self.r.check("metrics_scrape_equals_stats", scraped == want, f"scraped {scraped} stats {want}")
        self.r.figures["damage_stats"] = st  # type: ignore[assignment]

    def close(self) -> None:
        port = self.engine.backend.metrics.port
        self.engine.close()  # SGLang detaches the backend: close() stops the metrics server
        try:
            _scrape(port)
            stopped = False
        except OSError:
            stopped = True
        self.r.check("metrics_server_stops_on_detach", stopped, f"port {port}")


def run(report: Report, tmp: str) -> None:
    d = Damage(report, tmp)
    try:
        d.corrupt_page()
        d.swapped_pages()
        d.metrics()
    finally:
        d.close()
