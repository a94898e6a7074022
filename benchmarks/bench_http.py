"""`kvevents route`'s HTTP front against the floor of its stack (issue 30), side by side in one run.

    python3 benchmarks/bench_http.py                      # 256, 2,048 and 8,192 tokens
    python3 benchmarks/bench_http.py --requests 400 --sizes 2048

Two servers, each in its own process on 127.0.0.1 (port 0):
- route: a real `kvevents route` subscribed to 4 sim publishers (in this process) that published
  a 2,000-request multi-tenant workload (page size 16) and then one document per body size, so
  every /score matches whole pages of one worker;
- floor: a bare FastAPI app on uvicorn (its defaults) whose POST /score decodes the same JSON body
  with msgspec and answers a fixed JSON of a like size.
The same client (raw sockets, threads, in this process) sends the same bodies to each, the two
servers taking turns per mode: one keep-alive client, one new connection per request
(Connection: close), and 20 concurrent keep-alive clients (requests/s too); then a burst of
`--burst` new connections at once. Latency is send to full response (new connections: connect
included). Server CPU per request comes from /proc. Bounded counts; everything stops by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from http_client import Conn  # noqa: E402 - the benchmarks' own client, beside this script

PAGE = 16
CLIENTS = 20
TIMEOUT_S = 10.0
FLOOR = Path(__file__).resolve().parent / "bench_http_floor.py"


# ------------------------------------------------------------------ the client


def request_bytes(body: bytes, close: bool) -> bytes:
    head = f"POST /score HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + ("Connection: close\r\n" if close else "") + "\r\n").encode() + body


def _timed(n: int, one: Callable[[], int], codes: Counter[int]) -> list[float]:
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        codes[one()] += 1
        lat.append((time.perf_counter() - t0) * 1e6)
    return lat


def keep_alive(port: int, body: bytes, n: int, codes: Counter[int]) -> list[float]:
    conn = Conn(port, TIMEOUT_S)
    req = request_bytes(body, close=False)
    try:
        _timed(min(20, n), lambda: conn.roundtrip(req), Counter())  # warm-up
        return _timed(n, lambda: conn.roundtrip(req), codes)
    finally:
        conn.close()


def new_connections(port: int, body: bytes, n: int, codes: Counter[int]) -> list[float]:
    req = request_bytes(body, close=True)

    def one() -> int:
        conn = Conn(port, TIMEOUT_S)
        try:
            return conn.roundtrip(req)
        finally:
            conn.close()

    _timed(min(20, n), one, Counter())
    return _timed(n, one, codes)


def concurrent(port: int, body: bytes, n: int, codes: Counter[int]) -> tuple[list[float], float]:
    """CLIENTS keep-alive connections, n requests in all; latencies and wall seconds."""
    req = request_bytes(body, close=False)
    conns = [Conn(port, TIMEOUT_S) for _ in range(CLIENTS)]
    for c in conns:
        c.roundtrip(req)
    go, lock, lat = threading.Barrier(CLIENTS + 1), threading.Lock(), []

    def run(conn: Conn) -> None:
        mine, got = [], Counter()
        go.wait()
        try:
            mine = _timed(n // CLIENTS, lambda: conn.roundtrip(req), got)
        except OSError as exc:
            got[-1] += 1
            print(f"client error: {exc}", file=sys.stderr)
        with lock:
            lat.extend(mine)
            codes.update(got)

    threads = [threading.Thread(target=run, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for c in conns:
        c.close()
    return lat, wall


def burst(port: int, body: bytes, n: int) -> tuple[Counter[str], list[float]]:
    """n new connections at once, one request each: answers by status, latencies."""
    req, go, lock = request_bytes(body, close=True), threading.Barrier(n), threading.Lock()
    codes: Counter[str] = Counter()
    lat: list[float] = []

    def one() -> None:
        go.wait()
        t0 = time.perf_counter()
        try:
            conn = Conn(port, TIMEOUT_S)
            try:
                code = str(conn.roundtrip(req))
            finally:
                conn.close()
        except OSError as exc:
            code = type(exc).__name__
        with lock:
            codes[code] += 1
            lat.append((time.perf_counter() - t0) * 1e6)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes, lat


# ------------------------------------------------------------------ servers and their set-up


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def feed(sizes: list[int]) -> tuple[list, dict[int, list[int]]]:
    """4 publishers on loopback with a published workload, then one document per size on worker
    (size index % 4); returns the publishers (to close) and the documents."""
    from kvevents.sim.worker import Request, SimWorker, Workload
    from kvevents.zeromq.publisher import Publisher

    workers = [SimWorker(f"w{i}", page_size=PAGE, capacity_pages=4000) for i in range(4)]
    pubs = [Publisher(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", bind=True) for _ in workers]
    for w, p in zip(workers, pubs):
        p.publish(w.take_events())
    for i, r in enumerate(Workload(seed=7, page_size=PAGE).take(2000)):
        workers[i % 4].serve(r)
        pubs[i % 4].publish(workers[i % 4].take_events())
    rng, docs = random.Random(30), {}
    for i, size in enumerate(sizes):
        docs[size] = [rng.randrange(32000) for _ in range(size)]
        workers[i % 4].serve(Request(docs[size]))
        pubs[i % 4].publish(workers[i % 4].take_events())
    return list(zip(workers, pubs)), docs


def start(cmd: list[str], want: Callable[[str], int | None], pipe: str) -> tuple[subprocess.Popen, int]:
    """Start a server process and read its port from its first matching line (stdout or stderr)."""
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ
    )
    stream = proc.stdout if pipe == "stdout" else proc.stderr
    assert stream is not None
    for line in stream:
        port = want(line)
        if port is not None:
            threading.Thread(target=stream.read, daemon=True).start()  # drain
            return proc, port
    raise SystemExit(f"{cmd[2:4]} did not start: {proc.stderr.read() if proc.stderr else ''}")


def stop(proc: subprocess.Popen) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def wait_matched(port: int, docs: dict[int, list[int]]) -> None:
    """Until route's /score matches every document's whole pages (its index caught up)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ok = True
        for size, doc in docs.items():
            conn = Conn(port, TIMEOUT_S)
            try:
                conn.sock.sendall(request_bytes(json.dumps({"tokens": doc}).encode(), close=True))
                data = b""
                while chunk := conn.sock.recv(1 << 16):
                    data += chunk
            finally:
                conn.close()
            answer = json.loads(data.split(b"\r\n\r\n", 1)[1])
            ok = ok and bool(answer["workers"]) and answer["workers"][0]["matched_pages"] == size // PAGE
        if ok:
            return
        time.sleep(0.1)
    raise SystemExit("route did not catch up with the published documents within 60 s")


# ------------------------------------------------------------------ the run


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def measure(
    servers: dict[str, tuple[subprocess.Popen, int]], body: bytes, n: int, rounds: int
) -> dict[str, dict[str, dict]]:
    """Every mode against every server, in `rounds` turns each (so both see the same machine); per
    mode and server: p50, p99, requests/s (20 clients: over their wall time), server CPU per request."""
    out: dict[str, dict[str, dict]] = {}
    modes: dict[str, Callable[[int, int, Counter[int]], tuple[list[float], float]]] = {
        "keep-alive": lambda port, k, codes: (keep_alive(port, body, k, codes), 0.0),
        "new connection": lambda port, k, codes: (new_connections(port, body, max(1, k // 2), codes), 0.0),
        f"{CLIENTS} clients": lambda port, k, codes: concurrent(port, body, k, codes),
    }
    for mode, run in modes.items():
        acc = {name: {"lat": [], "wall": 0.0, "cpu": 0.0, "codes": Counter()} for name in servers}
        for r in range(rounds):
            for name in sorted(servers, reverse=bool(r % 2)):  # floor first, then route first, ...
                proc, port = servers[name]
                cpu0, t0 = cpu_s(proc.pid), time.perf_counter()
                lat, wall = run(port, max(CLIENTS, n // rounds), acc[name]["codes"])
                acc[name]["wall"] += wall or time.perf_counter() - t0
                acc[name]["cpu"] += cpu_s(proc.pid) - cpu0
                acc[name]["lat"] += lat
        out[mode] = {
            name: {
                "p50": _pct(a["lat"], 0.5),
                "p99": _pct(a["lat"], 0.99),
                "rps": len(a["lat"]) / a["wall"],
                "cpu_us": a["cpu"] / max(1, len(a["lat"])) * 1e6,
                "codes": dict(a["codes"]),
            }
            for name, a in acc.items()
        }
    return out


def report(size: int, res: dict[str, dict[str, dict]]) -> list[bool]:
    """Print one size's rows; the targets met (p50 <= 1.5x, p99 <= 2x floor; 20 clients >= 0.7x req/s)."""
    met = []
    for mode, by in res.items():
        f, r = by["floor"], by["route"]
        if mode.endswith("clients"):
            ok = r["rps"] >= 0.7 * f["rps"]
            verdict = f"req/s {r['rps'] / f['rps']:.2f}x floor (>= 0.7x: {'met' if ok else 'MISSED'})"
        else:
            ok = r["p50"] <= 1.5 * f["p50"] and r["p99"] <= 2 * f["p99"]
            verdict = f"p50 {r['p50'] / f['p50']:.2f}x, p99 {r['p99'] / f['p99']:.2f}x ({'met' if ok else 'MISSED'})"
        met.append(ok)
        bad = {k: v for k, v in {**f["codes"], **r["codes"]}.items() if k != 200}
        print(
            f"| {size:,} | {mode} | {r['p50']:,.0f} / {r['p99']:,.0f} | {f['p50']:,.0f} / {f['p99']:,.0f} | "
            f"{r['rps']:,.0f} / {f['rps']:,.0f} | {r['cpu_us']:,.0f} / {f['cpu_us']:,.0f} | {verdict}"
            f"{f' non-200: {bad}' if bad else ''} |"
        )
    return met


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000, help="per server, size and mode (new connections: half)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 2048, 8192], help="tokens per body")
    ap.add_argument("--rounds", type=int, default=5, help="turns per cell, the servers alternating")
    ap.add_argument("--burst", type=int, default=100, help="new connections at once at the end (0: none)")
    args = ap.parse_args()
    if args.requests < CLIENTS or min(args.sizes) < PAGE:
        raise SystemExit(f"--requests must be >= {CLIENTS} and every size >= {PAGE}")

    pairs, docs = feed(args.sizes)
    servers: dict[str, tuple[subprocess.Popen, int]] = {}
    try:
        pubs = [f"--publisher={w.name}={p.endpoint},{p.replay_endpoint}" for w, p in pairs]
        route_cmd = [sys.executable, "-m", "kvevents", "route", *pubs, "--http", "127.0.0.1:0", "--seed", "0"]
        servers["route"] = start(route_cmd, _route_port, "stderr")
        floor, floor_port = start([sys.executable, str(FLOOR)], _floor_port, "stdout")
        servers["floor"] = (floor, floor_port)
        wait_matched(servers["route"][1], docs)
        print(
            f"loopback, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start; "
            f"{args.requests} requests per cell ({args.rounds} turns each); floor: uvicorn {_FLOOR_SAYS['http']}"
        )
        print(
            "| tokens | mode | route p50 / p99 us | floor p50 / p99 us | route / floor req/s | server CPU us/req route / floor | target |"
        )
        print("|---|---|---|---|---|---|---|")
        met = []
        for size in args.sizes:
            met += report(
                size, measure(servers, json.dumps({"tokens": docs[size]}).encode(), args.requests, args.rounds)
            )
        if args.burst:
            for name, (_, port) in servers.items():
                codes, lat = burst(port, json.dumps({"tokens": docs[args.sizes[0]]}).encode(), args.burst)
                print(
                    f"burst {name}: {args.burst} new connections at once: {dict(codes)}, "
                    f"p50 {_pct(lat, 0.5) / 1e3:.1f} ms, slowest {max(lat) / 1e3:.1f} ms"
                )
        print(f"targets met: {sum(met)} of {len(met)}")
    finally:
        for proc, _ in servers.values():
            stop(proc)
        for _, p in pairs:
            p.close(0.2)


def _route_port(line: str) -> int | None:
    if line.startswith("kvevents route:") and "http://" in line:
        return int(line.split("http://", 1)[1].split()[0].rsplit(":", 1)[1])
    return None


_FLOOR_SAYS: dict = {}


def _floor_port(line: str) -> int | None:
    if not line.startswith("{"):
        return None
    _FLOOR_SAYS.update(json.loads(line))
    return int(_FLOOR_SAYS["port"])


if __name__ == "__main__":
    main()
