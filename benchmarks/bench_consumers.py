"""Benchmark the reference consumers: BlockIndex apply rate and memory, PrefixRouter score latency.

    python3 benchmarks/bench_consumers.py [--workers 64] [--copies 1000000] [--pages 512] [--json]

Index contents (the "shared" profile): documents of `pages` pages with real event hashes, each
cached by 1..16 random workers up to a random prefix length (shared prompts), plus 25% private
chains, until `copies` block copies are indexed. The "unshared" profile (every copy a distinct
hash on one worker) is the memory worst case, and worst of all right after the index dicts
grow (measured too, at the last such point below `copies`). Memory is what tracemalloc sees retained (plus the index's table arrays in huge-page mappings) after
decoding each payload and applying it (the batch freed), so the index's int keys are counted.
Score phases, as `score()` runs them: hashing (`router.prefix_hashes`: the pages in chunks of 32,
64, 128, ..., stopping after a chunk whose last page nobody holds, which takes one one-key index
probe per chunk, timed alone as `held_probe`), index lookup cold (first walk of that request) and
warm (the same walk again), ranking, and the whole public `score()` call. Beside them: hashing all
pages (`hash_array`) and the old hex path (event_hashes + to_int64). Wall-clock and thread-CPU p99
are both given because p99 wall on a shared machine mostly measures neighbours. The index lookup
part is `BlockIndex.prefix_match` (table probes, mask gathers, prefix lengths and scores) over the hashes
score hashed, in one vectorised pass. Ceiling beside it: the bare table probe `HashTable.find` of
those hashes, cold on alternate requests, where it runs before the walk (the walk's cold figure
comes from the other half). Machine noise beside them: `fixed` times one and the same warm
512-page walk once per request, so its p99/p50 is what interruptions alone add at that duration.
`lookup_b2b`: the same walks again afterwards, back to back with no hashing between them, as a
caller of `score_hashes` (hashes known already) runs them: each request's entries cold, the code warm.

Tokens mode (kvevents.consumers.keying, any engine): the same shared profile published as a vLLM 0.33 worker
publishes it (vLLM's sha256 chain as uint64 engine hashes, token_ids, group_idx; private chains
with random engine hashes), keyed by a SourceKeyer into a BlockIndex: `SourceKeyer.apply` from
the raw payload (vLLM decode + keys from token_ids + engine-hash map + index apply) in copies/s,
bytes per copy retained by index and maps together, and score() p99 on a mixed fleet (half of
the workers contract sources, half tokens-mode vLLM sources, one index).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
import tracemalloc
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvevents.consumers.indexer import BlockIndex  # noqa: E402
from kvevents.consumers.keying import SourceKeyer  # noqa: E402
from kvevents.consumers.router import PrefixRouter  # noqa: E402
from kvevents.consumers.table import rebuild_buckets  # noqa: E402
from kvevents.engines.vllm import vllm_event_hashes  # noqa: E402
from kvevents.engines.vllm_wire import encode_vllm_batch, stored_event  # noqa: E402
from kvevents.events import BlockRemoved, BlockStored, KVEventBatch, decode_batch, encode_batch  # noqa: E402
from kvevents.hashing import Namespace, event_hashes, event_hashes_int64, to_int64  # noqa: E402

PAGE = 16


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def build_docs(n_docs: int, pages: int, rnd: random.Random) -> list[tuple[list[int], list[int]]]:
    """(tokens, int64 event hashes) of `n_docs` documents of `pages` pages."""
    docs = []
    for _ in range(n_docs):
        toks = [rnd.randrange(50_000) for _ in range(pages * PAGE)]
        hs = event_hashes_int64(toks, PAGE, Namespace())
        docs.append((toks, hs))
    return docs


def shared_batches(docs, workers: int, copies: int, rnd: random.Random, event_pages: int = 16):
    """Batches (source, KVEventBatch) storing doc prefixes on random workers until `copies`."""
    out = []
    total = 0
    private = 0
    while total < copies:
        if rnd.random() < 0.25:  # a private chain (a session's own turns): random hashes
            n = min(rnd.randint(8, 128), copies - total)
            hs = [rnd.getrandbits(64) - 2**63 for _ in range(n)]
            src = f"w{rnd.randrange(workers)}"
            parent = None
            for i in range(0, n, event_pages):
                part = hs[i : i + event_pages]
                out.append((src, KVEventBatch(0.0, [BlockStored(part, parent, [], PAGE, None, "GPU", None)], 0)))
                parent = part[-1]
            total += n
            private += n
            continue
        _, hs = docs[rnd.randrange(len(docs))]
        k = rnd.randint(1, 16)
        for src in rnd.sample(range(workers), k):
            n = min(rnd.randint(1, len(hs)), copies - total)
            if n <= 0:
                break
            parent = None
            for i in range(0, n, event_pages):
                part = hs[i : min(n, i + event_pages)]
                out.append((f"w{src}", KVEventBatch(0.0, [BlockStored(part, parent, [], PAGE, None, "GPU", None)], 0)))
                parent = part[-1]
            total += n
    return out, total


def measure_build(batches) -> tuple[BlockIndex, float, int, float]:
    """Encode every batch, then decode + apply each into a fresh index under tracemalloc.

    Decoding inside the traced region gives the index fresh int objects (as a subscriber does),
    and each batch is freed after apply: the bytes left are what the index retains.
    Returns (index, bytes retained, copies held, decode+apply seconds).
    """
    payloads = [(src, encode_batch(b)) for src, b in batches]
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    idx = BlockIndex()
    t0 = time.perf_counter()
    for src, payload in payloads:
        idx.apply(src, decode_batch(payload))
    elapsed = time.perf_counter() - t0
    gc.collect()
    # + the table arrays in their own huge-page mappings (consumers/table.py), unseen by tracemalloc
    used = tracemalloc.get_traced_memory()[0] - base + idx.stats()["table_paged_bytes"]
    tracemalloc.stop()
    return idx, used, len(idx), elapsed


def bench_apply(batches, repeat: int = 3) -> dict[str, float]:
    """Best-of-`repeat` wall time to apply all batches (stores) then remove every copy again."""
    removes = []
    for src, b in batches:
        for ev in b.events:
            removes.append((src, KVEventBatch(0.0, [BlockRemoved(ev.block_hashes, "GPU")], 0)))
    n_copies = sum(len(ev.block_hashes) for _, b in batches for ev in b.events)
    best_store = best_remove = float("inf")
    for _ in range(repeat):
        idx = BlockIndex()
        apply = idx.apply
        gc.disable()
        t0 = time.perf_counter()
        for src, b in batches:
            apply(src, b)
        t1 = time.perf_counter()
        for src, b in removes:
            apply(src, b)
        t2 = time.perf_counter()
        gc.enable()
        assert len(idx) == 0, len(idx)
        best_store = min(best_store, t1 - t0)
        best_remove = min(best_remove, t2 - t1)
    return {
        "batches": len(batches),
        "copies": n_copies,
        "store_batches_per_s": len(batches) / best_store,
        "store_copies_per_s": n_copies / best_store,
        "remove_batches_per_s": len(removes) / best_remove,
        "remove_copies_per_s": n_copies / best_remove,
    }


def bench_score(idx: BlockIndex, docs, pages: int, n: int, rnd: random.Random) -> dict[str, float]:
    """Latency of hashing, index lookup and the whole score for `pages`-page requests."""
    router = PrefixRouter(idx, PAGE, seed=0)
    reqs = []
    for i in range(n):
        toks, _ = docs[rnd.randrange(len(docs))]
        toks = list(toks[: pages * PAGE])
        if i % 4 == 3:  # a quarter diverge somewhere (a new user turn on a shared prompt)
            cut = rnd.randrange(1, pages) * PAGE
            toks[cut:] = [rnd.randrange(50_000) for _ in range(len(toks) - cut)]
        reqs.append(toks)
    phases = (
        "hash", "hash_all", "hash_hex_path", "held_probe", "lookup", "lookup_warm", "find", "find_warm", "rank", "score",
        "fixed", "lookup_b2b",
    )  # fmt: skip
    wall: dict[str, list[float]] = {k: [] for k in phases}
    cpu: dict[str, list[float]] = {k: [] for k in phases}
    matched = []
    for toks in reqs[:20]:  # warm up
        router.score(toks)
    table = idx._views[0]  # the one lora view of this profile
    prnd = random.Random(1)  # probe keys (rnd stays as it was for what follows)
    hashed = []

    def timed(phase, fn, *args):
        w0, c0 = time.perf_counter(), time.thread_time()
        out = fn(*args)
        wall[phase].append(time.perf_counter() - w0)
        cpu[phase].append(time.thread_time() - c0)
        return out

    def walk(hs):
        return idx.prefix_match(hs, None, strict=router.lora_strict, medium_weight=router._weight)

    fixed = router.hash_array(reqs[0])  # the noise probe: one request's every page, walked warm
    for i, toks in enumerate(reqs):
        timed("fixed", walk, fixed)
        if i % 2:  # one key's probe, cold: what prefix_hashes asks after each chunk
            timed("held_probe", idx.holds, int(docs[prnd.randrange(len(docs))][1][prnd.randrange(pages)]))
        hs = timed("hash", router.prefix_hashes, toks)  # what score hashes: the int64 array the walk takes
        hashed.append(hs)
        if i % 4 == 2:
            timed("hash_all", router.hash_array, toks)  # every page
        if i % 2 == 0:  # even requests: the walk sees the request's index entries cold
            walked = timed("lookup", walk, hs)
            timed("lookup_warm", walk, hs)  # same pages, in CPU cache
            timed("find_warm", table.find, hs)
        else:  # odd requests: the bare probe sees them cold (the ceiling)
            timed("find", table.find, hs)
            walked = walk(hs)
        ranked = timed("rank", router._rank, walked, None)  # WorkerScore for all workers, sorted
        timed("score", router.score, toks)  # the public call: lazy hashing + lookup + rank
        matched.append(ranked[0].matched_pages)
        if i % 4 == 0:  # the former hex path, for comparison
            timed("hash_hex_path", lambda: [to_int64(h) for h in event_hashes(toks, PAGE, Namespace())])
    for hs in hashed:
        timed("lookup_b2b", walk, hs)
    us = 1e6
    out: dict[str, float] = {"requests": n, "pages_per_request": pages}
    for k in phases:
        out[f"{k}_p50_us"] = pct(wall[k], 0.5) * us
        out[f"{k}_p99_us"] = pct(wall[k], 0.99) * us
        out[f"{k}_cpu_p99_us"] = pct(cpu[k], 0.99) * us
    out["score_max_us"] = max(wall["score"]) * us
    out["best_match_pages_mean"] = statistics.fmean(matched)
    out["pages_hashed_mean"] = statistics.fmean(map(len, hashed))
    return out


def vllm_payloads(docs, workers: int, copies: int, rnd: random.Random, event_pages: int = 16, first: int = 0):
    """The shared profile as vLLM workers w{first}.. publish it: (source, payload) per stored event."""
    engine = {}  # doc index -> vLLM's engine hashes of its pages (the same on every worker)
    out, total = [], 0
    while total < copies:
        if rnd.random() < 0.25:  # a private chain: its own tokens, random engine ids
            n = min(rnd.randint(8, 128), copies - total)
            hs = [rnd.getrandbits(64) for _ in range(n)]
            toks = list(array("I", rnd.randbytes(4 * PAGE * n)))
            src, parent = f"w{first + rnd.randrange(workers)}", None
            for i in range(0, n, event_pages):
                part = hs[i : i + event_pages]
                ev = stored_event(part, parent, toks[i * PAGE : (i + len(part)) * PAGE], PAGE, group_idx=0)
                out.append((src, encode_vllm_batch(0.0, [ev], 0)))
                parent = part[-1]
            total += n
            continue
        d = rnd.randrange(len(docs))
        toks = docs[d][0]
        if d not in engine:
            engine[d] = vllm_event_hashes(toks, PAGE)
        hs = engine[d]
        for w in rnd.sample(range(workers), min(workers, rnd.randint(1, 16))):
            n = min(rnd.randint(1, len(hs)), copies - total)
            if n <= 0:
                break
            parent = None
            for i in range(0, n, event_pages):
                hi = min(n, i + event_pages)
                ev = stored_event(hs[i:hi], parent, toks[i * PAGE : hi * PAGE], PAGE, group_idx=0)
                out.append((f"w{first + w}", encode_vllm_batch(0.0, [ev], 0)))
                parent = hs[hi - 1]
            total += n
    return out, total


def bench_tokens_mode(
    docs, workers: int, copies: int, pages: int, requests: int, rnd: random.Random
) -> dict[str, float]:
    """Tokens-mode apply rate, bytes per copy (index + maps), and score on a mixed fleet."""
    payloads, _ = vllm_payloads(docs, workers, copies, rnd)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    idx, keyer = BlockIndex(), SourceKeyer(PAGE, default_mode="tokens")
    for src, payload in payloads:
        keyer.apply(idx, src, None, payload)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base + idx.stats()["table_paged_bytes"]
    tracemalloc.stop()
    held = len(idx)
    out: dict[str, float] = {
        "copies": held,
        "mapped_blocks": keyer.mapped_blocks(),
        "interned_digests": keyer.interned_digests(),
        "bytes_per_copy_incl_map": used / max(1, held),
    }
    del idx, keyer
    sub = payloads[: min(len(payloads), 60_000)]
    best = float("inf")
    for _ in range(3):
        idx, keyer = BlockIndex(), SourceKeyer(PAGE, default_mode="tokens")
        gc.collect()
        gc.disable()
        t0 = time.perf_counter()
        for src, payload in sub:
            keyer.apply(idx, src, None, payload)
        best = min(best, time.perf_counter() - t0)
        gc.enable()
    out["apply_copies_per_s"] = len(idx) / best
    out["apply_batches_per_s"] = len(sub) / best
    del payloads, sub, idx, keyer
    half = workers // 2  # the mixed fleet: w0.. contract sources, w{half}.. vLLM sources in tokens mode
    mixed = BlockIndex()
    batches, _ = shared_batches(docs, half, copies // 2, rnd)
    for src, b in batches:
        mixed.apply(src, b)
    keyer = SourceKeyer(PAGE, modes={f"w{i}": "contract" for i in range(half)})
    for src, payload in vllm_payloads(docs, workers - half, copies // 2, rnd, first=half)[0]:
        keyer.apply(mixed, src, None, payload)
    out["mixed_tokens_sources"] = sum(1 for r in keyer.stats().values() if r["mode"] == "tokens")
    gc.collect()
    gc.freeze()
    sc = bench_score(mixed, docs, pages, requests, rnd)
    gc.unfreeze()
    out.update(
        {f"mixed_{k}": sc[k] for k in ("score_p50_us", "score_p99_us", "score_cpu_p99_us", "best_match_pages_mean")}
    )
    return out


def unshared_bytes(copies: int, workers: int, rnd: random.Random) -> dict[str, float]:
    """Bytes per copy when every copy is a distinct hash (16-hash events, parent None)."""
    uniq = [
        (
            f"w{i % workers}",
            KVEventBatch(
                0.0,
                [BlockStored([rnd.getrandbits(64) - 2**63 for _ in range(16)], None, [], PAGE, None, "GPU", None)],
                0,
            ),
        )
        for i in range(copies // 16)
    ]
    _, used, held, _ = measure_build(uniq)
    return {"copies": held, "bytes_per_copy": used / max(1, held)}


def worst_fill(copies: int, per_event: int = 16) -> int:
    """Largest copy count <= `copies` right after the index table has grown (16-hash events).

    The table grows past MAX_LOAD of its slots to a size that leaves it REBUILD_LOAD full at
    most; bytes per copy peak right after such a growth.
    """
    cap, live, best = 8 * 8, 0, 0
    while live + per_event <= copies:
        grown = rebuild_buckets(cap, live, live, per_event)
        if grown:
            cap, best = grown * 8, live + per_event
        live += per_event
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--copies", type=int, default=1_000_000)
    ap.add_argument("--pages", type=int, default=512)
    ap.add_argument("--docs", type=int, default=400)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rnd = random.Random(args.seed)

    t0 = time.perf_counter()
    docs = build_docs(args.docs, args.pages, rnd)
    batches, copies = shared_batches(docs, args.workers, args.copies, rnd)
    setup_s = time.perf_counter() - t0

    idx, used, held, _ = measure_build(batches)
    shared_mem = {
        "copies": held,
        "entries": idx.distinct_hashes,
        "copies_per_entry": held / max(1, idx.distinct_hashes),
        "bytes_per_copy": used / max(1, held),
    }
    apply_sub = batches[: min(len(batches), 60_000)]
    apply = bench_apply(apply_sub)
    payloads = [(src, encode_batch(b)) for src, b in apply_sub]
    t0 = time.perf_counter()
    fresh = BlockIndex()
    for src, payload in payloads:
        fresh.apply(src, decode_batch(payload))
    dt = time.perf_counter() - t0
    apply["decode_and_apply_copies_per_s"] = len(fresh) / dt
    del fresh, payloads
    del batches, apply_sub
    gc.collect()
    gc.freeze()  # a long-lived index: keep full collections from walking it during timing
    score = bench_score(idx, docs, args.pages, args.requests, rnd)
    gc.unfreeze()
    t0 = time.perf_counter()
    dropped = idx.drop_source("w0")  # a restart or resync: scans the index once
    apply["drop_source_ms"] = (time.perf_counter() - t0) * 1e3
    apply["drop_source_copies"] = dropped

    unshared_mem = unshared_bytes(args.copies, args.workers, rnd)
    worst_n = worst_fill(args.copies)
    if worst_n:
        unshared_mem.update({f"worst_fill_{k}": v for k, v in unshared_bytes(worst_n, args.workers, rnd).items()})

    tokens = bench_tokens_mode(docs, args.workers, args.copies, args.pages, args.requests, rnd)
    result = {
        "python": sys.version.split()[0],
        "workers": args.workers,
        "setup_s": round(setup_s, 2),
        "apply": {k: round(v, 1) for k, v in apply.items()},
        "memory_shared": {k: round(v, 2) for k, v in shared_mem.items()},
        "memory_unshared": {k: round(v, 2) for k, v in unshared_mem.items()},
        "score": {k: round(v, 1) for k, v in score.items()},
        "tokens_mode": {k: round(v, 1) for k, v in tokens.items()},
    }
    sc = score
    targets = [
        (
            "apply >= 200k copies/s",
            apply["store_copies_per_s"] >= 200_000,
            f"{apply['store_copies_per_s'] / 1e3:,.0f}k copies/s (decode+apply {apply['decode_and_apply_copies_per_s'] / 1e3:,.0f}k)",
        ),
        (
            "lookup p99 < 100 us (wall, cold)",
            sc["lookup_p99_us"] < 100,
            f"cold {sc['lookup_p99_us']:.1f} us (cpu {sc['lookup_cpu_p99_us']:.1f}), warm {sc['lookup_warm_p99_us']:.1f} us,"
            f" back to back (score_hashes) {sc['lookup_b2b_p99_us']:.1f} us;"
            f" ceiling: bare table probe cold {sc['find_p99_us']:.1f} us, warm {sc['find_warm_p99_us']:.1f} us;"
            f" one-key probe while hashing p99 {sc['held_probe_p99_us']:.1f} us;"
            f" noise: one fixed warm walk p50 {sc['fixed_p50_us']:.1f} / p99 {sc['fixed_p99_us']:.1f} us",
        ),
        (
            "score p99 < 1 ms (wall)",
            sc["score_p99_us"] < 1000,
            f"{sc['score_p99_us']:.1f} us (cpu {sc['score_cpu_p99_us']:.1f}, p50 {sc['score_p50_us']:.1f});"
            f" hashing p99 {sc['hash_p99_us']:.1f} us (all pages {sc['hash_all_p99_us']:.1f}, hex path"
            f" {sc['hash_hex_path_p99_us']:.1f}), rank p99 {sc['rank_p99_us']:.1f} us",
        ),
        (
            "< 120 bytes/copy (shared profile)",
            shared_mem["bytes_per_copy"] < 120,
            f"{shared_mem['bytes_per_copy']:.1f} B",
        ),
        (
            "< 120 bytes/copy (unshared, at --copies)",
            unshared_mem["bytes_per_copy"] < 120,
            f"{unshared_mem['bytes_per_copy']:.1f} B",
        ),
        (
            "< 120 bytes/copy (unshared, worst fill)",
            unshared_mem.get("worst_fill_bytes_per_copy", 0) < 120,
            f"{unshared_mem.get('worst_fill_bytes_per_copy', 0):.1f} B at {unshared_mem.get('worst_fill_copies', 0):,.0f} copies"
            " (just after the table grew)",
        ),
        (
            "tokens mode: apply >= 300k copies/s",
            tokens["apply_copies_per_s"] >= 300_000,
            f"{tokens['apply_copies_per_s'] / 1e3:,.0f}k copies/s (vLLM decode + keys from token_ids + map + index)",
        ),
        (
            "tokens mode: < 120 bytes/copy incl. map",
            tokens["bytes_per_copy_incl_map"] < 120,
            f"{tokens['bytes_per_copy_incl_map']:.1f} B ({tokens['copies']:,.0f} copies, {tokens['mapped_blocks']:,.0f} mapped,"
            f" {tokens['interned_digests']:,.0f} digests)",
        ),
        (
            f"mixed fleet of {args.workers}: score p99 < 1 ms",
            tokens["mixed_score_p99_us"] < 1000,
            f"{tokens['mixed_score_p99_us']:.1f} us (cpu {tokens['mixed_score_cpu_p99_us']:.1f}, p50 {tokens['mixed_score_p50_us']:.1f};"
            f" {tokens['mixed_tokens_sources']:.0f} tokens-mode sources)",
        ),
    ]
    result["targets"] = {name: ok for name, ok, _ in targets}
    if args.json:
        print(json.dumps(result))
    else:
        for section, vals in result.items():
            if section != "targets":
                print(f"{section}: {vals}")
        print("targets:")
        for name, ok, figure in targets:
            print(f"  [{'ok' if ok else 'MISS'}] {name:40s} {figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
