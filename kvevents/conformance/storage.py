"""`kvevents conformance storage`: the end-to-end storage-tier test of SGLang's namespace change,
run against any HiCache backend given by module and class (inside an SGLang environment).

SGLang's own HiRadixCache and HiCacheController (kvevents/conformance/storage_engine.py) serve one
prompt under an adapter (extra_key), the base model and a salt, twice each, device and host flushed
after every request, the backend loaded by SGLang's `dynamic` factory. kvevents' BlockIndex and
PrefixRouter are fed by the same cache's events. Rules (RULES): the adapter's pages come back from
storage with identical contents; the base and salted requests find less than one page of the
adapter's; each namespace's second request hits storage; the index equals the cache after every
step and the router never credits the worker with pages it cannot serve for the request's namespace.
The prompt is random per run (fixed with `seed`), so a backend's persistent store never answers for
an earlier run.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvevents.conformance.report import Report, RuleResult, Status
from kvevents.conformance.storage_engine import EngineSpec, EngineUnavailable, HiCacheEngine, Request, Served
from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.router import PrefixRouter
from kvevents.events import KVEventBatch
from kvevents.hashing import storage_hashes
from kvevents.plugins.sglang import convert_events

__all__ = ["RULES", "NAMESPACES", "StorageOptions", "EngineUnavailable", "run_storage"]

SOURCE = "sglang-hicache"
#: The three namespaces of the scenario, in the order they are served.
NAMESPACES: tuple[tuple[str, str | None, str | None], ...] = (
    ("adapter", "lora-a", None),
    ("base", None, None),
    ("salted", None, "tenant-1"),
)
RULES: dict[str, str] = {
    "scenario-completes": "every request and flush ran to its end (a backend that raises or hangs fails here)",
    "backend-loaded": "SGLang's dynamic factory built the backend given by module and class",
    "pages-under-storage-keys": "after a first request the backend holds every page under its storage key",
    "flush-leaves-only-storage": "after each flush neither the device nor host memory holds a page",
    "first-request-computes": "a namespace's first request finds nothing and computes every page",
    "other-namespaces-miss": "base and salted requests find less than one page of the adapter's",
    "second-request-hits-storage": "each namespace's second request loads every page from storage",
    "contents-round-trip": "pages come back from storage with identical contents, each namespace its own",
    "index-equals-cache": "kvevents' BlockIndex equals the cache (device and host) after every step",
    "router-credits-servable-only": "the router never credits the worker with pages it cannot serve for "
    "the request's namespace, and credits those it can",
}


@dataclass(frozen=True)
class StorageOptions:
    """The backend under test and the scenario's size."""

    module: str
    class_name: str
    config: Mapping[str, Any] = field(default_factory=dict)  # merged into the extra config
    pages: int = 5  # whole pages per prompt (plus a partial tail, never cached)
    page_size: int = 16
    seed: int | None = None  # None: a fresh prompt per run
    device: str | None = None
    workdir: str | None = None  # the scenario's scratch (model config); a temp dir by default

    def __post_init__(self) -> None:
        if not self.module or not self.class_name:
            raise ValueError("give the backend's module and class")
        if not isinstance(self.config, Mapping):
            raise ValueError("the backend config must be a JSON object")
        if self.pages < 1 or self.page_size < 1:
            raise ValueError("pages and page_size must be >= 1")


class _Rule:
    def __init__(self, name: str) -> None:
        self.name, self.checked = name, 0
        self.examples: list[str] = []

    def check(self, ok: bool, example: str) -> bool:
        self.checked += 1
        if not ok:
            self.examples.append(example)
        return ok

    def result(self) -> RuleResult:
        if not self.checked:
            return RuleResult(self.name, Status.NOT_CHECKABLE, "never reached", 0)
        status = Status.FAIL if self.examples else Status.PASS
        return RuleResult(self.name, status, RULES[self.name], self.checked, self.examples[:5])


class _Scenario:
    """The requests, the flushes, and every rule's checks between them."""

    def __init__(self, engine: HiCacheEngine, opts: StorageOptions, tokens: list[int]) -> None:
        self.engine, self.opts, self.tokens = engine, opts, tokens
        self.rules = {name: _Rule(name) for name in RULES}
        self.index = BlockIndex()
        self.router = PrefixRouter(self.index, opts.page_size, seed=0)
        self.first: dict[str, Served] = {}
        self.resident: dict[str, dict[str, int]] = {}  # a figure: see note_resident
        self.steps = 0
        self.backend_class = ""

    def feed(self, step: str) -> None:
        """Apply the cache's events to the index; compare it with the cache."""
        events, _ = convert_events(self.engine.take_events())
        if events:
            self.index.apply(SOURCE, KVEventBatch(ts=time.time(), events=events, data_parallel_rank=0))
        self.steps += 1
        truth = self.engine.tree_truth()
        got = {(m, h): n for m in ("GPU", "CPU_PINNED") for h, n in self.index.copies(SOURCE, medium=m).items()}
        want = dict(truth)
        self.rules["index-equals-cache"].check(
            got == want, f"{step}: index {sum(got.values())} copies, cache {sum(want.values())}"
        )

    def credit(self, req: Request) -> int:
        for s in self.router.score(req.tokens, cache_salt=req.cache_salt):
            if s.key.source == SOURCE:
                return s.matched_pages
        return 0

    def check_credit(self, step: str, req: Request, *, exact: bool) -> None:
        servable, credited = self.engine.servable_pages(req), self.credit(req)
        ok = credited == servable if exact else credited <= servable
        self.rules["router-credits-servable-only"].check(
            ok, f"{step}: router credits {credited} pages, the cache serves {servable}"
        )

    def note_resident(self, name: str) -> None:
        """While `name`'s pages are on the device (before the flush), what the router credits the
        worker for the other namespaces' requests: a figure, not a rule. Event hashes leave
        extra_key out (schemas/README.md, "Event hashes (cache_salt only)") and SGLang publishes no
        lora_name, so an adapter's resident pages are credited to a base request of the same
        tokens; a salt separates them."""
        self.resident[name] = {
            other: self.credit(Request(self.tokens, ek, salt)) for other, ek, salt in NAMESPACES if other != name
        }

    def stored_pages(self, req: Request) -> int:
        keys = storage_hashes(req.tokens, self.opts.page_size, req.namespace)
        return int(self.engine.backend.batch_exists(keys))

    def run(self) -> None:
        for name, extra_key, salt in NAMESPACES:
            req = Request(self.tokens, extra_key, salt)
            for attempt in (1, 2):
                step = f"{name} #{attempt}"
                self.check_credit(f"{step} arrival", req, exact=False)
                served = self.engine.serve(req)
                self.feed(step)
                self.check_credit(f"{step} served", req, exact=True)
                if attempt == 1:
                    self.note_resident(name)
                self.judge(name, attempt, req, served)
                self.engine.flush()
                self.feed(f"{step} flush")
                left = self.engine.only_storage_left()
                self.rules["flush-leaves-only-storage"].check(not left, f"after {step}: {left}")

    def judge(self, name: str, attempt: int, req: Request, served: Served) -> None:
        r, n = self.rules, self.opts.pages * self.opts.page_size
        if attempt == 1:
            self.first[name] = served
            stored = self.stored_pages(req)
            r["pages-under-storage-keys"].check(
                stored == self.opts.pages, f"{name}: {stored} of {self.opts.pages} pages"
            )
            r["first-request-computes"].check(
                served.computed == n and served.from_storage == 0, f"{name}: {_found(served)}"
            )
            if name != "adapter":
                adapter = Request(self.tokens, NAMESPACES[0][1], NAMESPACES[0][2])
                held = self.stored_pages(adapter)
                found = max(served.storage_query, served.from_storage)
                ok = found < self.opts.page_size and held == self.opts.pages
                r["other-namespaces-miss"].check(ok, f"{name}: found {found} tokens, adapter pages held {held}")
            return
        ok = served.from_storage == n and served.storage_query == n and served.computed == 0
        r["second-request-hits-storage"].check(ok, f"{name}: {_found(served)}")
        same = served.contents == self.first[name].contents
        others = [o for o, s in self.first.items() if o != name and s.contents == served.contents]
        r["contents-round-trip"].check(
            same and not others, f"{name}: identical {same}, equal to {others or 'no other namespace'}"
        )

    def check_backend(self) -> None:
        """SGLang's factory checked the subclass; this checks it built the class asked for."""
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

        cls = type(self.engine.backend)
        name = f"{cls.__module__}.{cls.__qualname__}"
        ok = cls.__name__ == self.opts.class_name and isinstance(self.engine.backend, HiCacheStorage)
        self.backend_class = name
        self.rules["backend-loaded"].check(ok, f"SGLang built {name}")

    def report(self) -> Report:
        return Report("storage", [rule.result() for rule in self.rules.values()])


def _found(s: Served) -> str:
    return f"query {s.storage_query}, from storage {s.from_storage}, host {s.from_host}, device {s.on_device}, computed {s.computed}"


def run_storage(opts: StorageOptions) -> Report:
    """Run the scenario once; EngineUnavailable when SGLang is missing or cannot build the cache here."""
    seed = opts.seed if opts.seed is not None else int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    tokens = [rng.randrange(1, 30000) for _ in range(opts.pages * opts.page_size + opts.page_size // 2)]
    spec = EngineSpec(opts.module, opts.class_name, opts.config, page_size=opts.page_size, device=opts.device)
    with tempfile.TemporaryDirectory(prefix="kvevents-storage-", dir=opts.workdir) as work:
        t0 = time.monotonic()
        engine = HiCacheEngine(spec, Path(work))
        try:
            scenario = _Scenario(engine, opts, tokens)
            completes = scenario.rules["scenario-completes"]
            try:
                scenario.check_backend()
                scenario.feed("start")
                scenario.run()
                completes.check(True, "")
            except Exception as exc:  # noqa: BLE001 - the backend's failure is the verdict
                completes.check(False, f"after {scenario.steps} steps: {type(exc).__name__}: {exc}")
            report = scenario.report()
            stats = getattr(engine.backend, "stats", None)
            report.figures.update(backend_class=scenario.backend_class, seed=seed, pages=opts.pages)
            report.figures.update(page_size=opts.page_size, steps=scenario.steps)
            report.figures["credit_while_resident"] = scenario.resident
            if callable(stats):
                report.figures["backend"] = dict(stats())
            report.figures["seconds"] = round(time.monotonic() - t0, 2)
            return report
        finally:
            engine.close()
