"""`kvevents route`'s HTTP front under load (issue 18 item 6): keep-alive latency and a burst of
new connections, with the clients in another process.

    python3 benchmarks/bench_http.py                 # 2,000 requests / 20 keep-alive connections, 100 new at once
    python3 benchmarks/bench_http.py --requests 4000 --connections 40

Set-up: 4 sim workers publish a 2,000-request multi-tenant workload (sim.Workload, page size 16)
on loopback; a RouterService follows them and serves HTTP on 127.0.0.1 (port 0). The client
process then
1. keep-alive: opens `--connections` persistent connections (one thread each) and sends
   `--requests` POST /score in total, bodies from the same workload (salts and adapters
   included); the latency of each request (send to full response) gives p50/p99/max;
2. burst: `--burst` threads wait on a barrier, then each opens a new connection and sends one
   POST /score (Connection: close); it counts answers by status and connection errors.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


# ------------------------------------------------------------------ client process


def client(host: str, port: int, requests: int, connections: int, burst: int, bodies_path: str) -> None:
    bodies = json.loads(Path(bodies_path).read_text())
    lat: list[float] = []
    statuses: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    lock = threading.Lock()
    per = requests // connections

    def keep_alive(k: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        mine, codes = [], Counter()
        try:
            for i in range(per):
                body = json.dumps(bodies[(k * per + i) % len(bodies)]).encode()
                t0 = time.perf_counter()
                conn.request("POST", "/score", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                mine.append((time.perf_counter() - t0) * 1000)
                codes[resp.status] += 1
        except OSError as exc:
            with lock:
                errors[type(exc).__name__] += 1
        finally:
            conn.close()
        with lock:
            lat.extend(mine)
            statuses.update(codes)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=keep_alive, args=(k,)) for k in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    go = threading.Barrier(burst)
    burst_codes: Counter[str] = Counter()
    burst_lat: list[float] = []
    raw = json.dumps(bodies[0]).encode()
    req = (
        b"POST /score HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nConnection: close\r\n"
        b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw
    )

    def new_connection() -> None:
        go.wait()
        t1 = time.perf_counter()
        try:
            with socket.create_connection((host, port), timeout=30) as s:
                s.sendall(req)
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
            code = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "no answer"
        except OSError as exc:
            code = type(exc).__name__
        with lock:
            burst_codes[code] += 1
            burst_lat.append((time.perf_counter() - t1) * 1000)

    threads = [threading.Thread(target=new_connection) for _ in range(burst)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(
        json.dumps(
            {
                "n": len(lat),
                "wall_s": wall,
                "p50_ms": _pct(lat, 0.5),
                "p99_ms": _pct(lat, 0.99),
                "max_ms": max(lat),
                "statuses": dict(statuses),
                "errors": dict(errors),
                "burst": dict(burst_codes),
                "burst_p50_ms": _pct(burst_lat, 0.5),
                "burst_max_ms": max(burst_lat),
            }
        )
    )


# ------------------------------------------------------------------ server side


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--connections", type=int, default=20)
    ap.add_argument("--burst", type=int, default=100)
    ap.add_argument("--client", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        h, p, r, c, b, path = args.client
        return client(h, int(p), int(r), int(c), int(b), path)

    import tempfile

    from kvevents.consumers.service.core import RouterService
    from kvevents.sim.worker import SimWorker, Workload
    from kvevents.zeromq.publisher import Publisher
    from kvevents.zeromq.subscriber import Source

    workers = [SimWorker(f"w{i}", page_size=16, capacity_pages=4000) for i in range(4)]
    pubs = [Publisher(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", bind=True) for _ in workers]
    service = RouterService(
        [Source(p.endpoint, p.replay_endpoint, w.name) for p, w in zip(pubs, workers)], page_size=16
    )
    service.start()
    try:
        reqs = Workload(seed=7, page_size=16).take(2000)
        for w, p in zip(workers, pubs):
            p.publish(w.take_events())
        for i, r in enumerate(reqs):
            w, p = workers[i % 4], pubs[i % 4]
            w.serve(r)
            p.publish(w.take_events())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all((service.applied_seq(w.name) or -1) >= p.stats()["next_seq"] - 1 for w, p in zip(workers, pubs)):
                break
            time.sleep(0.05)
        host, port = service.serve_http("127.0.0.1", 0)
        bodies = [{"tokens": r.tokens, "cache_salt": r.namespace.cache_salt, "lora_name": r.lora_name} for r in reqs]
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(bodies, f)
        import resource

        ru0, rc0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--client",
                host,
                str(port),
                str(args.requests),
                str(args.connections),
                str(args.burst),
                f.name,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        ru1, rc1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        server_cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
        client_cpu = (rc1.ru_utime + rc1.ru_stime) - (rc0.ru_utime + rc0.ru_stime)
        Path(f.name).unlink()
        if out.returncode:
            sys.exit(f"client failed: {out.stderr.strip()}")
        res = json.loads(out.stdout.strip().splitlines()[-1])
        copies = service.stats()["copies"]
        mean_tokens = sum(len(b["tokens"]) for b in bodies) / len(bodies)
        print(f"index: {copies:,} block copies over 4 workers; request bodies {mean_tokens:.0f} tokens on average")
        print(
            f"keep-alive: {res['n']:,} requests over {args.connections} connections in {res['wall_s']:.2f} s "
            f"({res['n'] / res['wall_s']:,.0f}/s): p50 {res['p50_ms']:.2f} ms, p99 {res['p99_ms']:.2f} ms, "
            f"max {res['max_ms']:.2f} ms; statuses {res['statuses']}, errors {res['errors'] or 'none'}"
        )
        n_all = res["n"] + args.burst
        print(
            f"CPU per request: server {server_cpu / n_all * 1e3:.2f} ms, client process {client_cpu / n_all * 1e3:.2f} ms "
            f"(both phases; 2 cores shared)"
        )
        print(
            f"burst: {args.burst} new connections at once: {res['burst']} "
            f"(p50 {res['burst_p50_ms']:.1f} ms, slowest {res['burst_max_ms']:.1f} ms)"
        )
    finally:
        service.stop()
        for p in pubs:
            p.close(0.2)


if __name__ == "__main__":
    main()
