"""Reference radix cache throughput with events on, over a seeded multi-tenant sim workload.

Each request is served like an engine step would: match_prefix, then insert (which evicts first
when the device is at capacity); events are taken every `--step` requests. At the end the tree is
drained with evict() calls. Memory per cached page is measured separately with tracemalloc.

    python benchmarks/bench_cache.py                 # 100k requests
    python benchmarks/bench_cache.py --requests 20000
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
import tracemalloc
from itertools import islice

from kvevents.cache import RadixCache
from kvevents.sim.worker import Workload


def throughput(args: argparse.Namespace) -> list[tuple[str, int, float, str]]:
    cache = RadixCache(args.page_size, capacity_pages=args.capacity)
    cache.take_events()
    clock = time.perf_counter
    t_match = t_insert = t_take = 0.0
    n_events = 0
    tokens_in = hit_tokens = 0
    n = 0
    evicted_before = 0
    for req in islice(Workload(args.seed, page_size=args.page_size), args.requests):
        toks, ns = req.tokens, req.namespace
        t0 = clock()
        m = cache.match_prefix(toks, ns)
        t1 = clock()
        cache.insert(toks, ns, lora_name=req.lora_name, session_id=req.session_id)
        t2 = clock()
        t_match += t1 - t0
        t_insert += t2 - t1
        tokens_in += len(toks)
        hit_tokens += m.num_tokens
        n += 1
        if n % args.step == 0:
            t3 = clock()
            evs = cache.take_events()
            t_take += clock() - t3
            n_events += len(evs)
            evicted_before += sum(len(e.block_hashes) for e in evs if type(e).__name__ == "BlockRemoved")
            del evs  # freed outside the timed region
    evs = cache.take_events()
    n_events += len(evs)
    evicted_before += sum(len(e.block_hashes) for e in evs if type(e).__name__ == "BlockRemoved")
    live_pages, live_nodes = cache.num_pages, cache.num_nodes
    # drain: evict a step's worth of pages per call until the tree is empty
    calls = freed = 0
    t0 = clock()
    while cache.num_pages:
        freed += cache.evict(args.evict_chunk)
        cache.take_events()
        calls += 1
    t_evict = clock() - t0
    rows = [
        ("match_prefix", n, t_match, f"device hit {hit_tokens / max(tokens_in, 1):.1%} of {tokens_in} tokens"),
        ("insert (+capacity evictions)", n, t_insert, f"{evicted_before} pages evicted by capacity"),
        ("take_events", max(n // args.step, 1), t_take, f"{n_events} coalesced events"),
        (f"evict({args.evict_chunk}) drain", calls, t_evict, f"{freed} pages from {live_nodes} nodes"),
        ("  evicted pages", freed, t_evict, f"{live_pages} live pages before the drain"),
    ]
    return rows


def memory_per_page(args: argparse.Namespace) -> tuple[int, int, float]:
    reqs = list(islice(Workload(args.seed + 1, page_size=args.page_size), args.memory_requests))
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    cache = RadixCache(args.page_size)
    for r in reqs:
        cache.insert(r.tokens, r.namespace)
        cache.take_events()
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return cache.num_pages, cache.num_nodes, used / max(cache.num_pages, 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--capacity", type=int, default=65_536, help="device capacity in pages")
    p.add_argument("--step", type=int, default=32, help="requests per take_events() (an engine step)")
    p.add_argument("--evict-chunk", type=int, default=64)
    p.add_argument("--memory-requests", type=int, default=5_000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    print(
        f"# bench_cache: {args.requests} requests, page_size {args.page_size}, capacity {args.capacity} pages, "
        f"Python {platform.python_version()} on {platform.machine()}"
    )
    rows = throughput(args)
    print(f"{'operation':<30} {'count':>9} {'seconds':>9} {'ops/s':>11} {'us/op':>8}  notes")
    for name, count, secs, note in rows:
        rate = count / secs if secs > 0 else float("inf")
        print(f"{name:<30} {count:>9} {secs:>9.3f} {rate:>11,.0f} {1e6 * secs / max(count, 1):>8.2f}  {note}")
    pages, nodes, per_page = memory_per_page(args)
    print(
        f"{'memory per cached page':<30} {pages:>9} {'':>9} {per_page:>11,.0f} {'B':>8}  "
        f"tracemalloc, {nodes} nodes, {args.memory_requests} requests, page_size {args.page_size}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
