"""kvevents side by side with a peer: NVIDIA Dynamo's Rust radix tree (`dynamo.llm.RadixTree`).

    python3 benchmarks/bench_peer.py [--workers 64] [--copies 1000000] [--pages 512] [--requests 1000]
        [--rounds 3] [--cpu 1] [--peer-python /path/to/python-with-ai-dynamo-runtime] [--json]
        [--record-log PATH]
    python3 benchmarks/bench_peer.py --scale [--points 64x1M,256x1M,1024x1M,4096x1M,1024x10M] [--out DIR]

One run, the same data for both: bench_consumers' shared profile (documents of `pages` 16-token
pages cached by 1..16 of `workers` workers, 25% private chains, until `copies` copies), and
`requests` requests of `pages` pages (a quarter diverging from their document somewhere).

kvevents is measured twice, with its compiled fast path (kvevents.native) and with the
pure-Python fallback. The peer (PyPI `ai-dynamo-runtime`, optional: skipped when no interpreter
with it is found; `--peer-python` or $KVEVENTS_PEER_PYTHON names one) runs in a subprocess. Both
are pinned to the same CPU (`--cpu`; the peer's binding hops to a background thread, which costs
~5 us pinned and ~50 us unpinned). The peer keys its tree by its own unchained xxh3 page hashes
(`compute_block_hash_for_seq`), so its "full request" hashes the tokens its way; kvevents keeps
the contract's SHA-256 chain. Match results are compared on 100 requests (matched pages per worker).

Figures: apply (stores of 16-page events, already decoded for kvevents; JSON event bytes, the
peer's input form, for the peer), lookup with hashes given (kvevents `BlockIndex.prefix_match`,
peer `find_matches`), full request (hash 8,192 tokens + that lookup), hashing alone, and memory
per held copy (kvevents: tracemalloc of the index build plus its table arrays in huge-page
mappings, which tracemalloc does not see; both: RSS growth), and (kvevents only) the router's
whole answer (`PrefixRouter.score`: hash, look up, rank every worker). Each round applies
everything into a fresh index and then times every request, right after that side's own apply;
the sides take turns round by round, so a busy machine slows them alike. p50/p99 per round (and
`*_p99_pooled_us`: over every round's samples at once); the machine is shared, so compare p50s
and rounds. Apply and
the lookups are also timed in process CPU time (`*_cpu`: the peer's includes its tree's background
thread), which a busy machine's descheduling does not inflate.
`lookup_columns` (kvevents only) is the same walk as the lookup /score runs it
(`PrefixRouter.match_columns`: the matched workers as arrays, no object per worker).
`lookup_scores_cpu` (the peer only) is its lookup with the per-worker dict read: `find_matches`
returns an OverlapScores whose `.scores` dict is built when it is read, so its bare lookup builds
no object per worker (as `lookup_columns`) and with `.scores` it builds one (as `lookup`, whose
PrefixMatch holds a WorkerMatch per worker).
`same_walk` (kvevents only) times one deep lookup again and again, as many times as there are
requests: identical warm work, so its p99 over its p50 is the machine's own jitter in that round.

kvevents only, the router's whole /score answer (issue 26 part 5): `answer` is RouterService's
answer from a request's token list (hash 8,192 tokens + lookup + predictions + loads + rank by cost
+ the matched workers and top_k others as JSON-ready objects), what Dynamo's `full` covers and more;
`answer_routed` the same as routing decisions (each credits the pick with predicted pages, so the
round's later requests find them); `answer_loaded` routed, with a scraped load for every worker
(the cost vectors over the whole fleet); `answer_packed` from the packed ids the HTTP front decodes
(a /score body's token array is read straight into them, never into a list), without predictions:
what /score runs, each page hashed as the walk first reads it (PrefixRouter.match_packed).
`--scale` runs one such run per point of a scale curve (benchmarks/peer_scale.py: each point in a
process of its own, the record-log cold start of the largest point, results.json and one SVG per
figure against the worker count). `--record-log PATH` writes the point's batches as a record log.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_consumers import PAGE, build_docs, pct, shared_batches  # noqa: E402

from kvevents import native  # noqa: E402
from kvevents.consumers.indexer import BlockIndex  # noqa: E402
from kvevents.consumers.loads import WorkerLoad  # noqa: E402
from kvevents.consumers.router import PrefixRouter  # noqa: E402
from kvevents.consumers.service.core import RouterService  # noqa: E402
from kvevents.consumers.service.score_body import ScoreBody, ScoreHead  # noqa: E402
from kvevents.consumers.worker_key import WorkerKey  # noqa: E402
from kvevents.hashing import pack_tokens  # noqa: E402

_U64 = (1 << 64) - 1
PHASES = (
    "lookup",
    "lookup_cpu",
    "lookup_columns",
    "lookup_columns_cpu",
    "lookup_scores_cpu",
    "full",
    "hash",
    "same_walk",
    "answer",
    "answer_routed",
    "answer_loaded",
    "answer_packed",
)

# The peer's side, run by an interpreter that has ai-dynamo-runtime (argv: data dir, cpu). It reads
# one command a line on stdin ("apply", "round", "matches", "quit") and answers one JSON line, so
# the two sides' rounds interleave in time (the machine's load hits both alike).
PEER = r"""
import json, os, sys, time, gc
from array import array
data, cpu = sys.argv[1], int(sys.argv[2])
if cpu >= 0:
    os.sched_setaffinity(0, {cpu})  # before the tree exists: its background thread inherits it
from dynamo.llm import RadixTree, compute_block_hash_for_seq
meta = json.load(open(os.path.join(data, "meta.json")))
pages, page, copies = meta["pages"], meta["page"], meta["copies"]
def u32s(name):
    a = array("I"); a.frombytes(open(os.path.join(data, name), "rb").read()); return a
def i64s(name):
    a = array("q"); a.frombytes(open(os.path.join(data, name), "rb").read()); return a
doc_toks, doc_hashes, req_toks = u32s("docs.u32"), i64s("doc_hashes.i64"), u32s("reqs.u32")
span = pages * page
local = {}
for d in range(meta["docs"]):
    toks = doc_toks[d * span:(d + 1) * span].tolist()
    for h, l in zip(doc_hashes[d * pages:(d + 1) * pages].tolist(), compute_block_hash_for_seq(toks, page)):
        local[h & 0xFFFFFFFFFFFFFFFF] = l
events = []
for i, (wid, parent, hs) in enumerate(json.load(open(os.path.join(data, "batches.json")))):
    hs = [h & 0xFFFFFFFFFFFFFFFF for h in hs]
    ev = {"event_id": i, "data": {"stored": {"parent_hash": None if parent is None else parent & 0xFFFFFFFFFFFFFFFF,
          "blocks": [{"block_hash": h, "tokens_hash": local.get(h, h)} for h in hs]}}}
    events.append((wid, json.dumps(ev).encode()))
nreq = len(req_toks) // span
reqs = [req_toks[i * span:(i + 1) * span].tolist() for i in range(nreq)]
hashed = [compute_block_hash_for_seq(t, page) for t in reqs]
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
tree = None
pc, cpu = time.perf_counter, time.process_time  # process time: every thread of the tree's, never another process
print(json.dumps("ready"), flush=True)  # loaded: from here on it only works when asked
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "apply":
        tree = None
        gc.collect()
        before = rss()
        tree = RadixTree()
        t0, c0 = pc(), cpu()
        for wid, ev in events:
            tree.apply_event(wid, ev)
        tree.find_matches([1])  # queued behind the applies: they are all done when it returns
        out = {"apply_copies_per_s": copies / (pc() - t0), "apply_copies_per_cpu_s": copies / (cpu() - c0),
               "rss_bytes_per_copy": (rss() - before) / copies}
        for t in reqs[:20]:
            tree.find_matches(compute_block_hash_for_seq(t, page))
    elif cmd == "round":
        look, full, hsh, lcpu = [], [], [], []
        for hs in hashed:
            t0 = pc(); tree.find_matches(hs); look.append(pc() - t0)
        for hs in hashed:
            c0 = cpu(); tree.find_matches(hs); lcpu.append(cpu() - c0)
        scpu = []  # with its per-worker dict: OverlapScores builds `.scores` when it is read
        for hs in hashed:
            c0 = cpu(); tree.find_matches(hs).scores; scpu.append(cpu() - c0)
        for t in reqs:
            t0 = pc(); hs = compute_block_hash_for_seq(t, page); t1 = pc(); tree.find_matches(hs); t2 = pc()
            full.append(t2 - t0); hsh.append(t1 - t0)
        out = {"lookup": look, "full": full, "hash": hsh, "lookup_cpu": lcpu, "lookup_scores_cpu": scpu}
    elif cmd == "matches":
        out = [{str(w): n for (w, _), n in tree.find_matches(hs).scores.items()} for hs in hashed[:100]]
    else:
        break
    print(json.dumps(out), flush=True)
"""


def make_requests(docs, pages: int, n: int, rnd: random.Random) -> list[list[int]]:
    """`n` requests of `pages` pages: a document's tokens, a quarter diverging at a random page."""
    reqs = []
    for i in range(n):
        toks = list(docs[rnd.randrange(len(docs))][0][: pages * PAGE])
        if i % 4 == 3:
            cut = rnd.randrange(1, pages) * PAGE
            toks[cut:] = [rnd.randrange(50_000) for _ in range(len(toks) - cut)]
        reqs.append(toks)
    return reqs


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _quantiles(samples: list[float]) -> tuple[float, float]:
    return pct(samples, 0.5) * 1e6, pct(samples, 0.99) * 1e6


class _NoFeed:
    """The router service's event feed in this benchmark: nothing (the index is filled directly)."""

    def start(self):
        return self

    def stop(self) -> None:
        pass

    def poll(self, timeout_s: float = 0.0) -> list:
        return []

    def status(self) -> dict:
        return {}

    def counters(self) -> dict:
        return {}


class Ours:
    """kvevents' side: an index built by applying the batches, timed per round like the peer."""

    def __init__(self, batches, copies: int, reqs, workers: int) -> None:
        self.batches, self.copies, self.reqs, self.workers = batches, copies, reqs, workers
        self.idx: BlockIndex | None = None

    def apply(self) -> dict:
        """A fresh index from every batch (decoded already): copies/s and RSS growth per copy."""
        self.idx = None
        self.svc = None
        gc.collect()
        before = _rss()
        svc = RouterService(feed=_NoFeed(), page_size=PAGE, seed=0)  # its index is a BlockIndex like any
        idx = svc.index
        apply = idx.apply
        gc.disable()
        t0, c0 = time.perf_counter(), time.process_time()
        for src, b in self.batches:
            apply(src, b)
        rate = self.copies / (time.perf_counter() - t0)
        cpu_rate = self.copies / (time.process_time() - c0)
        gc.enable()
        self.idx = idx
        self.svc = svc
        self.router = PrefixRouter(idx, PAGE, seed=0)
        self.hashed = [self.router.hash_array(t) for t in self.reqs]
        for hs in self.hashed[:20]:
            idx.prefix_match(hs)
        return {
            "apply_copies_per_s": rate,
            "apply_copies_per_cpu_s": cpu_rate,
            "rss_bytes_per_copy": (_rss() - before) / self.copies,
        }

    def memory(self) -> dict:
        """Bytes the index keeps per copy, as tracemalloc sees them (numpy arrays included)."""
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        idx = BlockIndex()
        for src, b in self.batches:
            idx.apply(src, b)
        gc.collect()
        stats = idx.stats()
        # + the table arrays in their own huge-page mappings, which tracemalloc does not see
        traced = (tracemalloc.get_traced_memory()[0] - base + stats["table_paged_bytes"]) / self.copies
        tracemalloc.stop()
        return {"traced_bytes_per_copy": traced, "table_bytes_per_copy": stats["table_bytes"] / self.copies}

    def round(self) -> dict:
        """Lookup with hashes given (every request), then full requests (hash all pages + lookup)."""
        assert self.idx is not None
        lookup, hash_array, pc = self.idx.prefix_match, self.router.hash_array, time.perf_counter
        look, full, hsh = [], [], []
        for hs in self.hashed:
            t0 = pc()
            lookup(hs)
            look.append(pc() - t0)
        noise, deep = (
            [],
            max(self.hashed[:50], key=lambda hs: max((m.pages for m in lookup(hs).workers.values()), default=0)),
        )
        for _ in range(len(self.hashed)):  # one warm walk again and again: the machine's own jitter
            t0 = pc()
            lookup(deep)
            noise.append(pc() - t0)
        for t in self.reqs:
            t0 = pc()
            hs = hash_array(t)
            t1 = pc()
            lookup(hs)
            t2 = pc()
            full.append(t2 - t0)
            hsh.append(t1 - t0)
        lcpu, cpu = [], time.process_time
        for hs in self.hashed:  # the same lookups in process time (a descheduled process is not charged)
            c0 = cpu()
            lookup(hs)
            lcpu.append(cpu() - c0)
        columns, ccols, ccpu = self.router.match_columns, [], []
        for hs in self.hashed:  # the lookup /score runs: the same walk, its result as columns
            t0 = pc()
            columns(hs)
            ccols.append(pc() - t0)
        for hs in self.hashed:
            c0 = cpu()
            columns(hs)
            ccpu.append(cpu() - c0)
        out = {"lookup": look, "full": full, "hash": hsh, "same_walk": noise, "lookup_cpu": lcpu}
        out |= {"lookup_columns": ccols, "lookup_columns_cpu": ccpu}
        out.update(self.answers())
        return out

    def answers(self) -> dict:
        """The router's whole answer per request (module docstring), four ways."""
        svc, pc = self.svc, time.perf_counter
        svc.predictions.expire(float("inf"))  # every round starts without predictions
        phases: dict = {}
        for phase, route in (("answer", False), ("answer_routed", True)):
            bodies = [ScoreBody(tokens=t, route=route) for t in self.reqs]
            times = []
            for body in bodies:
                t0 = pc()
                svc.answer_score(body, body.tokens)
                times.append(pc() - t0)
            phases[phase] = times
        packed = [(ScoreHead(tokens=b"", route=False), pack_tokens(t)) for t in self.reqs]
        svc.predictions.expire(float("inf"))  # as `answer`: no predictions (the routed phase made some)
        times = []
        for head, ids in packed:
            t0 = pc()
            svc.answer_score(head, ids)
            times.append(pc() - t0)
        phases["answer_packed"] = times
        at = svc.loads.clock() + 1e9  # fresh for the whole phase
        for w in range(self.workers):
            svc.loads.put(WorkerKey(f"w{w}"), WorkerLoad(float(w % 7), float(w % 11 * 8), w % 3, at, "metrics"))
        bodies = [ScoreBody(tokens=t, route=True) for t in self.reqs]
        times = []
        for body in bodies:
            t0 = pc()
            svc.answer_score(body, body.tokens)
            times.append(pc() - t0)
        phases["answer_loaded"] = times
        return phases

    def matches(self) -> list[dict[str, int]]:
        assert self.idx is not None
        labels = self.idx.labels()
        return [
            {labels[wi][1:]: m.pages for wi, m in self.idx.prefix_match(hs).workers.items()} for hs in self.hashed[:100]
        ]


def write_log(path: str, batches) -> None:
    """The batches as a record log (one live record each, seq per source), for cold starts."""
    from kvevents.events import encode_batch
    from kvevents.recordlog.writer import RecordWriter

    seqs: dict[str, int] = {}
    with RecordWriter(path, durability="buffered") as w:
        for src, b in batches:
            seq = seqs[src] = seqs.get(src, -1) + 1
            w.write(encode_batch(b), source=src, seq=seq, recv_time=0.0)


def find_peer_python(given: str | None) -> str | None:
    """An interpreter that imports dynamo.llm.RadixTree: --peer-python, $KVEVENTS_PEER_PYTHON, or this one."""
    for cand in (given, os.environ.get("KVEVENTS_PEER_PYTHON"), sys.executable):
        if not cand:
            continue
        ok = subprocess.run([cand, "-c", "from dynamo.llm import RadixTree"], capture_output=True, timeout=120)
        if ok.returncode == 0:
            return cand
    return None


class Peer:
    """The peer in a subprocess, driven one command at a time (see PEER)."""

    def __init__(self, python: str, docs, batches, reqs, pages: int, copies: int, cpu: int) -> None:
        self.dir = tempfile.TemporaryDirectory()
        dd = Path(self.dir.name)
        (dd / "meta.json").write_text(json.dumps({"pages": pages, "page": PAGE, "docs": len(docs), "copies": copies}))
        (dd / "docs.u32").write_bytes(b"".join(array("I", t).tobytes() for t, _ in docs))
        (dd / "doc_hashes.i64").write_bytes(b"".join(array("q", h).tobytes() for _, h in docs))
        (dd / "reqs.u32").write_bytes(b"".join(array("I", t).tobytes() for t in reqs))
        rows = [[int(src[1:]), ev.parent_block_hash, list(ev.block_hashes)] for src, b in batches for ev in b.events]
        (dd / "batches.json").write_text(json.dumps(rows))
        self.proc = subprocess.Popen(
            [python, "-c", PEER, self.dir.name, str(cpu)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        # its loading (JSON events, its own hashes) runs on the pinned CPU too: wait until it is done,
        # or it would be timed as part of kvevents' first apply
        assert self.proc.stdout is not None
        if json.loads(self.proc.stdout.readline() or "null") != "ready":
            raise RuntimeError(f"peer failed to start (code {self.proc.wait()})")

    def ask(self, cmd: str):
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"peer exited (code {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        try:
            self.ask("quit")
        except (RuntimeError, BrokenPipeError, ValueError):
            pass
        self.proc.wait(timeout=60)
        self.dir.cleanup()


def summarize(applies: list[dict], rounds: list[dict], extra: dict | None = None) -> dict:
    """Per-round p50/p99 (us) of each phase, the median over rounds, the p99 of all rounds' samples
    pooled, apply rates and memory."""
    rates = [a["apply_copies_per_s"] for a in applies]
    s: dict = {
        "apply_copies_per_s_best": max(rates),
        "apply_copies_per_s_median": statistics.median(rates),
        "apply_copies_per_s": [round(v) for v in rates],
        "apply_copies_per_cpu_s_median": statistics.median(a["apply_copies_per_cpu_s"] for a in applies),
        "rss_bytes_per_copy": applies[0]["rss_bytes_per_copy"],
    }
    for phase in PHASES:
        if phase not in rounds[0]:
            continue
        per = [_quantiles(r[phase]) for r in rounds]
        s[f"{phase}_p50_us"] = [round(p[0], 1) for p in per]
        s[f"{phase}_p99_us"] = [round(p[1], 1) for p in per]
        s[f"{phase}_p50_median_us"] = round(statistics.median(p[0] for p in per), 1)
        s[f"{phase}_p99_median_us"] = round(statistics.median(p[1] for p in per), 1)
        s[f"{phase}_p99_pooled_us"] = round(_quantiles([x for r in rounds for x in r[phase]])[1], 1)
    s.update(extra or {})
    return s


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--copies", type=int, default=1_000_000)
    ap.add_argument("--pages", type=int, default=512)
    ap.add_argument("--docs", type=int, default=400)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=1, help="pin both sides to this CPU (-1: no pinning)")
    ap.add_argument("--peer-python", default=None)
    ap.add_argument("--no-fallback", action="store_true", help="skip the pure-Python measurement")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--record-log", default=None, help="also write the point's batches to this record log")
    ap.add_argument("--scale", action="store_true", help="run the scale curve (benchmarks/peer_scale.py)")
    ap.add_argument("--points", default=None, help="with --scale: WORKERSxCOPIES,... (e.g. 64x1M,1024x10M)")
    ap.add_argument("--out", default=None, help="with --scale: where results.json and the SVGs go")
    return ap.parse_args()


def main() -> None:
    args = _args()
    if args.scale:
        from peer_scale import run_scale

        run_scale(args)
        return
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})
    rnd = random.Random(0)
    docs = build_docs(args.docs, args.pages, rnd)
    batches, copies = shared_batches(docs, args.workers, args.copies, rnd)
    reqs = make_requests(docs, args.pages, args.requests, rnd)
    gc.collect()
    gc.freeze()  # the benchmark's own millions of objects (docs, batches): no GC pass walks them mid-round
    if args.record_log:
        write_log(args.record_log, batches)
    report: dict = {"config": vars(args) | {"copies_held": copies, "speedups": native.describe()}}
    sides: dict = {}
    if native.active():
        sides["kvevents_c"] = (Ours(batches, copies, reqs, args.workers), False)
    if not args.no_fallback or not native.active():
        sides["kvevents_python"] = (Ours(batches, copies, reqs, args.workers), True)
    peer_py = find_peer_python(args.peer_python)
    peer = Peer(peer_py, docs, batches, reqs, args.pages, copies, args.cpu) if peer_py else None
    if peer is None:
        report["dynamo"] = "skipped: no interpreter with ai-dynamo-runtime (--peer-python)"
    try:
        _measure(args.rounds, sides, peer, report)
    finally:
        if peer:
            peer.close()
    if args.json:
        print(json.dumps(report, indent=2))
        return
    _print_report(report, args, copies)


def _measure(rounds_n: int, sides: dict, peer: Peer | None, report: dict) -> None:
    """The sides take turns each round (so the machine's load hits them alike); summaries into `report`."""
    applies: dict[str, list] = {k: [] for k in [*sides, *(["dynamo"] if peer else [])]}
    rounds: dict[str, list] = {k: [] for k in applies}

    def on(name: str, fn):
        side, pure = sides[name]
        if pure:
            with native.python_only():
                return fn(side)
        return fn(side)

    # each side's round right after its own apply: timed after the other side's apply instead (which
    # streams ~1 GB through the caches), a side starts its round with its index evicted, and the
    # side after it does not (its round follows a round, which touches only its index)
    for _ in range(rounds_n):
        for name in sides:
            applies[name].append(on(name, Ours.apply))
            rounds[name].append(on(name, Ours.round))
        if peer:
            applies["dynamo"].append(peer.ask("apply"))
            rounds["dynamo"].append(peer.ask("round"))
    for name in sides:
        report[name] = summarize(
            applies[name], rounds[name], {k: round(v, 1) for k, v in on(name, Ours.memory).items()}
        )
    if peer:
        report["dynamo"] = summarize(applies["dynamo"], rounds["dynamo"])
        ours = next(iter(sides.values()))[0].matches()
        theirs = peer.ask("matches")
        report["identical_matches"] = f"{sum(a == b for a, b in zip(ours, theirs))} of {len(ours)}"


def _print_report(report: dict, args: argparse.Namespace, copies: int) -> None:
    print(
        f"# {copies} copies, {args.workers} workers, {args.pages}-page requests x {args.requests}, "
        f"{args.rounds} rounds, cpu {args.cpu}; {native.describe()}"
    )
    cols = [k for k in ("kvevents_c", "kvevents_python", "dynamo") if k in report and isinstance(report[k], dict)]
    print(f"{'figure':38s}" + "".join(f"{c:>24s}" for c in cols))
    rows = [
        ("apply copies/s (best)", "apply_copies_per_s_best", "{:,.0f}"),
        ("apply copies/s (median)", "apply_copies_per_s_median", "{:,.0f}"),
        ("apply copies per CPU s (median)", "apply_copies_per_cpu_s_median", "{:,.0f}"),
    ]
    for phase in PHASES:
        rows.append((f"{phase} p50 us (rounds)", f"{phase}_p50_us", None))
        rows.append((f"{phase} p99 us (rounds)", f"{phase}_p99_us", None))
    rows += [
        ("RSS growth B/copy", "rss_bytes_per_copy", "{:.1f}"),
        ("traced B/copy", "traced_bytes_per_copy", "{:.1f}"),
        ("table arrays B/copy", "table_bytes_per_copy", "{:.1f}"),
    ]
    for label, key, fmt in rows:
        cells = []
        for c in cols:
            v = report[c].get(key)
            cells.append("-" if v is None else (fmt.format(v) if fmt else "/".join(f"{x:g}" for x in v)))
        print(f"{label:38s}" + "".join(f"{x:>24s}" for x in cells))
    if "identical_matches" in report:
        print(f"identical match results (pages per worker): {report['identical_matches']}")
    if "dynamo" in report and isinstance(report["dynamo"], str):
        print(f"dynamo: {report['dynamo']}")


if __name__ == "__main__":
    main()
