"""`kvevents route --proxy` under a skewed workload, one routing policy after another in one run (issue 26).

    python3 benchmarks/bench_proxy.py                              # every policy this route offers
    python3 benchmarks/bench_proxy.py --policy prefix,cost --requests 600 --rate 80
    python3 benchmarks/bench_proxy.py --serve-arg=--some-serve-flag --serve-arg=VALUE

For each policy a fresh fleet: `kvevents serve --workers 4 --http` (every simulated worker its own
/v1/completions, page size 16) and `kvevents route --proxy` over it (kvevents.testing.fleet), all
in subprocesses on 127.0.0.1. The same seeded requests arrive at the same open-loop (Poisson) times:
`--hot-share` of them start with one hot prefix (`--hot-pages` pages, then a unique tail), the rest
with one of `--cold-prefixes` cold prefixes of the same length (each seen a few times), then a
unique tail. `--warmup` unmeasured requests of unique tokens go first, one at a time. Each is a streamed completion (`stream: true`,
usage included); time to first token is send to the first event. Prefix hit rate is what the
workers themselves report: cached prompt tokens / prompt tokens. Policies: `prefix` is the ranking
by cached prefix (a route without `--policy`); `direct` sends the requests round-robin straight to
the workers (no router: the floor of the proxy's cost, and the hit rate of cache-blind routing); any
other name is passed as `route --policy NAME`, and is skipped, with a line saying why, when this
route has no `--policy` option.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from kvevents.testing.fleet import CMD, Fleet

PAGE = 16
VOCAB = 50_000


def workload(args: argparse.Namespace) -> list[tuple[float, list[int], bool]]:
    """(arrival offset in s, prompt tokens, hot?) for every request; the same for every policy."""
    rng = random.Random(args.seed)
    hot = [rng.randrange(VOCAB) for _ in range(args.hot_pages * PAGE)]
    cold = [[rng.randrange(VOCAB) for _ in range(args.hot_pages * PAGE)] for _ in range(args.cold_prefixes)]
    out, t = [], 0.0
    for _ in range(args.requests):
        t += rng.expovariate(args.rate)
        is_hot = rng.random() < args.hot_share
        tail = [rng.randrange(VOCAB) for _ in range(args.tail_pages * PAGE)]
        out.append((t, (hot if is_hot else rng.choice(cold)) + tail, is_hot))
    return out


async def one(client: httpx.AsyncClient, base: str, tokens: list[int], max_tokens: int) -> dict[str, Any]:
    body = {"model": "kvevents-sim", "prompt": tokens, "max_tokens": max_tokens, "stream": True}
    body["stream_options"] = {"include_usage": True}
    t0 = time.perf_counter()
    ttft, usage, worker = None, None, None
    try:
        async with client.stream("POST", base + "/v1/completions", json=body) as r:
            worker = r.headers.get("x-kvevents-worker")
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if ttft is None:
                    ttft = time.perf_counter() - t0
                data = line[len("data: ") :]
                if data != "[DONE]":
                    usage = json.loads(data).get("usage") or usage
            ok = r.status_code == 200
    except httpx.HTTPError:
        ok = False
    return {"ok": ok and ttft is not None, "ttft": ttft, "usage": usage, "worker": worker}


async def drive(
    bases: list[str], reqs: list[tuple[float, list[int], bool]], max_tokens: int, warmup: int = 0
) -> list[dict[str, Any]]:
    """The requests at their arrival times; first `warmup` unmeasured ones of unique tokens, one at a
    time (connections opened, the proxy's first /v1/models asked, code paths warm)."""
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    rng = random.Random(-1)
    async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as client:
        for i in range(warmup):
            await one(client, bases[i % len(bases)], [rng.randrange(VOCAB) for _ in range(4 * PAGE)], max_tokens)
        start = time.perf_counter()
        tasks = []
        for i, (at, tokens, _) in enumerate(reqs):
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client, bases[i % len(bases)], tokens, max_tokens)))
        return list(await asyncio.gather(*tasks))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run_policy(policy: str, args: argparse.Namespace, reqs: list) -> dict[str, Any]:
    route_args = ["--seed", str(args.seed)] + ([] if policy in ("prefix", "direct") else ["--policy", policy])
    with Fleet(args.workers, serve_args=args.serve_arg, route_args=route_args) as fleet:
        bases = [w.url for w in fleet.workers] if policy == "direct" else [fleet.base]
        results = asyncio.run(drive(bases, reqs, args.max_tokens, args.warmup))
        status = httpx.get(fleet.base + "/status.json", timeout=10).json()
        names = [w.name for w in fleet.workers]
    if policy == "direct":  # no proxy header: request i went to worker i mod n
        for i, r in enumerate(results):
            r["worker"] = names[i % len(names)]
    done = [r for r in results if r["ok"]]
    prompt = sum(r["usage"]["prompt_tokens"] for r in done if r["usage"])
    cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in done if r["usage"])
    per_worker: dict[str, int] = {}
    for r in done:
        per_worker[r["worker"]] = per_worker.get(r["worker"], 0) + 1
    ttfts = [r["ttft"] for r in done]
    hot_ttfts = [r["ttft"] for r, q in zip(results, reqs) if r["ok"] and q[2]]
    return {
        "policy": policy,
        "requests": len(results),
        "errors": len(results) - len(done),
        "ttft_p50_ms": round(1e3 * pct(ttfts, 0.50), 2),
        "ttft_p99_ms": round(1e3 * pct(ttfts, 0.99), 2),
        "hot_ttft_p99_ms": round(1e3 * pct(hot_ttfts, 0.99), 2),
        "hit_rate": round(cached / prompt, 4) if prompt else None,
        "requests_by_worker": dict(sorted(per_worker.items())),
        "proxy_retries": status["proxy"]["retries_total"],
    }


def has_policy_option() -> bool:
    env = {**os.environ, "COLUMNS": "200"}
    out = subprocess.run([*CMD, "route", "--help"], capture_output=True, text=True, timeout=60, env=env)
    return "--policy" in out.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--policy", default="direct,prefix,cost", help="comma-separated, side by side (prefix: no --policy)"
    )
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rate", type=float, default=50.0, help="requests per second (Poisson arrivals)")
    ap.add_argument("--hot-share", type=float, default=0.5, help="share of requests starting with the hot prefix")
    ap.add_argument("--hot-pages", type=int, default=32, help="pages of the hot prefix (and of a cold head)")
    ap.add_argument("--tail-pages", type=int, default=4, help="unique pages after the head")
    ap.add_argument("--cold-prefixes", type=int, default=64, help="distinct cold prefixes the other requests use")
    ap.add_argument("--warmup", type=int, default=20, help="unmeasured requests first (unique tokens)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--serve-arg", action="append", default=[], help="passed to kvevents serve (repeatable)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    reqs = workload(args)
    load_before = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    offered = has_policy_option()
    rows, skipped = [], []
    for policy in policies:
        if policy not in ("prefix", "direct") and not offered:
            skipped.append(policy)
            print(f"policy {policy}: skipped: this kvevents route has no --policy option", file=sys.stderr)
            continue
        rows.append(run_policy(policy, args, reqs))
    if args.json:
        print(json.dumps({"args": vars(args), "rows": rows, "skipped": skipped}))
        return 0
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average before: {load_before}, after: {load} ({os.cpu_count()} cores)")
    print(
        f"{args.requests} requests at {args.rate:g}/s, {args.workers} workers, {args.hot_share:.0%} hot "
        f"({args.hot_pages} pages + {args.tail_pages} unique), {args.cold_prefixes} cold prefixes, page size {PAGE}"
    )
    print("| policy | TTFT p50 ms | TTFT p99 ms | hot TTFT p99 ms | prefix hit rate | requests by worker | errors |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        by = ", ".join(f"{w} {n}" for w, n in r["requests_by_worker"].items())
        hit = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"
        print(
            f"| {r['policy']} | {r['ttft_p50_ms']:.2f} | {r['ttft_p99_ms']:.2f} | {r['hot_ttft_p99_ms']:.2f} "
            f"| {hit} | {by} | {r['errors']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
